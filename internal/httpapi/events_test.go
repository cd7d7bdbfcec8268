package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// ndjsonLines splits an NDJSON answer into raw lines.
func ndjsonLines(tb testing.TB, body []byte) []map[string]json.RawMessage {
	tb.Helper()
	var out []map[string]json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			tb.Fatalf("NDJSON line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func seqOf(tb testing.TB, m map[string]json.RawMessage) int64 {
	tb.Helper()
	n, err := strconv.ParseInt(string(m["seq"]), 10, 64)
	if err != nil {
		tb.Fatalf("line without seq: %v", m)
	}
	return n
}

func TestEventsNDJSONPaging(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 10) // with run.queued and run.started: seq 1..12

	var got []int64
	after := int64(0)
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		a := h.public(t, "GET", fmt.Sprintf("/v1/runs/%s/events?after=%d&limit=5", id, after), "")
		if a.status != 200 || a.header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("events: %d %q %s", a.status, a.header.Get("Content-Type"), a.body)
		}
		if a.header.Get(wire.LastSeqHeader) != "12" || a.header.Get(wire.TerminalHeader) != "false" {
			t.Errorf("headers: last seq %q terminal %q", a.header.Get(wire.LastSeqHeader), a.header.Get(wire.TerminalHeader))
		}
		lines := ndjsonLines(t, a.body)
		if len(lines) > 5 {
			t.Fatalf("limit 5 gave %d lines", len(lines))
		}
		if len(lines) == 0 {
			break
		}
		for _, l := range lines {
			got = append(got, seqOf(t, l))
			for _, k := range []string{"seq", "time", "type"} {
				if _, ok := l[k]; !ok {
					t.Errorf("line %v has no %s", l, k)
				}
			}
		}
		after = got[len(got)-1]
	}
	if len(got) != 12 {
		t.Fatalf("paged seqs %v, want 1..12", got)
	}
	for i, s := range got {
		if s != int64(i+1) {
			t.Fatalf("paged seqs %v, want 1..12 in order", got)
		}
	}
	lines := ndjsonLines(t, h.public(t, "GET", "/v1/runs/"+id+"/events", "").body)
	if len(lines) != 12 || string(lines[0]["type"]) != `"run.queued"` {
		t.Errorf("default read: %d lines, first %v", len(lines), lines[0])
	}
	for _, q := range []string{"?after=-1", "?after=x", "?limit=0", "?limit=1.5"} {
		a := h.public(t, "GET", "/v1/runs/"+id+"/events"+q, "")
		if a.status != 400 || a.errorCode(t) != belay.CodeInvalid {
			t.Errorf("events%s: %d %s, want 400 invalid", q, a.status, a.body)
		}
	}
	if a := h.public(t, "GET", "/v1/runs/run_missing/events", ""); a.status != 404 {
		t.Errorf("unknown run: %d, want 404", a.status)
	}
}

func TestEventsMissedNDJSON(t *testing.T) {
	h := newHarness(t, harnessOptions{bufferSize: 5})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 10) // seq 1..12, the buffer keeps 8..12

	lines := ndjsonLines(t, h.public(t, "GET", "/v1/runs/"+id+"/events?after=2", "").body)
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want the marker and 5 events", len(lines))
	}
	var marker wire.EventsMissedLine
	raw, _ := json.Marshal(lines[0])
	if err := json.Unmarshal(raw, &marker); err != nil || marker.Type != wire.EventsMissedType || marker.Data.OldestSeq != 8 {
		t.Errorf("first line %s, want events.missed with oldestSeq 8", raw)
	}
	if _, ok := lines[0]["seq"]; ok {
		t.Error("the events.missed marker carries a seq")
	}
	if seqOf(t, lines[1]) != 8 || seqOf(t, lines[5]) != 12 {
		t.Errorf("events after the marker: %v .. %v", lines[1], lines[5])
	}
	// A reader that is up to date is told nothing.
	lines = ndjsonLines(t, h.public(t, "GET", "/v1/runs/"+id+"/events?after=9", "").body)
	if len(lines) != 3 || seqOf(t, lines[0]) != 10 {
		t.Errorf("after=9 gave %v", lines)
	}
}

// readSSE reads events (not comments) from r until n are read or the
// stream ends.
func readSSE(tb testing.TB, r *sseReader, n int) ([]sseEvent, error) {
	tb.Helper()
	var out []sseEvent
	for len(out) < n {
		ev, err := r.next()
		if err != nil {
			return out, err
		}
		if ev.comment != "" {
			continue
		}
		out = append(out, ev)
	}
	return out, nil
}

func TestSSEResumeWithLastEventID(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 3) // seq 1..5
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	resp := h.openStream(t, ctx, "/v1/runs/"+id+"/events", http.Header{"Accept": {"text/event-stream"}})
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := newSSEReader(resp.Body)
	seen, err := readSSE(t, r, 4)
	if err != nil {
		t.Fatalf("first read: %v", err)
	}
	// New events arrive while the reader is connected; it sees some, then
	// the connection drops.
	h.appendEvents(t, id, 3) // seq 6..8
	more, err := readSSE(t, r, 2)
	if err != nil {
		t.Fatalf("second read: %v", err)
	}
	seen = append(seen, more...)
	resp.Body.Close()

	h.appendEvents(t, id, 4) // seq 9..12
	h.finishRun(t, id)       // seq 13, run.completed
	last := seen[len(seen)-1].id
	// ?after=1 is overridden by Last-Event-ID, as a reconnecting
	// EventSource expects.
	resp = h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1&after=1", http.Header{"Last-Event-ID": {last}})
	defer resp.Body.Close()
	rest, err := readSSE(t, newSSEReader(resp.Body), 1000)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("resumed stream did not end cleanly after the terminal event: %v", err)
	}
	seen = append(seen, rest...)

	if len(seen) != 13 {
		t.Fatalf("saw %d events, want 13: %v", len(seen), seen)
	}
	for i, ev := range seen {
		if ev.id != strconv.Itoa(i+1) {
			t.Fatalf("event %d has id %q: every event exactly once, in order: %v", i, ev.id, seen)
		}
		var e belay.Event
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil || e.Seq != int64(i+1) || e.Type != ev.event {
			t.Errorf("event %d: data %s does not match id %s / type %s", i, ev.data, ev.id, ev.event)
		}
	}
	if seen[12].event != belay.EventRunCompleted {
		t.Errorf("last event %q, want run.completed", seen[12].event)
	}
}

func TestSSEEndsAfterTerminalEvent(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp := h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1", nil)
	defer resp.Body.Close()
	r := newSSEReader(resp.Body)
	if _, err := readSSE(t, r, 2); err != nil { // run.queued, run.started
		t.Fatal(err)
	}
	h.finishRun(t, id)
	evs, err := readSSE(t, r, 1000)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("stream did not end after the terminal event: %v (%v)", err, evs)
	}
	if len(evs) != 1 || evs[0].event != belay.EventRunCompleted {
		t.Errorf("after start: %v, want just run.completed", evs)
	}
	// A reader of a finished run that has every event is told to stop
	// (204 No Content), from its last event or past it; one behind gets
	// what it lacks, then the end.
	for _, last := range []string{"3", "7"} {
		resp2 := h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1", http.Header{"Last-Event-ID": {last}})
		body, _ := io.ReadAll(resp2.Body)
		resp2.Body.Close()
		if resp2.StatusCode != http.StatusNoContent || len(body) != 0 {
			t.Errorf("stream of an ended run from seq %s: %d %q; want 204 and no body", last, resp2.StatusCode, body)
		}
	}
	resp3 := h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1&after=2", nil)
	defer resp3.Body.Close()
	evs, err = readSSE(t, newSSEReader(resp3.Body), 1000)
	if resp3.StatusCode != http.StatusOK || !errors.Is(err, io.EOF) || len(evs) != 1 || evs[0].id != "3" {
		t.Errorf("stream of an ended run from seq 2: %d %v %v; want run.completed (3), then the end", resp3.StatusCode, evs, err)
	}
}

func TestSSEHeartbeat(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: 5 * time.Millisecond, heartbeat: 20 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp := h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1&after=2", nil)
	defer resp.Body.Close()
	ev, err := newSSEReader(resp.Body).next()
	if err != nil {
		t.Fatal(err)
	}
	if ev.comment != "ping" {
		t.Errorf("first thing on a quiet stream: %+v, want the ping comment", ev)
	}
}

func TestSSEEventsMissed(t *testing.T) {
	h := newHarness(t, harnessOptions{bufferSize: 5, poll: 5 * time.Millisecond})
	id, _ := h.startRun(t, "", 5)
	h.appendEvents(t, id, 10) // seq 1..12, the buffer keeps 8..12
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp := h.openStream(t, ctx, "/v1/runs/"+id+"/events", http.Header{"Accept": {"application/json, text/event-stream"}})
	defer resp.Body.Close()
	evs, err := readSSE(t, newSSEReader(resp.Body), 6)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].event != wire.EventsMissedType || evs[0].id != "" || evs[0].data != `{"oldestSeq":8}` {
		t.Errorf("first event %+v, want events.missed without id, oldestSeq 8", evs[0])
	}
	if evs[1].id != "8" || evs[5].id != "12" {
		t.Errorf("events after the marker: %+v", evs[1:])
	}
}

func TestSSEBadRequests(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id := h.createRun(t, "")
	a := h.do(t, "GET", "/v1/runs/"+id+"/events?stream=1", h.controlToken, nil, http.Header{"Last-Event-ID": {"abc"}})
	if a.status != 400 || a.errorCode(t) != belay.CodeInvalid {
		t.Errorf("bad Last-Event-ID: %d %s", a.status, a.body)
	}
	a = h.do(t, "GET", "/v1/runs/run_missing/events?stream=1", h.controlToken, nil, nil)
	if a.status != 404 || a.errorCode(t) != belay.CodeNotFound {
		t.Errorf("unknown run: %d %s", a.status, a.body)
	}
}

// TestSSEWakesOnStoreChange shows a stream over a watched store delivers a
// write at once: with an hour between polls, only the change signal can
// bring the terminal event before the test's deadline.
func TestSSEWakesOnStoreChange(t *testing.T) {
	h := newHarness(t, harnessOptions{poll: time.Hour, watch: true})
	id, _ := h.startRun(t, "", 5)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	resp := h.openStream(t, ctx, "/v1/runs/"+id+"/events?stream=1", nil)
	defer resp.Body.Close()
	r := newSSEReader(resp.Body)
	if _, err := readSSE(t, r, 2); err != nil { // run.queued, run.started
		t.Fatal(err)
	}
	h.appendEvents(t, id, 3)
	h.finishRun(t, id)
	evs, err := readSSE(t, r, 1000)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("stream did not end after the terminal event: %v (%v)", err, evs)
	}
	if len(evs) != 4 || evs[3].event != belay.EventRunCompleted {
		t.Errorf("after start: %v, want 3 appended events and run.completed", evs)
	}
}
