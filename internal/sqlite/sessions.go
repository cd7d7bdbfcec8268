package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// CreateSession stores s, idle with no turns. Returns invalid for a session
// belay.CheckSession refuses; conflict if its id exists.
func (s *Store) CreateSession(ctx context.Context, sess belay.Session) error {
	if err := belay.CheckSession(sess); err != nil {
		return err
	}
	if sess.Status != belay.SessionIdle || len(sess.Turns) > 0 {
		return belay.FieldErrorf(belay.CodeInvalid, "status", "a new session is idle and has no turns")
	}
	if err := checkTimes("createdAt", sess.CreatedAt, sess.UpdatedAt); err != nil {
		return err
	}
	sess.Version = 1
	doc, err := encodeSession(sess)
	if err != nil {
		return err
	}
	err = s.update(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "INSERT INTO sessions (id, doc, version, created_at) VALUES (?, ?, 1, ?) ON CONFLICT (id) DO NOTHING",
			sess.ID, doc, sess.CreatedAt.UnixNano())
		if err != nil {
			return fmt.Errorf("insert session: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return belay.Errorf(belay.CodeConflict, "session %s exists", sess.ID)
		}
		return nil
	})
	return wrap("create session "+sess.ID, err)
}

// GetSession returns the session. Returns not_found if it does not exist.
func (s *Store) GetSession(ctx context.Context, id string) (belay.Session, error) {
	var out belay.Session
	err := s.view(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = loadSession(ctx, tx, id)
		return err
	})
	return out, wrap("get session "+id, err)
}

// StartTurn records t as the session's next turn (belay.Session.StartTurn)
// in one transaction.
func (s *Store) StartTurn(ctx context.Context, id string, t belay.Turn) (belay.Session, error) {
	return s.changeSession(ctx, "start turn of session "+id, id, func(cur belay.Session) (belay.Session, bool, error) {
		next, err := cur.StartTurn(t)
		return next, err == nil, err
	})
}

// FinishTurn records the end of the session's running turn
// (belay.Session.FinishTurn) in one transaction.
func (s *Store) FinishTurn(ctx context.Context, id string, e belay.TurnEnd) (belay.Session, error) {
	return s.changeSession(ctx, "finish turn of session "+id, id, func(cur belay.Session) (belay.Session, bool, error) {
		return cur.FinishTurn(e)
	})
}

// CloseSession closes the session in one transaction; a closed one is
// returned as it is.
func (s *Store) CloseSession(ctx context.Context, id string, at time.Time) (belay.Session, error) {
	return s.changeSession(ctx, "close session "+id, id, func(cur belay.Session) (belay.Session, bool, error) {
		next, changed := cur.Close(at)
		return next, changed, nil
	})
}

// changeSession reads the session, applies change and, when it changed
// something, writes it back, all in one write transaction.
func (s *Store) changeSession(ctx context.Context, op, id string, change func(belay.Session) (belay.Session, bool, error)) (belay.Session, error) {
	var out belay.Session
	err := s.update(ctx, func(tx *sql.Tx) error {
		cur, err := loadSession(ctx, tx, id)
		if err != nil {
			return err
		}
		next, changed, err := change(cur)
		if err != nil {
			return err
		}
		if !changed {
			out = cur
			return nil
		}
		if err := belay.CheckSession(next); err != nil {
			return err
		}
		next.Version = cur.Version + 1
		doc, err := encodeSession(next)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE sessions SET doc = ?, version = ? WHERE id = ? AND version = ?",
			doc, next.Version, id, cur.Version); err != nil {
			return fmt.Errorf("update session: %w", err)
		}
		out = next
		return nil
	})
	if err != nil {
		return belay.Session{}, wrap(op, err)
	}
	return out, nil
}

func loadSession(ctx context.Context, q querier, id string) (belay.Session, error) {
	var doc string
	var version int64
	err := q.QueryRowContext(ctx, "SELECT doc, version FROM sessions WHERE id = ?", id).Scan(&doc, &version)
	if errors.Is(err, sql.ErrNoRows) {
		return belay.Session{}, belay.Errorf(belay.CodeNotFound, "session %s not found", id)
	}
	if err != nil {
		return belay.Session{}, fmt.Errorf("read session: %w", err)
	}
	var sess belay.Session
	if err := json.Unmarshal([]byte(doc), &sess); err != nil {
		return belay.Session{}, fmt.Errorf("decode session: %w", err)
	}
	sess.Version = version
	return sess, nil
}

func encodeSession(sess belay.Session) (string, error) {
	sess.CreatedAt, sess.UpdatedAt = sess.CreatedAt.UTC(), sess.UpdatedAt.UTC()
	if !sess.ClosedAt.IsZero() {
		sess.ClosedAt = sess.ClosedAt.UTC()
	}
	for i := range sess.Turns {
		t := &sess.Turns[i]
		t.CreatedAt = t.CreatedAt.UTC()
		if !t.FinishedAt.IsZero() {
			t.FinishedAt = t.FinishedAt.UTC()
		}
	}
	b, err := json.Marshal(sess)
	if err != nil {
		return "", fmt.Errorf("encode session: %w", err)
	}
	return string(b), nil
}

// PutConnection stores c, replacing a connection with its id.
func (s *Store) PutConnection(ctx context.Context, c belay.Connection) error {
	if err := belay.CheckConnection(c); err != nil {
		return err
	}
	err := s.update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO session_connections (id, session_id, connected_at, sent) VALUES (?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET session_id = excluded.session_id, connected_at = excluded.connected_at, sent = excluded.sent`,
			c.ID, c.SessionID, c.ConnectedAt.UnixNano(), c.Sent)
		return err
	})
	return wrap("put connection "+c.ID, err)
}

// GetConnection returns one connection. Returns not_found.
func (s *Store) GetConnection(ctx context.Context, id string) (belay.Connection, error) {
	c := belay.Connection{ID: id}
	var at int64
	err := s.reader.QueryRowContext(ctx, "SELECT session_id, connected_at, sent FROM session_connections WHERE id = ?", id).
		Scan(&c.SessionID, &at, &c.Sent)
	if errors.Is(err, sql.ErrNoRows) {
		return belay.Connection{}, belay.Errorf(belay.CodeNotFound, "connection %s not found", id)
	}
	if err != nil {
		return belay.Connection{}, wrap("get connection "+id, err)
	}
	c.ConnectedAt = time.Unix(0, at).UTC()
	return c, nil
}

// DeleteConnection removes the connection; a missing one is fine.
func (s *Store) DeleteConnection(ctx context.Context, id string) error {
	err := s.update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM session_connections WHERE id = ?", id)
		return err
	})
	return wrap("delete connection "+id, err)
}

// SessionConnections returns the session's connections, oldest first.
func (s *Store) SessionConnections(ctx context.Context, sessionID string) ([]belay.Connection, error) {
	rows, err := s.reader.QueryContext(ctx, "SELECT id, connected_at, sent FROM session_connections WHERE session_id = ? ORDER BY connected_at, id", sessionID)
	if err != nil {
		return nil, wrap("list connections of "+sessionID, err)
	}
	defer rows.Close()
	out := []belay.Connection{}
	for rows.Next() {
		c := belay.Connection{SessionID: sessionID}
		var at int64
		if err := rows.Scan(&c.ID, &at, &c.Sent); err != nil {
			return nil, wrap("list connections of "+sessionID, err)
		}
		c.ConnectedAt = time.Unix(0, at).UTC()
		out = append(out, c)
	}
	return out, wrap("list connections of "+sessionID, rows.Err())
}

// AdvanceConnection moves sent from `from` to `to` in one conditional
// update.
func (s *Store) AdvanceConnection(ctx context.Context, id string, from, to int64) (bool, error) {
	var moved bool
	err := s.update(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE session_connections SET sent = ? WHERE id = ? AND sent = ?", to, id, from)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		moved = n == 1
		return nil
	})
	return moved, wrap("advance connection "+id, err)
}
