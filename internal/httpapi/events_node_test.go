package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// moduleRoot returns the directory of belay's go.mod, above the test's
// working directory.
func moduleRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// requireEventSource finds node and the npm eventsource package (pinned in
// package.json, installed by npm ci). Outside CI a missing one skips the
// test with how to get it; under CI=true it fails.
func requireEventSource(tb testing.TB) string {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(moduleRoot(tb), "node_modules", "eventsource", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("node with the npm eventsource package is needed (run npm ci in the repository root): %v", err)
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return node
}

// streamRequest is one request the event stream route answered.
type streamRequest struct {
	query, lastEventID string
	status             int
}

// requestLog records the requests of an event stream and their status.
type requestLog struct {
	mu   sync.Mutex
	reqs []streamRequest
}

func (l *requestLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.reqs = append(l.reqs, streamRequest{query: r.URL.RawQuery, lastEventID: r.Header.Get("Last-Event-ID"), status: sw.status})
	})
}

func (l *requestLog) byQuery(q string) []streamRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []streamRequest
	for _, r := range l.reqs {
		if r.query == q {
			out = append(out, r)
		}
	}
	return out
}

// statusWriter remembers the status code; Unwrap lets the handler flush
// and set deadlines through http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// esResult is what eventsource-follow.mjs prints for one client.
type esResult struct {
	Name        string `json:"name"`
	Closed      bool   `json:"closed"`
	ClosedAfter int64  `json:"closedAfterMs"`
	Events      []struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data string `json:"data"`
	} `json:"events"`
	Errors []struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
}

// TestEventSourceStopsAfterFinishedRun reads a finished run's stream with a
// standard EventSource (the npm eventsource package, under Node), once from
// the start and once from the middle (?after=4). Each reader gets every
// event after its position exactly once, in order, then the stream ends;
// the EventSource reconnects once with Last-Event-ID at the last event, is
// answered 204 No Content, and closes itself: no further request reaches
// the server while it lingers past the library's 3 s reconnection delay.
func TestEventSourceStopsAfterFinishedRun(t *testing.T) {
	node := requireEventSource(t)
	t.Parallel()
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 5)
	h.finishRun(t, id) // seq 1..8: run.queued, run.started, 5 tool.call, run.completed
	all := h.allEvents(t, id)
	if len(all) != 8 {
		t.Fatalf("the run has %d events, want 8", len(all))
	}

	log := &requestLog{}
	srv := httptest.NewServer(log.wrap(h.api))
	t.Cleanup(srv.Close)
	path := "/v1/runs/" + id + "/events"
	clients := []struct {
		name, query string
		after       int
	}{
		{"start", "stream=1", 0},
		{"middle", "stream=1&after=4", 4},
	}
	type clientCfg struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	}
	cfg := struct {
		Token   string      `json:"token"`
		Types   []string    `json:"types"`
		Linger  int         `json:"linger"`
		Clients []clientCfg `json:"clients"`
	}{Token: h.controlToken, Types: []string{belay.EventRunQueued, belay.EventRunStarted, belay.EventToolCall, belay.EventRunCompleted}, Linger: 3500}
	for _, c := range clients {
		cfg.Clients = append(cfg.Clients, clientCfg{Name: c.name, URL: srv.URL + path + "?" + c.query})
	}
	arg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "eventsource-follow.mjs"), string(arg))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node eventsource-follow.mjs: %v\n%s", err, stderr.String())
	}

	results := map[string]esResult{}
	for line := range strings.Lines(string(out)) {
		var r esResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("node printed %q: %v", line, err)
		}
		results[r.Name] = r
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			r, ok := results[c.name]
			if !ok {
				t.Fatalf("no result for client %s in %s", c.name, out)
			}
			if !r.Closed {
				t.Errorf("the EventSource did not close itself; errors: %+v", r.Errors)
			}
			want := all[c.after:]
			if len(r.Events) != len(want) {
				t.Fatalf("got %d events, want %d (seq %d..8, each once): %+v", len(r.Events), len(want), c.after+1, r.Events)
			}
			for i, ev := range r.Events {
				var e belay.Event
				if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
					t.Fatalf("event %d data %q: %v", i, ev.Data, err)
				}
				if ev.ID != strconv.FormatInt(want[i].Seq, 10) || ev.Type != want[i].Type || e.Seq != want[i].Seq {
					t.Errorf("event %d: id %s type %s seq %d; want seq %d %s", i, ev.ID, ev.Type, e.Seq, want[i].Seq, want[i].Type)
				}
			}
			// An EventSource reports each reconnect as an error event: one
			// when the stream ended, one for the 204 that closed it.
			if n := len(r.Errors); n != 2 || r.Errors[0].Code != nil || r.Errors[1].Code == nil || *r.Errors[1].Code != http.StatusNoContent {
				t.Errorf("error events %+v; want the reconnect notice, then the 204 that closed it", r.Errors)
			}

			reqs := log.byQuery(c.query)
			if len(reqs) != 2 {
				t.Fatalf("the server saw %d requests from this reader, want 2 (the stream, one reconnect answered 204): %+v", len(reqs), reqs)
			}
			if reqs[0].status != http.StatusOK || reqs[0].lastEventID != "" {
				t.Errorf("first request: %+v; want 200 without Last-Event-ID", reqs[0])
			}
			if reqs[1].status != http.StatusNoContent || reqs[1].lastEventID != "8" {
				t.Errorf("reconnect: %+v; want Last-Event-ID 8 answered 204", reqs[1])
			}
		})
	}
}
