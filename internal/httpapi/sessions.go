package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/session"
	"github.com/belay-dev/belay/internal/wire"
)

// maxMessageBody bounds the body of POST /v1/sessions/{id}/messages: a
// text of the instruction limit, as JSON-escaped as it can be.
const maxMessageBody = 256 << 10

// sessionID returns the {id} path value, or not_found for one that cannot
// be a session id.
func sessionID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !strings.HasPrefix(id, "ses_") || len(id) > maxRunIDLen || !isIDText(id) {
		return "", belay.Errorf(belay.CodeNotFound, "session not found")
	}
	return id, nil
}

// Sessions returns the session service the handler runs sessions with, for
// the WebSocket functions on AWS to serve the same messages; nil when
// Config.Workspaces was not set.
func (s *Server) Sessions() *session.Service { return s.sessions }

// sessionReader is what a session's event routes read: the session
// service, or a session.Reader where the handler runs no sessions.
type sessionReader interface {
	Get(ctx context.Context, id string) (belay.Session, error)
	Events(ctx context.Context, sess belay.Session, after int64, limit int) (session.EventPage, error)
}

// withSessions answers not_found on the session routes of a handler built
// without sessions.
func (s *Server) withSessions(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.sessions == nil {
			s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "this control plane does not run sessions"))
			return
		}
		h(w, r)
	}
}

func (s *Server) newSessions(ws belay.Workspaces) (*session.Service, error) {
	return session.New(session.Config{
		Store: s.store, Artifacts: s.artifacts, Sources: s.sources, Intake: s.intake, Workspaces: ws,
		Cancel: func(ctx context.Context, runID string) error {
			_, err := s.cancelRunID(ctx, "", runID)
			return err
		},
		NewID: s.newID, Now: s.now, Logger: s.log,
	})
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	lim := s.limits
	// The body is a run request's, plus the skills.
	lim.MaxBodyBytes += belay.MaxSkillsBytes * 2
	body, err := readBody(w, r, int64(lim.MaxBodyBytes))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := belay.ParseSessionRequest(body, lim)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := s.sessions.Create(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	links := wire.SessionLinksFor(sess.ID)
	w.Header().Set("Location", links.Self)
	s.writeJSON(w, http.StatusCreated, wire.CreateSessionResponse{SessionID: sess.ID, Status: sess.Status, Links: links})
}

// handleGetSession answers the session's record (GET /v1/sessions/{id}).
func (s *Server) handleGetSession(w http.ResponseWriter, r *http.Request) {
	s.answerSession(r.Context(), w, r, http.StatusOK, func(ctx context.Context, id string) (belay.Session, error) {
		return s.sessions.Get(ctx, id)
	})
}

// answerSession runs act on the session the path names and answers its
// view with status.
func (s *Server) answerSession(ctx context.Context, w http.ResponseWriter, r *http.Request, status int,
	act func(ctx context.Context, id string) (belay.Session, error)) {
	id, err := sessionID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, err := act(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, status, wire.SessionViewOf(sess))
}

func (s *Server) handleSendMessage(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, maxMessageBody)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.MessageRequest
	if err := decodeStrict(body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	turn, err := s.sessions.Send(r.Context(), id, req.Text)
	if err != nil {
		s.writeError(w, r, textField(err))
		return
	}
	stateOf(r).runID = turn.RunID
	s.writeJSON(w, http.StatusAccepted, wire.MessageResponse{Turn: turn.Turn, RunID: turn.RunID})
}

// textField names a message's text where the run request's validation
// named the instruction.
func textField(err error) error {
	if e, ok := err.(*belay.Error); ok && e.Field == "instruction" {
		e2 := *e
		e2.Field = "text"
		return &e2
	}
	return err
}

// handleStopSession cancels the running turn (POST .../stop); it runs to its
// end even if the caller hangs up.
func (s *Server) handleStopSession(w http.ResponseWriter, r *http.Request) {
	s.answerSession(context.WithoutCancel(r.Context()), w, r, http.StatusAccepted, func(ctx context.Context, id string) (belay.Session, error) {
		return s.sessions.Stop(ctx, id)
	})
}

// handleCloseSession closes the session (DELETE /v1/sessions/{id}); it runs
// to its end even if the caller hangs up.
func (s *Server) handleCloseSession(w http.ResponseWriter, r *http.Request) {
	s.answerSession(context.WithoutCancel(r.Context()), w, r, http.StatusOK, func(ctx context.Context, id string) (belay.Session, error) {
		return s.sessions.Close(ctx, id)
	})
}

func (s *Server) handleSessionPatch(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	patch, err := s.sessions.Patch(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/x-diff; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(patch)
}

// handleSessionEvents serves the session's stream across its turns as
// NDJSON, or SSE with Accept: text/event-stream or ?stream=1 (resumable
// with Last-Event-ID). Sequence numbers are session-wide
// (belay.SessionSeq).
func (s *Server) handleSessionEvents(w http.ResponseWriter, r *http.Request) {
	if s.sessionReads == nil {
		s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "this control plane does not run sessions"))
		return
	}
	id, err := sessionID(r)
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
		s.streamSession(w, r, id, q.after)
		return
	}
	sess, err := s.sessionReads.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.sessionReads.Events(r.Context(), sess, q.after, q.limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set(wire.TerminalHeader, strconv.FormatBool(page.Ended))
	writeEventLines(w, page.Missed, page.OldestSeq, page.Events)
}

// followSession sends the session's events after `after` to emit, in
// order, waiting for more with wait, until the session is closed and its
// last event sent (nil), wait says stop (nil), or emit or the store fails.
func (s *Server) followSession(ctx context.Context, id string, after int64,
	emit func(belay.SessionEvent) error, missed func(oldest int64) error, wait func(changed <-chan struct{}) bool,
) error {
	for {
		changed := s.eventsChanged()
		sess, err := s.sessionReads.Get(ctx, id)
		if err != nil {
			return err
		}
		page, err := s.sessionReads.Events(ctx, sess, after, ssePageSize)
		if err != nil {
			return err
		}
		if page.Missed && missed != nil {
			if err := missed(page.OldestSeq); err != nil {
				return err
			}
			after = max(after, page.OldestSeq-1)
		}
		for _, e := range page.Events {
			if err := emit(e); err != nil {
				return err
			}
			after = e.Seq
		}
		if page.Ended {
			return nil
		}
		if len(page.Events) < ssePageSize && !wait(changed) {
			return nil
		}
	}
}

// streamSession is handleSessionEvents as SSE.
func (s *Server) streamSession(w http.ResponseWriter, r *http.Request, id string, after int64) {
	ctx := r.Context()
	// The first read happens before any header, so an unknown session is a
	// normal JSON 404.
	sess, err := s.sessionReads.Get(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if page, err := s.sessionReads.Events(ctx, sess, after, 1); err != nil {
		s.writeError(w, r, err)
		return
	} else if page.Ended && len(page.Events) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	flush := func() bool { return bw.Flush() == nil && rc.Flush() == nil }
	if !flush() {
		return
	}
	heartbeat := time.NewTimer(s.heartbeat)
	defer heartbeat.Stop()
	poll := time.NewTicker(s.pollEvery)
	defer poll.Stop()
	errGone := context.Canceled
	err = s.followSession(ctx, id, after,
		func(e belay.SessionEvent) error {
			data, err := json.Marshal(e)
			if err != nil {
				return err
			}
			writeSSE(bw, strconv.FormatInt(e.Seq, 10), e.Type, data)
			if !flush() {
				return errGone
			}
			heartbeat.Reset(s.heartbeat)
			return nil
		},
		func(oldest int64) error {
			data, _ := json.Marshal(wire.EventsMissed{OldestSeq: oldest})
			writeSSE(bw, "", wire.EventsMissedType, data)
			if !flush() {
				return errGone
			}
			return nil
		},
		func(changed <-chan struct{}) bool { return s.waitForPoll(ctx, bw, flush, heartbeat, poll, changed) },
	)
	if err != nil && err != errGone && ctx.Err() == nil {
		s.streamError(bw, r, id, err)
		flush()
	}
}
