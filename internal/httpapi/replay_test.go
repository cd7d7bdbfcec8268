package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
)

// replayingStream is an event stream that, on each reconnect, starts again
// before the client's Last-Event-ID: a server that resends what it last
// sent (or a proxy that replays), which a real belay does not do but the
// client must survive. It records the Last-Event-ID of each connection.
// It speaks SSE by hand on purpose: the real server never misbehaves so.
type replayingStream struct {
	mu      sync.Mutex
	ids     []string
	plans   [][2]int64 // per connection: first and last seq sent
	last    int64      // the terminal event's seq
	started time.Time
}

func (s *replayingStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.ids)
	s.ids = append(s.ids, r.Header.Get("Last-Event-ID"))
	s.mu.Unlock()
	if n >= len(s.plans) {
		http.Error(w, "too many connections", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for seq := s.plans[n][0]; seq <= s.plans[n][1]; seq++ {
		typ := belay.EventToolCall
		if seq == s.last {
			typ = belay.EventRunCompleted
		}
		ev, _ := json.Marshal(belay.Event{Seq: seq, Time: s.started.Add(time.Duration(seq) * time.Second), Type: typ,
			Source: belay.SourceControl, Data: json.RawMessage(`{"n":` + strconv.FormatInt(seq, 10) + `}`)})
		fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", seq, typ, ev)
	}
	// The connection ends without the terminal event (but for the last
	// plan): the client reconnects with Last-Event-ID.
}

// TestStreamEventsSkipsWhatItAlreadyDelivered: after a reconnect the server
// resends the last event the client had (and, the second time, everything
// from the start); each event still reaches the caller exactly once.
func TestStreamEventsSkipsWhatItAlreadyDelivered(t *testing.T) {
	s := &replayingStream{
		plans:   [][2]int64{{1, 3}, {3, 5}, {1, 7}},
		last:    7,
		started: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC),
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := httpapi.NewClient(srv.URL, "ctl-test-token-0123456789", httpapi.WithReconnectBackoff(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	if err := c.StreamEvents(streamCtx(t), "run_replay", 0, func(e belay.Event) error {
		got = append(got, e.Seq)
		return nil
	}); err != nil {
		t.Fatalf("StreamEvents: %v", err)
	}
	if want := []int64{1, 2, 3, 4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("delivered seqs %v; want each of %v exactly once", got, want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if want := []string{"0", "3", "5"}; !slices.Equal(s.ids, want) {
		t.Errorf("Last-Event-ID of each connection = %v; want %v", s.ids, want)
	}
}
