package belay

import (
	"context"
	"strings"
	"time"
)

// Connection is a client's WebSocket on a session where the platform holds
// the socket (API Gateway's WebSocket API): the connection id the
// platform gave it, its session, and the session-wide sequence number of
// the last event pushed to it (SessionSeq), so each event goes out once.
type Connection struct {
	ID          string    `json:"connectionId"`
	SessionID   string    `json:"sessionId"`
	ConnectedAt time.Time `json:"connectedAt"`
	Sent        int64     `json:"sent"`
}

// CheckConnection returns invalid for a connection a store must not keep.
func CheckConnection(c Connection) error {
	switch {
	case c.ID == "" || len(c.ID) > 128 || !isPrintableText(c.ID) || strings.ContainsAny(c.ID, "#/ "):
		return FieldErrorf(CodeInvalid, "connectionId", "must be 1 to 128 printable characters without #, / or space")
	case !strings.HasPrefix(c.SessionID, "ses_") || len(c.SessionID) > 64:
		return FieldErrorf(CodeInvalid, "sessionId", "is not a session id")
	case c.ConnectedAt.IsZero():
		return FieldErrorf(CodeInvalid, "connectedAt", "is unset")
	case c.Sent < 0:
		return FieldErrorf(CodeInvalid, "sent", "is negative")
	}
	return nil
}

// ConnectionStore keeps the WebSocket connections of sessions (API
// Gateway's WebSocket API on AWS; the embedded server holds its sockets
// itself and needs none).
type ConnectionStore interface {
	// PutConnection stores c, replacing a connection with its id (the
	// platform never reuses one). Returns invalid for a connection
	// CheckConnection refuses.
	PutConnection(ctx context.Context, c Connection) error

	// GetConnection returns one connection. Returns not_found if it does
	// not exist.
	GetConnection(ctx context.Context, id string) (Connection, error)

	// DeleteConnection removes it; removing what does not exist succeeds.
	DeleteConnection(ctx context.Context, id string) error

	// SessionConnections returns the session's connections (empty when it
	// has none).
	SessionConnections(ctx context.Context, sessionID string) ([]Connection, error)

	// AdvanceConnection moves the connection's Sent from `from` to `to` in
	// one conditional write and reports whether it did: false, changing
	// nothing, when Sent is no longer `from` (another pusher took those
	// events) or the connection is gone. Of concurrent calls with the same
	// `from`, at most one succeeds. `to` may be below `from`: a pusher
	// gives back events it claimed and could not post.
	AdvanceConnection(ctx context.Context, id string, from, to int64) (bool, error)
}
