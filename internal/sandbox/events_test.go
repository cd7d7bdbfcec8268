package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/wire"
)

// batchLog records the event batches that reach the control plane.
type batchLog struct {
	mu      sync.Mutex
	batches []wire.EventBatch
	bytes   []int
}

func (l *batchLog) add(b wire.EventBatch, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, b)
	l.bytes = append(l.bytes, n)
}

func (l *batchLog) all() ([]wire.EventBatch, []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wire.EventBatch(nil), l.batches...), append([]int(nil), l.bytes...)
}

// recordBatches makes the control plane record each event batch it gets,
// and answer the first `fail` of them with a 503 after storing them: as if
// the answer was lost on the way back.
func recordBatches(cp *controlPlane, fail int) *batchLog {
	l := &batchLog{}
	var mu sync.Mutex
	cp.setFront(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if !strings.HasSuffix(r.URL.Path, "/events") {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var b wire.EventBatch
		_ = json.Unmarshal(body, &b)
		l.add(b, len(body))
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		lose := fail > 0
		fail--
		mu.Unlock()
		if lose {
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			http.Error(w, `{"error":{"code":"unavailable","message":"lost answer"}}`, http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
	return l
}

func newEventClient(tb testing.TB, cp *controlPlane, runID, tok string, logs io.Writer) *sandbox.EventClient {
	tb.Helper()
	c, err := sandbox.NewEventClient(sandbox.EventsConfig{
		BaseURL: "http://belay", HTTPClient: cp.apiClient(tb), RunID: runID, Token: tok,
		FlushInterval: 20 * time.Millisecond, Backoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestEventClientDeliversEveryEventInOrderInBoundedBatches(t *testing.T) {
	cp := newControlPlane(t, t.TempDir(), scriptedModelScript())
	runID, set := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	batches := recordBatches(cp, 0)
	logs := &syncBuffer{}
	c := newEventClient(t, cp, runID, set.Events, logs)

	const n = 250
	big := strings.Repeat("y", 4000) // 250 events of 4 KB: over one batch's byte cap
	for i := range n {
		c.Emit(belay.EventToolCall, map[string]any{"i": i, "pad": big})
		if i == 10 {
			// Not a sandbox event type: dropped, so it cannot spoil a batch.
			c.Emit(belay.EventRunCompleted, map[string]any{"forged": true})
		}
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}

	var got []int
	for _, e := range cp.events(t, runID) {
		if e.Type == belay.EventRunCompleted {
			t.Error("a run.completed event was sent")
		}
		if e.Type != belay.EventToolCall {
			continue
		}
		var d struct{ I int }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d.I)
	}
	if len(got) != n {
		t.Fatalf("stored %d tool.call events, want %d", len(got), n)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("event %d carries i=%d: out of order", i, v)
		}
	}
	bs, sizes := batches.all()
	if len(bs) < 3 {
		t.Errorf("%d batches for 1 MB of events; the byte cap should split them further", len(bs))
	}
	ids := map[string]bool{}
	for i, b := range bs {
		if len(b.Events) > wire.MaxBatchEvents || sizes[i] > wire.MaxBatchBytes {
			t.Errorf("batch %d: %d events, %d bytes; caps are %d and %d", i, len(b.Events), sizes[i], wire.MaxBatchEvents, wire.MaxBatchBytes)
		}
		if ids[b.BatchID] {
			t.Errorf("batch id %q used twice without a failure", b.BatchID)
		}
		ids[b.BatchID] = true
	}
	if strings.Contains(logs.String(), set.Events) {
		t.Error("the events token appears in the client's log")
	}
}

func TestEventClientFlushSendsWhatIsQueued(t *testing.T) {
	cp := newControlPlane(t, t.TempDir(), scriptedModelScript())
	runID, set := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	// No timer flush within the test: only Flush sends these small events.
	c, err := sandbox.NewEventClient(sandbox.EventsConfig{
		BaseURL: "http://belay", HTTPClient: cp.apiClient(t), RunID: runID, Token: set.Events,
		FlushInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	before := len(cp.events(t, runID))
	for i := range 3 {
		c.Emit(belay.EventToolCall, map[string]int{"i": i})
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got := len(cp.events(t, runID)) - before; got != 3 {
		t.Errorf("%d events stored when Flush returned, want 3", got)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Errorf("Flush with nothing queued: %v", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Errorf("Flush after Close: %v", err)
	}
}

func TestEventClientRetriesAFailedBatchWithTheSameID(t *testing.T) {
	cp := newControlPlane(t, t.TempDir(), scriptedModelScript())
	runID, set := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	batches := recordBatches(cp, 2) // the first two answers are lost
	c := newEventClient(t, cp, runID, set.Events, io.Discard)
	c.Emit(belay.EventSandboxReady, map[string]string{"baseCommit": "abc"})
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	bs, _ := batches.all()
	if len(bs) != 3 {
		t.Fatalf("%d attempts, want 3 (two lost answers, then success)", len(bs))
	}
	for _, b := range bs[1:] {
		if b.BatchID != bs[0].BatchID {
			t.Errorf("retry used batch id %q, first attempt %q", b.BatchID, bs[0].BatchID)
		}
	}
	ready := 0
	for _, e := range cp.events(t, runID) {
		if e.Type == belay.EventSandboxReady {
			ready++
		}
	}
	if ready != 1 {
		t.Errorf("sandbox.ready stored %d times, want once", ready)
	}
}

func TestEventClientStopsWhenTheRunIsOver(t *testing.T) {
	tests := []struct {
		name string
		end  func(tb testing.TB, cp *controlPlane, runID string) // ends the run
		tok  func(set string) string
	}{
		{"run cancelled (409)", func(tb testing.TB, cp *controlPlane, runID string) {
			if _, err := cp.store.Transition(context.Background(), runID, belay.Transition{To: belay.StatusCancelled, At: time.Now(),
				Events: []belay.EventInput{{Time: time.Now(), Type: belay.EventRunCancelled}}}); err != nil {
				tb.Fatal(err)
			}
		}, func(s string) string { return s }},
		{"token refused (401)", func(testing.TB, *controlPlane, string) {}, func(s string) string { return s + "x" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := newControlPlane(t, t.TempDir(), scriptedModelScript())
			runID, set := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
			tt.end(t, cp, runID)
			logs := &syncBuffer{}
			c := newEventClient(t, cp, runID, tt.tok(set.Events), logs)
			c.Emit(belay.EventToolCall, map[string]string{"name": "read_file"})
			select {
			case <-c.Stopped():
			case <-time.After(30 * time.Second):
				t.Fatalf("the client did not stop; its log:\n%s", logs.String())
			}
			c.Emit(belay.EventToolCall, map[string]string{"name": "after the end"})
			if err := c.Close(context.Background()); err != nil {
				t.Errorf("Close after the run ended: %v", err)
			}
			if strings.Contains(logs.String(), set.Events) {
				t.Error("the events token appears in the client's log")
			}
		})
	}
}

// TestEventClientStopsSendingAtTheCap: when the control plane refuses a
// batch because the run's sandbox events are capped (413), the client
// stops sending for good and says so once, but the run is not over.
func TestEventClientStopsSendingAtTheCap(t *testing.T) {
	cp := newControlPlaneWith(t, t.TempDir(), scriptedModelScript(), func(c *httpapi.Config) {
		c.SandboxEventLimits = belay.SandboxEventLimits{MaxEvents: 3, MaxBytes: 1 << 20}
	})
	runID, set := cp.startRun(t, runRequest(belay.PolicyDenyAll, 0))
	logs := &syncBuffer{}
	capped := make(chan string, 4)
	c, err := sandbox.NewEventClient(sandbox.EventsConfig{
		BaseURL: "http://belay", HTTPClient: cp.apiClient(t), RunID: runID, Token: set.Events,
		FlushInterval: 20 * time.Millisecond, Backoff: 10 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(logs, nil)),
		OnCapped: func(msg string) { capped <- msg },
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c.Emit(belay.EventToolCall, map[string]int{"i": i})
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.Emit(belay.EventToolCall, map[string]int{"i": 10 + i})
	}
	select {
	case msg := <-capped:
		if !strings.Contains(msg, "at most 3 events") {
			t.Errorf("OnCapped got %q; want the control plane's message naming the cap", msg)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the client was never told of the cap; its log:\n%s", logs.String())
	}
	select {
	case <-c.Stopped():
		t.Fatal("Stopped closed at the cap: the run is not over")
	default:
	}
	c.Emit(belay.EventToolCall, map[string]string{"after": "the cap"})
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close after the cap: %v", err)
	}
	if len(capped) != 0 {
		t.Error("OnCapped was called more than once")
	}
	n := 0
	for _, e := range cp.events(t, runID) {
		if e.Source == belay.SourceSandbox {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d sandbox events stored; want the 2 under the cap (the refused batch whole)", n)
	}
	if !strings.Contains(logs.String(), "cap on sandbox events is reached") {
		t.Errorf("the client's log does not say why it stopped:\n%s", logs.String())
	}
}
