package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// ActivateCapability stores c as the run's active capability with nothing
// spent. Returns invalid for a capability belay.CheckCapability refuses;
// not_found if the run does not exist; conflict if the run already has a
// capability, active or revoked.
func (s *Store) ActivateCapability(ctx context.Context, c belay.Capability) error {
	if err := belay.CheckCapability(c); err != nil {
		return err
	}
	if err := checkTimes("expiresAt", c.ExpiresAt); err != nil {
		return err
	}
	err := s.update(ctx, func(tx *sql.Tx) error {
		if _, err := loadRunStatus(ctx, tx, c.RunID); err != nil {
			return err
		}
		var state string
		switch err := tx.QueryRowContext(ctx, "SELECT state FROM capabilities WHERE run_id = ?", c.RunID).Scan(&state); {
		case err == nil:
			return belay.Errorf(belay.CodeConflict, "run %s already has a capability (%s)", c.RunID, state)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("read capability: %w", err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO capabilities (run_id, model, state, expires_at, max_requests, used_requests)
			VALUES (?, ?, ?, ?, ?, 0)`, c.RunID, c.Model, string(belay.CapabilityActive), nanos(c.ExpiresAt), c.MaxRequests)
		if err != nil {
			return fmt.Errorf("insert capability: %w", err)
		}
		return nil
	})
	return wrap("activate capability of run "+c.RunID, err)
}

// ConsumeModelRequest spends one request of the run's capability. Like
// the DynamoDB adapter's conditional update, it first tries the spend under
// every condition at once (active, same model, not expired, budget left),
// and only when that changes nothing reads the capability to say why, in
// the order a caller's answer depends on: inactive (missing, revoked,
// other model), then expired, then exhausted. Only ok spends.
func (s *Store) ConsumeModelRequest(ctx context.Context, runID, model string, now time.Time) (belay.ConsumeResult, error) {
	if err := checkTimes("now", now); err != nil {
		return belay.ConsumeResult{}, err
	}
	var res belay.ConsumeResult
	err := s.update(ctx, func(tx *sql.Tx) error {
		var remaining int
		err := tx.StmtContext(ctx, s.spend).QueryRowContext(ctx, runID, model, now.UnixNano()).Scan(&remaining)
		if err == nil {
			res = belay.ConsumeResult{Outcome: belay.ConsumeOK, Remaining: remaining}
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("spend request: %w", err)
		}
		res, err = refusal(ctx, tx, runID, model, now)
		return err
	})
	if err != nil {
		return belay.ConsumeResult{}, wrap("consume model request of run "+runID, err)
	}
	return res, nil
}

// spendSQL spends one request when every condition of an ok consume holds,
// and returns what is left; otherwise it changes nothing and returns no
// row.
const spendSQL = `UPDATE capabilities SET used_requests = used_requests + 1
	WHERE run_id = ? AND state = 'active' AND model = ? AND expires_at > ? AND used_requests < max_requests
	RETURNING max_requests - used_requests`

// RevokeCapability ends the run's capability for good. It is idempotent
// and succeeds when the run has none.
func (s *Store) RevokeCapability(ctx context.Context, runID string) error {
	err := s.update(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE capabilities SET state = ? WHERE run_id = ?", string(belay.CapabilityRevoked), runID)
		return err
	})
	return wrap("revoke capability of run "+runID, err)
}

// GetCapability returns the run's capability. Returns not_found if it has
// none.
func (s *Store) GetCapability(ctx context.Context, runID string) (belay.Capability, error) {
	c, err := loadCapability(ctx, s.reader, runID)
	return c, wrap("get capability of run "+runID, err)
}

// loadCapability reads the run's capability. Returns not_found if it has
// none.
func loadCapability(ctx context.Context, q querier, runID string) (belay.Capability, error) {
	var (
		c       belay.Capability
		state   string
		expires sql.NullInt64
	)
	err := q.QueryRowContext(ctx, "SELECT run_id, model, state, expires_at, max_requests, used_requests FROM capabilities WHERE run_id = ?", runID).
		Scan(&c.RunID, &c.Model, &state, &expires, &c.MaxRequests, &c.UsedRequests)
	if errors.Is(err, sql.ErrNoRows) {
		return belay.Capability{}, belay.Errorf(belay.CodeNotFound, "run %s has no capability", runID)
	}
	if err != nil {
		return belay.Capability{}, fmt.Errorf("read capability: %w", err)
	}
	c.State = belay.CapabilityState(state)
	c.ExpiresAt = fromNanos(expires)
	return c, nil
}

// loadRunStatus returns the run's status. Returns not_found if the run
// does not exist.
func loadRunStatus(ctx context.Context, q querier, runID string) (belay.RunStatus, error) {
	var status string
	err := q.QueryRowContext(ctx, "SELECT status FROM runs WHERE id = ?", runID).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return "", belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
	}
	if err != nil {
		return "", fmt.Errorf("read run: %w", err)
	}
	return belay.RunStatus(status), nil
}
