package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Bounds of GET /v1/runs/{id}/events as NDJSON.
const (
	DefaultEventsLimit = 500
	MaxEventsLimit     = 2000
)

// ssePageSize is how many events an SSE stream reads from the store at once.
const ssePageSize = 500

// handleEvents serves a run's log as NDJSON, or as an SSE stream when the
// caller asks with Accept: text/event-stream or ?stream=1.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q, err := parseEventsQuery(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if q.stream {
		s.streamEvents(w, r, id, q.after)
		return
	}
	page, err := s.store.ListEvents(r.Context(), id, q.after, q.limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set(wire.LastSeqHeader, strconv.FormatInt(page.LastSeq, 10))
	w.Header().Set(wire.TerminalHeader, strconv.FormatBool(page.Terminal))
	writeEventLines(w, page.Missed, page.OldestSeq, page.Events)
}

// eventsQuery is what a request to an events route (a run's or a
// session's) asks for: the events after a seq, as an SSE stream or a page
// of at most limit NDJSON lines.
type eventsQuery struct {
	after  int64
	stream bool
	limit  int
}

// parseEventsQuery reads ?after=, and for a stream (WantsStream) the
// Last-Event-ID a reconnecting EventSource sends, which wins over the after
// it first connected with; for a page, ?limit=.
func parseEventsQuery(r *http.Request) (eventsQuery, error) {
	q := r.URL.Query()
	after, err := intParam(q.Get("after"), "after", 0, 0, math.MaxInt64)
	if err != nil {
		return eventsQuery{}, err
	}
	if WantsStream(r) {
		if v := r.Header.Get("Last-Event-ID"); v != "" {
			if after, err = intParam(strings.TrimSpace(v), "Last-Event-ID", 0, 0, math.MaxInt64); err != nil {
				return eventsQuery{}, err
			}
		}
		return eventsQuery{after: after, stream: true}, nil
	}
	limit, err := intParam(q.Get("limit"), "limit", DefaultEventsLimit, 1, MaxEventsLimit)
	if err != nil {
		return eventsQuery{}, err
	}
	return eventsQuery{after: after, limit: int(limit)}, nil
}

// writeEventLines answers a page of events as NDJSON (headers the caller
// set stay): an events.missed line first when the page starts past events
// that left the buffer, then one line per event.
func writeEventLines[E any](w http.ResponseWriter, missed bool, oldestSeq int64, events []E) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if missed {
		_ = enc.Encode(wire.EventsMissedLine{Type: wire.EventsMissedType, Data: wire.EventsMissed{OldestSeq: oldestSeq}})
	}
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

// WantsStream reports whether a request for a run's events asks for an SSE
// stream (Accept: text/event-stream, or ?stream=1) rather than NDJSON. The
// Lambda adapter asks it too, to route a stream to the streaming function.
func WantsStream(r *http.Request) bool {
	if v := r.URL.Query().Get("stream"); v == "1" || v == "true" {
		return true
	}
	for _, accept := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(accept, ",") {
			mt, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// streamEvents writes the log after `after` as server-sent events, then
// polls the store for more, until the terminal event has been sent or the
// caller leaves. A comment line goes out whenever the stream has been quiet
// for a heartbeat interval. A reader of an ended run that already has its
// last event gets 204 No Content, which tells an EventSource not to
// reconnect.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, id string, after int64) {
	ctx := r.Context()
	// The change signal is taken before each read, so a write landing
	// between the read and the wait still wakes the stream.
	changed := s.eventsChanged()
	// The first read happens before any header is written, so an unknown
	// run still gets a normal JSON 404.
	page, err := s.store.ListEvents(ctx, id, after, ssePageSize)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if page.Terminal && after >= page.LastSeq {
		// The run has ended and the reader has every event. An
		// EventSource reconnects after every close, for ever; 204 is the
		// SSE standard's word for "stop". A reader that is behind got
		// the rest above, then the end of the stream.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	rc := http.NewResponseController(w)
	// A server WriteTimeout would cut a long stream; this one has its own
	// end (the terminal event) and its own keep-alive (the heartbeat).
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	bw := bufio.NewWriter(w)
	flush := func() bool {
		if bw.Flush() != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !flush() {
		return
	}
	heartbeat := time.NewTimer(s.heartbeat)
	defer heartbeat.Stop()
	poll := time.NewTicker(s.pollEvery)
	defer poll.Stop()

	for {
		if page.Missed {
			data, _ := json.Marshal(wire.EventsMissed{OldestSeq: page.OldestSeq})
			writeSSE(bw, "", wire.EventsMissedType, data)
			// Events before OldestSeq are gone; do not report them again.
			after = max(after, page.OldestSeq-1)
		}
		ended := false
		for _, e := range page.Events {
			data, err := json.Marshal(e)
			if err != nil {
				s.log.Error("encode event", "request_id", stateOf(r).id, "run_id", id, "err", err.Error())
				return
			}
			writeSSE(bw, strconv.FormatInt(e.Seq, 10), e.Type, data)
			if !flush() {
				return
			}
			after = e.Seq
			if belay.IsTerminalEvent(e.Type) {
				ended = true
				break
			}
		}
		if page.Missed || len(page.Events) > 0 {
			if !flush() {
				return
			}
			heartbeat.Reset(s.heartbeat)
		}
		if ended || (page.Terminal && after >= page.LastSeq) {
			return
		}
		if len(page.Events) < ssePageSize {
			if !s.waitForPoll(ctx, bw, flush, heartbeat, poll, changed) {
				return
			}
		}
		changed = s.eventsChanged()
		page, err = s.store.ListEvents(ctx, id, after, ssePageSize)
		if err != nil {
			if ctx.Err() == nil {
				s.streamError(bw, r, id, err)
				flush()
			}
			return
		}
	}
}

// eventsChanged returns the store's change signal, or nil (never ready)
// when there is none and the stream only polls.
func (s *Server) eventsChanged() <-chan struct{} {
	if s.changed == nil {
		return nil
	}
	return s.changed()
}

// waitForPoll blocks until the next poll tick or a change signal, sending
// heartbeats while it waits. It returns false when the caller has gone.
func (s *Server) waitForPoll(ctx context.Context, bw *bufio.Writer, flush func() bool, heartbeat *time.Timer, poll *time.Ticker, changed <-chan struct{}) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
			return true
		case <-changed:
			return true
		case <-heartbeat.C:
			_, _ = bw.WriteString(": ping\n\n")
			if !flush() {
				return false
			}
			heartbeat.Reset(s.heartbeat)
		}
	}
}

// streamError ends a stream with an in-band error, since the status line is
// long gone. Internal errors are logged and answered as "internal error".
func (s *Server) streamError(bw *bufio.Writer, r *http.Request, id string, err error) {
	st := stateOf(r)
	code := belay.ErrorCode(err)
	if code == belay.CodeInternal {
		s.log.Error("event stream", "request_id", st.id, "run_id", id, "err", err.Error())
	}
	data, _ := json.Marshal(wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: belay.ErrorMessage(err), RequestID: st.id}})
	writeSSE(bw, "", "error", data)
}

// writeSSE writes one event. data is a single line of JSON, so it needs no
// splitting; type and id come from the store and hold no newlines, which is
// checked anyway so a bad value cannot inject fields.
func writeSSE(bw *bufio.Writer, id, typ string, data []byte) {
	if id != "" && !strings.ContainsAny(id, "\r\n") {
		_, _ = bw.WriteString("id: " + id + "\n")
	}
	if typ != "" && !strings.ContainsAny(typ, "\r\n") {
		_, _ = bw.WriteString("event: " + typ + "\n")
	}
	_, _ = bw.WriteString("data: ")
	_, _ = bw.Write(data)
	_, _ = bw.WriteString("\n\n")
}
