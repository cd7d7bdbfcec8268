package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// handleSessionWebSocket serves GET /v1/sessions/{id}/ws: the session's
// events pushed in order as they happen (from ?after=SEQ, session-wide),
// and the client's chat, approve and stop messages, each answered with
// ws.accepted or ws.error. The route is authenticated like every public
// route (the bearer token on the upgrade request).
func (s *Server) handleSessionWebSocket(w http.ResponseWriter, r *http.Request) {
	id, err := sessionID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	after, err := intParam(r.URL.Query().Get("after"), "after", 0, 0, math.MaxInt64)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// An unknown session is a normal JSON 404, before the upgrade.
	if _, err := s.sessions.Get(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	_ = rc.SetReadDeadline(time.Time{})
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		// Accept has answered the caller (426 or 400).
		s.log.Debug("websocket accept", "request_id", stateOf(r).id, "err", err.Error())
		return
	}
	c.SetReadLimit(wire.MaxWSMessageBytes)
	reqID := stateOf(r).id
	// The connection ends when the caller leaves or the server closes.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()
	go func() {
		<-r.Context().Done()
		cancel()
	}()

	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		wctx, done := context.WithTimeout(ctx, 30*time.Second)
		defer done()
		return c.Write(wctx, websocket.MessageText, b)
	}

	// Events go out from their own goroutine, in order.
	followed := make(chan error, 1)
	go func() {
		poll := time.NewTicker(s.pollEvery)
		defer poll.Stop()
		followed <- s.followSession(ctx, id, after,
			func(e belay.SessionEvent) error { return send(e) },
			func(oldest int64) error {
				return send(wire.EventsMissedLine{Type: wire.EventsMissedType, Data: wire.EventsMissed{OldestSeq: oldest}})
			},
			func(changed <-chan struct{}) bool {
				select {
				case <-ctx.Done():
					return false
				case <-poll.C:
					return true
				case <-changed:
					return true
				}
			})
	}()
	go func() {
		err := <-followed
		if err != nil && ctx.Err() == nil {
			s.log.Info("session websocket: events stopped", "request_id", reqID, "session_id", id, "err", err.Error())
			_ = send(wsError("", err))
			c.Close(websocket.StatusInternalError, "events stopped")
		} else if err == nil && ctx.Err() == nil {
			c.Close(websocket.StatusNormalClosure, "session closed")
		}
		cancel()
	}()

	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			if ctx.Err() == nil && websocket.CloseStatus(err) == -1 {
				s.log.Debug("session websocket read", "request_id", reqID, "session_id", id, "err", err.Error())
			}
			c.CloseNow()
			return
		}
		if typ != websocket.MessageText {
			_ = send(wsError("", belay.Errorf(belay.CodeInvalid, "send JSON text messages")))
			continue
		}
		var m wire.WSClientMessage
		if err := decodeStrict(data, &m); err != nil {
			_ = send(wsError("", err))
			continue
		}
		_ = send(s.wsHandle(ctx, reqID, id, m))
	}
}

// wsHandle runs one client message and returns its answer.
func (s *Server) wsHandle(ctx context.Context, reqID, id string, m wire.WSClientMessage) wire.WSServerMessage {
	ctx = context.WithoutCancel(ctx)
	switch m.Type {
	case wire.WSTypeChat:
		turn, err := s.sessions.Send(ctx, id, m.Text)
		if err != nil {
			return wsError(m.Type, textField(err))
		}
		return wire.WSServerMessage{Type: wire.WSTypeAccepted, For: m.Type, Turn: turn.Turn, RunID: turn.RunID}
	case wire.WSTypeStop:
		sess, err := s.sessions.Stop(ctx, id)
		if err != nil {
			return wsError(m.Type, err)
		}
		out := wire.WSServerMessage{Type: wire.WSTypeAccepted, For: m.Type}
		if last := sess.LastTurn(); last != nil {
			out.Turn, out.RunID = last.Turn, last.RunID
		}
		return out
	case wire.WSTypeApprove:
		d := m.Decision
		switch {
		case d != "" && m.Approve != nil:
			return wsError(m.Type, belay.FieldErrorf(belay.CodeInvalid, "decision", "give decision or approve, not both"))
		case m.Approve != nil && *m.Approve:
			d = belay.DecisionAllowOnce
		case m.Approve != nil:
			d = belay.DecisionDeny
		}
		if !d.Valid() {
			return wsError(m.Type, belay.FieldErrorf(belay.CodeInvalid, "decision", "must be one of allow_once, allow_session, deny, cancel (or approve: true|false)"))
		}
		if m.ID == "" || len(m.ID) > maxRunIDLen || !isIDText(m.ID) {
			return wsError(m.Type, belay.FieldErrorf(belay.CodeInvalid, "id", "must name the approval (its approvalId)"))
		}
		if len(m.Reason) > wire.MaxDecisionReasonLen || !utf8.ValidString(m.Reason) {
			return wsError(m.Type, belay.FieldErrorf(belay.CodeInvalid, "reason", "must be valid UTF-8 of at most %d bytes", wire.MaxDecisionReasonLen))
		}
		sess, err := s.sessions.Get(ctx, id)
		if err != nil {
			return wsError(m.Type, err)
		}
		last := sess.LastTurn()
		if last == nil {
			return wsError(m.Type, belay.Errorf(belay.CodeNotFound, "approval %s not found: the session has no turn", m.ID))
		}
		if _, err := s.decideApproval(ctx, reqID, last.RunID, m.ID, d, m.Reason); err != nil {
			return wsError(m.Type, err)
		}
		return wire.WSServerMessage{Type: wire.WSTypeAccepted, For: m.Type, Turn: last.Turn, RunID: last.RunID, ID: m.ID}
	}
	return wsError(m.Type, belay.FieldErrorf(belay.CodeInvalid, "type", "must be chat, approve or stop"))
}

// wsError is the answer to a client message that failed: its code and
// message (an internal error is "internal error", as on every route).
func wsError(forType string, err error) wire.WSServerMessage {
	code := belay.ErrorCode(err)
	msg := belay.ErrorMessage(err)
	var be *belay.Error
	if errors.As(err, &be) && be.Field != "" && code != belay.CodeInternal {
		msg = be.Field + ": " + msg
	}
	return wire.WSServerMessage{Type: wire.WSTypeError, For: forType, Error: &wire.ErrorDetail{Code: code, Message: msg}}
}

// Authorized reports whether the public routes' Authenticator lets a
// request with these headers through (on belay serve and under
// BELAY_AUTH=token, the control-plane token in Authorization): for the
// WebSocket functions on AWS, whose $connect is the only request with the
// client's headers.
func (s *Server) Authorized(header http.Header) bool {
	r, err := http.NewRequest(http.MethodGet, "/v1/sessions", nil)
	if err != nil {
		return false
	}
	r.Header = header.Clone()
	return s.authenticate(r) == nil
}

// SessionMessage runs one WebSocket client message (wire.WSClientMessage
// as JSON) on session id and returns the answer to send back: what the
// embedded route does per message, for API Gateway's WebSocket API.
func (s *Server) SessionMessage(ctx context.Context, id string, data []byte) wire.WSServerMessage {
	if len(data) > wire.MaxWSMessageBytes {
		return wsError("", belay.Errorf(belay.CodeTooLarge, "a message is at most %d bytes", wire.MaxWSMessageBytes))
	}
	var m wire.WSClientMessage
	if err := decodeStrict(data, &m); err != nil {
		return wsError("", err)
	}
	return s.wsHandle(ctx, s.newID("req_"), id, m)
}
