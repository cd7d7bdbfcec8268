package httpapi_test

// The client is tested against the real handler on a real listener, over
// the real SQLite store, through the server tests' harness (harness_test.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

// clientFor returns a client of the harness's server at url (the server's
// own when empty), with fast reconnects so tests do not wait.
func clientFor(tb testing.TB, h *harness, url, tok string, opts ...httpapi.ClientOption) *httpapi.Client {
	tb.Helper()
	if url == "" {
		url = h.srv.URL
	}
	if tok == "" {
		tok = h.controlToken
	}
	opts = append([]httpapi.ClientOption{httpapi.WithReconnectBackoff(time.Millisecond, 20*time.Millisecond)}, opts...)
	c, err := httpapi.NewClient(url, tok, opts...)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	return c
}

// testRunRequest is a valid request that leaves every optional field zero.
func testRunRequest() belay.RunRequest {
	return belay.RunRequest{
		Instruction: "Fix the failing test in calc.py",
		Files: []belay.File{
			{Path: "calc.py", Content: "def add(a, b):\n    return a - b  # " + fileCanary + "\n"},
			{Path: "tests/test_calc.py", Content: "from calc import add\n"},
		},
		AllowedPaths: []string{"calc.py"},
		Checks:       [][]string{{"python3", "-m", "pytest", "-q"}},
	}
}

// streamCtx bounds a stream by the test's deadline, so a stream that never
// ends fails the test instead of hanging it.
func streamCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestClientRoutes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := clientFor(t, h, "", "")
	ctx := context.Background()

	req := testRunRequest()
	created, err := c.CreateRun(ctx, req, "key-1")
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	if created.Status != belay.StatusQueued || created.Links != wire.LinksFor(created.RunID) {
		t.Fatalf("CreateRun answered %+v", created)
	}
	again, err := c.CreateRun(ctx, req, "key-1")
	if err != nil || again.RunID != created.RunID {
		t.Fatalf("CreateRun with the same key and body: %+v, %v; want run %s", again, err, created.RunID)
	}
	id := created.RunID

	view, err := c.GetRun(ctx, id)
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	// Zero optional fields were left out, so the operator's defaults apply.
	lim := belay.DefaultLimits(testModel)
	if view.Model != testModel || view.Request.MaxSteps != lim.DefaultMaxSteps ||
		view.Request.WallTimeSeconds != lim.DefaultWallTimeSeconds || view.Usage.MaxRequests != lim.DefaultMaxSteps+2 {
		t.Errorf("GetRun = model %q, maxSteps %d, wall %d, maxRequests %d; want the defaults",
			view.Model, view.Request.MaxSteps, view.Request.WallTimeSeconds, view.Usage.MaxRequests)
	}
	if strings.Join(view.Request.Files, ",") != "calc.py,tests/test_calc.py" {
		t.Errorf("GetRun files = %v", view.Request.Files)
	}

	h.clock.Advance(time.Second) // so the second run is the newest
	other := testRunRequest()
	other.MaxSteps, other.WallTimeSeconds = 3, 30
	other.Approval = belay.ApprovalConfig{Policy: belay.PolicyAsk, TimeoutSeconds: 60}
	second, err := c.CreateRun(ctx, other, "")
	if err != nil {
		t.Fatalf("CreateRun with options: %v", err)
	}
	v2, err := c.GetRun(ctx, second.RunID)
	if err != nil || v2.Request.MaxSteps != 3 || v2.Request.WallTimeSeconds != 30 ||
		v2.Request.Approval.Policy != belay.PolicyAsk || v2.Request.Approval.TimeoutSeconds != 60 {
		t.Fatalf("GetRun of the run with options: %+v, %v", v2.Request, err)
	}

	list, err := c.ListRuns(ctx, httpapi.ListRunsOptions{Limit: 1})
	if err != nil || len(list.Runs) != 1 || list.Runs[0].RunID != second.RunID || list.NextCursor == "" {
		t.Fatalf("ListRuns limit 1 = %+v, %v; want the newest run and a cursor", list, err)
	}
	next, err := c.ListRuns(ctx, httpapi.ListRunsOptions{Cursor: list.NextCursor})
	if err != nil || len(next.Runs) != 1 || next.Runs[0].RunID != id {
		t.Fatalf("ListRuns second page = %+v, %v", next, err)
	}
	none, err := c.ListRuns(ctx, httpapi.ListRunsOptions{Status: belay.StatusCompleted})
	if err != nil || len(none.Runs) != 0 {
		t.Fatalf("ListRuns completed = %+v, %v; want none", none, err)
	}

	page, err := c.Events(ctx, id, 0, 0)
	if err != nil || len(page.Events) != 1 || page.Events[0].Type != belay.EventRunQueued ||
		page.Events[0].Seq != 1 || page.LastSeq != 1 || page.Terminal || page.Missed {
		t.Fatalf("Events = %+v, %v; want run.queued only", page, err)
	}

	cancelled, err := c.Cancel(ctx, id)
	if err != nil || !cancelled.CancelRequested {
		t.Fatalf("Cancel = %+v, %v", cancelled, err)
	}
	if _, err := c.Cancel(ctx, id); err != nil {
		t.Fatalf("a second Cancel: %v; want it to succeed (cancel is idempotent)", err)
	}
	if _, cancels := h.orch.calls(); len(cancels) != 2 || cancels[0] != id {
		t.Errorf("orchestrator cancels = %v; want %s twice", cancels, id)
	}

	if err := h.artifacts.PutArtifact(ctx, id, "patch.diff", []byte("--- a/calc.py\n+++ b/calc.py\n")); err != nil {
		t.Fatal(err)
	}
	arts, err := c.ListArtifacts(ctx, id)
	if err != nil || len(arts) != 1 || arts[0].Name != "patch.diff" || arts[0].Size != 28 {
		t.Fatalf("ListArtifacts = %+v, %v", arts, err)
	}
	content, err := c.GetArtifact(ctx, id, "patch.diff")
	if err != nil || string(content) != "--- a/calc.py\n+++ b/calc.py\n" {
		t.Fatalf("GetArtifact = %q, %v", content, err)
	}
	if _, err := c.GetArtifact(ctx, id, "result.json"); !belay.IsCode(err, belay.CodeNotFound) {
		t.Fatalf("GetArtifact of a missing artifact: %v; want not_found", err)
	}
}

func TestClientApprovals(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := clientFor(t, h, "", "")
	ctx := context.Background()
	id, set := h.startRun(t, `"approval":{"policy":"ask"}`, 5)

	a := doURL(t, "POST", h.srv.URL+"/internal/v1/runs/"+id+"/approvals", set.Approvals,
		[]byte(`{"tool":"shell","arguments":{"command":"ls"}}`))
	if a.status != http.StatusCreated {
		t.Fatalf("request approval: %d %s", a.status, a.body)
	}
	var asked belay.Approval
	a.decode(t, &asked)

	list, err := c.ListApprovals(ctx, id)
	if err != nil || len(list) != 1 || list[0].ID != asked.ID || list[0].Status != belay.ApprovalPending {
		t.Fatalf("ListApprovals = %+v, %v; want the pending approval", list, err)
	}
	decided, err := c.Decide(ctx, id, asked.ID, belay.DecisionAllowOnce, "looks safe")
	if err != nil || decided.Status != belay.ApprovalDecided || decided.Decision != belay.DecisionAllowOnce ||
		decided.Reason != "looks safe" || decided.DecidedBy != "user" {
		t.Fatalf("Decide = %+v, %v", decided, err)
	}
	_, err = c.Decide(ctx, id, asked.ID, belay.DecisionDeny, "")
	if !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("deciding again: %v; want conflict", err)
	}
}

func TestClientErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{quietLogs: true})
	ctx := context.Background()
	good := clientFor(t, h, "", "")
	wrongToken := "ctl-wrong-canary-" + randomHex(t, 16)
	bad := clientFor(t, h, "", wrongToken)
	first, err := good.CreateRun(ctx, testRunRequest(), "key-conflict")
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		call    func() error
		status  int
		code    belay.Code
		message string
	}{
		{"unknown run", func() error { _, err := good.GetRun(ctx, "run_nosuchrun"); return err },
			404, belay.CodeNotFound, "run not found"},
		{"wrong token", func() error { _, err := bad.ListRuns(ctx, httpapi.ListRunsOptions{}); return err },
			401, belay.CodeUnauthorized, "missing or invalid control-plane token"},
		{"invalid request", func() error {
			r := testRunRequest()
			r.Files[0].Path = "../calc.py"
			_, err := good.CreateRun(ctx, r, "")
			return err
		}, 400, belay.CodeInvalid, "files[0].path"},
		{"idempotency key reused with another body", func() error {
			r := testRunRequest()
			r.Instruction = "Something else"
			_, err := good.CreateRun(ctx, r, "key-conflict")
			return err
		}, 409, belay.CodeConflict, ""},
		{"bad status filter", func() error {
			_, err := good.ListRuns(ctx, httpapi.ListRunsOptions{Status: "sleeping"})
			return err
		}, 400, belay.CodeInvalid, "status"},
		{"unknown approval", func() error {
			_, err := good.Decide(ctx, first.RunID, "apr_nosuch", belay.DecisionDeny, "")
			return err
		}, 404, belay.CodeNotFound, "approval"},
		{"unknown artifact name", func() error { _, err := good.GetArtifact(ctx, first.RunID, "secrets.txt"); return err },
			404, belay.CodeNotFound, "artifact not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var ae *httpapi.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v (%T); want *httpapi.APIError", err, err)
			}
			if ae.Status != tt.status || ae.Code != tt.code || !strings.Contains(ae.Message, tt.message) {
				t.Errorf("APIError = %d %s %q; want %d %s containing %q", ae.Status, ae.Code, ae.Message, tt.status, tt.code, tt.message)
			}
			if !strings.HasPrefix(ae.RequestID, "req_") || !strings.Contains(err.Error(), ae.RequestID) {
				t.Errorf("request id %q missing or not in %q", ae.RequestID, err.Error())
			}
			var be *belay.Error
			if !errors.As(err, &be) || be.Code != tt.code || belay.ErrorCode(err) != tt.code {
				t.Errorf("the error does not unwrap to a *belay.Error with code %s: %v", tt.code, err)
			}
			if strings.Contains(err.Error(), wrongToken) || strings.Contains(err.Error(), h.controlToken) {
				t.Errorf("the error repeats a token: %v", err)
			}
		})
	}
}

func TestClientErrorWithoutBelayBody(t *testing.T) {
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(wire.RequestIDHeader, "req_front")
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "<html>upstream FRONT-PAGE-CANARY</html>")
	}))
	t.Cleanup(front.Close)
	c, err := httpapi.NewClient(front.URL, "ctl-"+randomHex(t, 16))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetRun(context.Background(), "run_x")
	var ae *httpapi.APIError
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != belay.CodeUpstream || ae.RequestID != "req_front" {
		t.Fatalf("error = %#v; want a 502 upstream_error with the header's request id", err)
	}
	if strings.Contains(err.Error(), "CANARY") {
		t.Errorf("the error quotes a foreign body: %v", err)
	}
}

func TestNewClient(t *testing.T) {
	tok := "ctl-canary-" + strings.Repeat("z", 16)
	tests := []struct {
		endpoint, token string
		wantErr         string
	}{
		{"http://127.0.0.1:8700", tok, ""},
		{"http://localhost:8700/", tok, ""},
		{"https://abc.execute-api.eu-west-1.amazonaws.com/prod", tok, ""},
		{"http://[::1]:8700", tok, ""},
		{"http://belay.example.com", tok, "must use https"},
		{"ftp://127.0.0.1", tok, "must use https"},
		{"https://user:pw@belay.example.com", tok, "credentials"},
		{"https://belay.example.com?x=1", tok, "query"},
		{"https://belay.example.com#frag", tok, "fragment"},
		{"127.0.0.1:8700", tok, "not a valid URL"},
		{"//127.0.0.1:8700", tok, "absolute URL"},
		{"", tok, "not a valid URL"},
		{"http://127.0.0.1:8700", "", "no control-plane token"},
		{"http://127.0.0.1:8700", "  \n", "no control-plane token"},
		{"http://127.0.0.1:8700", tok + "\nX-Injected: 1", "control character"},
	}
	for _, tt := range tests {
		_, err := httpapi.NewClient(tt.endpoint, tt.token)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("NewClient(%q): %v", tt.endpoint, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("NewClient(%q, %q) = %v; want an error containing %q", tt.endpoint, tt.token, err, tt.wantErr)
		case err != nil && strings.Contains(err.Error(), "canary"):
			t.Errorf("NewClient(%q): the error repeats the token: %v", tt.endpoint, err)
		}
	}
}

func TestClientUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tok := "ctl-canary-" + randomHex(t, 16)
	c, err := httpapi.NewClient("http://"+addr, tok)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetRun(context.Background(), "run_x")
	if err == nil || !strings.Contains(err.Error(), "could not reach belay at http://"+addr) {
		t.Fatalf("error = %v; want it to say belay is unreachable at %s", err, addr)
	}
	if strings.Contains(err.Error(), tok) {
		t.Errorf("the error repeats the token: %v", err)
	}
}

// streamProxy stands between the client and the server and breaks event
// streams: connection i forwards cuts[i] complete events plus a few bytes
// of the next one, then aborts the connection mid-event. Connections past
// len(cuts) pass everything. It records each request's Last-Event-ID.
type streamProxy struct {
	target string
	cuts   []int
	// stall, when set, makes the first connection send its headers and
	// then nothing at all, as a dead peer behind a load balancer would.
	stall bool

	mu           sync.Mutex
	lastEventIDs []string
	conns        int
}

func (p *streamProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	n := p.conns
	p.conns++
	if r.URL.Query().Get("stream") == "1" {
		p.lastEventIDs = append(p.lastEventIDs, r.Header.Get("Last-Event-ID"))
	}
	cut := -1
	if n < len(p.cuts) {
		cut = p.cuts[n]
	}
	p.mu.Unlock()

	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), r.Body)
	if err != nil {
		panic(err)
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if p.stall && n == 0 {
		<-r.Context().Done()
		return
	}
	events, tail := 0, -1
	var prev byte
	buf := make([]byte, 4096)
	for {
		k, rerr := resp.Body.Read(buf)
		chunk := buf[:k]
		for i, b := range chunk {
			if tail >= 0 {
				tail++
				if tail == 5 {
					_, _ = w.Write(chunk[:i+1])
					_ = rc.Flush()
					panic(http.ErrAbortHandler) // cut the connection mid-event
				}
				continue
			}
			if b == '\n' && prev == '\n' {
				events++
				if cut >= 0 && events == cut {
					tail = 0
				}
			}
			prev = b
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
		_ = rc.Flush()
		if rerr != nil {
			return
		}
	}
}

func (p *streamProxy) seenLastEventIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lastEventIDs...)
}

func TestStreamEventsResumesAfterDroppedConnections(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5) // run.queued 1, run.started 2
	h.appendEvents(t, id, 10)     // 3..12

	proxy := &streamProxy{target: h.srv.URL, cuts: []int{4, 3}}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	c := clientFor(t, h, front.URL, "")

	reached := make(chan struct{})
	var got []belay.Event
	done := make(chan error, 1)
	go func() {
		done <- c.StreamEvents(streamCtx(t), id, 0, func(e belay.Event) error {
			got = append(got, e)
			if e.Seq == 10 {
				close(reached)
			}
			return nil
		})
	}()
	// More of the log is written while the client is following it live.
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("StreamEvents returned early: %v", err)
	}
	h.appendEvents(t, id, 10) // 13..22
	h.finishRun(t, id)        // run.completed 23
	if err := <-done; err != nil {
		t.Fatalf("StreamEvents: %v", err)
	}

	for i, e := range got {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d; every event must arrive exactly once, in order (got %v)", i, e.Seq, seqs(got))
		}
	}
	if len(got) != 23 || got[22].Type != belay.EventRunCompleted {
		t.Fatalf("got %d events ending in %q; want 23 ending in run.completed", len(got), got[len(got)-1].Type)
	}
	if ids := proxy.seenLastEventIDs(); strings.Join(ids, ",") != "0,4,7" {
		t.Errorf("Last-Event-ID of the stream requests = %v; want 0,4,7 (the last seq delivered before each drop)", ids)
	}
}

func TestStreamEventsReconnectsAfterSilence(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.finishRun(t, id) // 1..3
	proxy := &streamProxy{target: h.srv.URL, stall: true}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	c := clientFor(t, h, front.URL, "", httpapi.WithStreamIdleTimeout(50*time.Millisecond))

	var got []int64
	err := c.StreamEvents(streamCtx(t), id, 0, func(e belay.Event) error {
		got = append(got, e.Seq)
		return nil
	})
	if err != nil || len(got) != 3 || got[2] != 3 {
		t.Fatalf("StreamEvents after a silent connection = %v, %v; want seq 1..3", got, err)
	}
	if n := len(proxy.seenLastEventIDs()); n < 2 {
		t.Errorf("the stream connected %d times; want a reconnect after the silent connection", n)
	}
}

func TestStreamEventsReportsMissedEvents(t *testing.T) {
	h := newHarness(t, harnessOptions{bufferSize: 5, poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 20)
	h.finishRun(t, id) // 1..23; the buffer keeps 19..23
	c := clientFor(t, h, "", "")

	page, err := c.Events(context.Background(), id, 0, 0)
	if err != nil || !page.Missed || page.OldestSeq != 19 || len(page.Events) != 5 || !page.Terminal || page.LastSeq != 23 {
		t.Fatalf("Events = %+v, %v; want missed with oldestSeq 19, then 19..23", page, err)
	}

	var got []belay.Event
	err = c.StreamEvents(streamCtx(t), id, 2, func(e belay.Event) error {
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatalf("StreamEvents: %v", err)
	}
	if len(got) != 6 || got[0].Type != wire.EventsMissedType || got[0].Seq != 0 {
		t.Fatalf("got %v; want events.missed first, then 19..23", seqs(got))
	}
	var m wire.EventsMissed
	if err := json.Unmarshal(got[0].Data, &m); err != nil || m.OldestSeq != 19 {
		t.Fatalf("events.missed data = %s; want oldestSeq 19", got[0].Data)
	}
	if got[1].Seq != 19 || got[5].Type != belay.EventRunCompleted {
		t.Fatalf("got %v; want 19..23 after the marker", seqs(got))
	}
}

func TestStreamEventsEnds(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond, quietLogs: true})
	id, _ := h.startRun(t, "", 5)
	h.finishRun(t, id) // 1..3
	var requests atomic.Int64
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		h.api.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)
	c := clientFor(t, h, counted.URL, "")
	stop := errors.New("stop here")

	tests := []struct {
		name     string
		client   *httpapi.Client
		run      string
		after    int64
		fn       func(belay.Event) error
		wantErr  error
		wantCode belay.Code
		maxCalls int64
	}{
		{name: "after the terminal event", client: c, run: id, after: 3, maxCalls: 2},
		{name: "unknown run", client: c, run: "run_nosuch", wantCode: belay.CodeNotFound, maxCalls: 1},
		{name: "bad token", client: clientFor(t, h, counted.URL, "ctl-bad-"+randomHex(t, 16)), run: id,
			wantCode: belay.CodeUnauthorized, maxCalls: 1},
		{name: "callback error", client: c, run: id, fn: func(belay.Event) error { return stop }, wantErr: stop, maxCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requests.Store(0)
			fn := tt.fn
			if fn == nil {
				fn = func(belay.Event) error { return nil }
			}
			err := tt.client.StreamEvents(streamCtx(t), tt.run, tt.after, fn)
			switch {
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Errorf("StreamEvents = %v; want %v", err, tt.wantErr)
			case tt.wantCode != "" && !belay.IsCode(err, tt.wantCode):
				t.Errorf("StreamEvents = %v; want code %s", err, tt.wantCode)
			case tt.wantErr == nil && tt.wantCode == "" && err != nil:
				t.Errorf("StreamEvents = %v; want nil", err)
			}
			if n := requests.Load(); n > tt.maxCalls {
				t.Errorf("%d requests; want at most %d (no retry loop)", n, tt.maxCalls)
			}
		})
	}

	t.Run("context ends", func(t *testing.T) {
		running, _ := h.startRun(t, "", 5)
		ctx, cancel := context.WithCancel(context.Background())
		err := c.StreamEvents(ctx, running, 0, func(e belay.Event) error {
			if e.Seq == 2 {
				cancel()
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("StreamEvents = %v; want context.Canceled", err)
		}
	})
}

func TestStreamEventsRetriesForeignErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.finishRun(t, id)
	var calls atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		h.api.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	c := clientFor(t, h, front.URL, "")
	var got bytes.Buffer
	err := c.StreamEvents(streamCtx(t), id, 0, func(e belay.Event) error {
		got.WriteString(e.Type + " ")
		return nil
	})
	if err != nil || got.String() != "run.queued run.started run.completed " {
		t.Fatalf("StreamEvents after two 502s = %q, %v", got.String(), err)
	}
}

func seqs(events []belay.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Seq
	}
	return out
}
