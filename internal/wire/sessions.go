package wire

import (
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// CreateSessionResponse answers POST /v1/sessions (201).
type CreateSessionResponse struct {
	SessionID string              `json:"sessionId"`
	Status    belay.SessionStatus `json:"status"`
	Links     SessionLinks        `json:"links"`
}

// SessionLinks are the routes of one session.
type SessionLinks struct {
	Self      string `json:"self"`
	Messages  string `json:"messages"`
	Events    string `json:"events"`
	Stream    string `json:"stream"`
	WebSocket string `json:"ws"`
	Patch     string `json:"patch"`
	Stop      string `json:"stop"`
}

// SessionLinksFor returns the links of session id.
func SessionLinksFor(id string) SessionLinks {
	base := "/v1/sessions/" + id
	return SessionLinks{Self: base, Messages: base + "/messages", Events: base + "/events",
		Stream: base + "/events?stream=1", WebSocket: base + "/ws", Patch: base + "/patch", Stop: base + "/stop"}
}

// MessageRequest is the body of POST /v1/sessions/{id}/messages.
type MessageRequest struct {
	Text string `json:"text"`
}

// MessageResponse answers a message (202): the turn it started and the
// turn's run.
type MessageResponse struct {
	Turn  int    `json:"turn"`
	RunID string `json:"runId"`
}

// SessionView is GET /v1/sessions/{id}: the session's record.
type SessionView struct {
	SessionID string              `json:"sessionId"`
	Status    belay.SessionStatus `json:"status"`
	CreatedAt time.Time           `json:"createdAt"`
	UpdatedAt time.Time           `json:"updatedAt"`
	ClosedAt  time.Time           `json:"closedAt,omitzero"`
	Request   SessionSummary      `json:"request"`
	Turns     []belay.Turn        `json:"turns"`
	Usage     belay.Usage         `json:"usage"`
	Head      *belay.SessionHead  `json:"head,omitempty"`
	Links     SessionLinks        `json:"links"`
}

// SessionSummary is what a session view shows of its request: not the
// files' content nor the skills' bodies.
type SessionSummary struct {
	Model           string               `json:"model"`
	Files           int                  `json:"files,omitempty"`
	Git             *belay.GitSource     `json:"git,omitempty"`
	AllowedPaths    []string             `json:"allowedPaths"`
	Checks          [][]string           `json:"checks"`
	MaxSteps        int                  `json:"maxSteps"`
	WallTimeSeconds int                  `json:"wallTimeSeconds"`
	Approval        belay.ApprovalConfig `json:"approval"`
	Skills          []string             `json:"skills,omitempty"`
}

// SessionViewOf returns the view of s.
func SessionViewOf(s belay.Session) SessionView {
	v := SessionView{SessionID: s.ID, Status: s.Status, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, ClosedAt: s.ClosedAt,
		Turns: NonNil(s.Turns), Usage: s.Usage, Head: s.Head, Links: SessionLinksFor(s.ID),
		Request: SessionSummary{Model: s.Request.Model, Files: len(s.Request.Files), AllowedPaths: s.Request.AllowedPaths,
			Checks: s.Request.Checks, MaxSteps: s.Request.MaxSteps, WallTimeSeconds: s.Request.WallTimeSeconds,
			Approval: s.Request.Approval}}
	if g := s.Request.Source; g != nil && g.Git != nil {
		v.Request.Git = &belay.GitSource{URL: g.Git.URL, Ref: g.Git.Ref}
	}
	for _, sk := range s.Request.Skills {
		v.Request.Skills = append(v.Request.Skills, sk.Name)
	}
	return v
}

// The WebSocket messages of GET /v1/sessions/{id}/ws. A client sends
// WSClientMessage; the server sends every event of the session
// (belay.SessionEvent, whose type is the event's) as it happens, and
// answers each client message with a WSServerMessage of type
// WSTypeAccepted or WSTypeError.
const (
	WSTypeChat    = "chat"
	WSTypeApprove = "approve"
	WSTypeStop    = "stop"

	WSTypeAccepted = "ws.accepted"
	WSTypeError    = "ws.error"
)

// MaxWSMessageBytes bounds one client message (a chat's text is at most
// the instruction limit, 32,000 characters).
const MaxWSMessageBytes = 256 << 10

// WSClientMessage is what a WebSocket client sends: {"type": "chat",
// "text"}, {"type": "approve", "id", "decision"} (or "approve": true |
// false for allow_once | deny, with an optional reason), {"type": "stop"}.
type WSClientMessage struct {
	Type     string         `json:"type"`
	Text     string         `json:"text,omitempty"`
	ID       string         `json:"id,omitempty"`
	Decision belay.Decision `json:"decision,omitempty"`
	Approve  *bool          `json:"approve,omitempty"`
	Reason   string         `json:"reason,omitempty"`
}

// WSServerMessage answers a client message: accepted (with the turn and
// run a chat started, or the approval decided) or an error.
type WSServerMessage struct {
	Type  string       `json:"type"`
	For   string       `json:"for,omitempty"`
	Turn  int          `json:"turn,omitempty"`
	RunID string       `json:"runId,omitempty"`
	ID    string       `json:"id,omitempty"`
	Error *ErrorDetail `json:"error,omitempty"`
}
