package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// CreateClaim stores c, unused. Returns invalid for a claim
// belay.CheckClaim refuses; not_found if the run does not exist; conflict
// if a claim with the same code hash exists.
func (s *Store) CreateClaim(ctx context.Context, c belay.Claim) error {
	if err := belay.CheckClaim(c); err != nil {
		return err
	}
	if err := checkTimes("expiresAt", c.ExpiresAt); err != nil {
		return err
	}
	err := s.update(ctx, func(tx *sql.Tx) error {
		if _, err := loadRunStatus(ctx, tx, c.RunID); err != nil {
			return err
		}
		var exists int
		switch err := tx.QueryRowContext(ctx, "SELECT 1 FROM claims WHERE code_hash = ?", c.CodeHash[:]).Scan(&exists); {
		case err == nil:
			return belay.Errorf(belay.CodeConflict, "a claim with this code already exists")
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("look up claim: %w", err)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO claims (code_hash, run_id, attempt, expires_at) VALUES (?, ?, ?, ?)",
			c.CodeHash[:], c.RunID, c.Attempt, nanos(c.ExpiresAt))
		if err != nil {
			return fmt.Errorf("insert claim: %w", err)
		}
		return nil
	})
	return wrap("create claim for run "+c.RunID, err)
}

// ConsumeClaim marks the claim used in one transaction, after checking,
// in the port's order, that it exists, is for runID (when given), unused,
// unexpired, and that its run is running at the claim's attempt. A refusal
// is a *belay.ClaimError and writes nothing.
func (s *Store) ConsumeClaim(ctx context.Context, codeHash [32]byte, runID string, now time.Time) (belay.Claim, error) {
	if err := checkTimes("now", now); err != nil {
		return belay.Claim{}, err
	}
	var c belay.Claim
	err := s.update(ctx, func(tx *sql.Tx) error {
		var (
			expires sql.NullInt64
			used    sql.NullInt64
		)
		err := tx.QueryRowContext(ctx, "SELECT run_id, attempt, expires_at, used_at FROM claims WHERE code_hash = ?", codeHash[:]).
			Scan(&c.RunID, &c.Attempt, &expires, &used)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return belay.RefuseClaim(belay.ClaimUnknown)
		case err != nil:
			return fmt.Errorf("read claim: %w", err)
		}
		c.CodeHash, c.ExpiresAt = codeHash, fromNanos(expires)
		var (
			status  string
			attempt int
		)
		if err := tx.QueryRowContext(ctx, "SELECT status, attempt FROM runs WHERE id = ?", c.RunID).Scan(&status, &attempt); err != nil {
			// The claim's foreign key keeps its run.
			return fmt.Errorf("read run of claim: %w", err)
		}
		switch {
		case runID != "" && runID != c.RunID:
			return belay.RefuseClaim(belay.ClaimWrongRun)
		case used.Valid:
			return belay.RefuseClaim(belay.ClaimUsed)
		case !now.Before(c.ExpiresAt):
			return belay.RefuseClaim(belay.ClaimExpired)
		case belay.RunStatus(status) != belay.StatusRunning:
			return belay.RefuseClaim(belay.ClaimRunNotRunning)
		case attempt != c.Attempt:
			return belay.RefuseClaim(belay.ClaimWrongAttempt)
		}
		res, err := tx.ExecContext(ctx, "UPDATE claims SET used_at = ? WHERE code_hash = ? AND used_at IS NULL", now.UnixNano(), codeHash[:])
		if err != nil {
			return fmt.Errorf("use claim: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("use claim: %w", err)
		} else if n != 1 {
			return belay.RefuseClaim(belay.ClaimUsed)
		}
		return nil
	})
	if err != nil {
		return belay.Claim{}, wrap("consume claim", err)
	}
	return c, nil
}

// RecordSandboxRef stores ref as the sandbox of the run's attempt. Returns
// invalid for a bad ref; not_found if the run does not exist; conflict if
// it is terminal or at another attempt.
func (s *Store) RecordSandboxRef(ctx context.Context, runID string, attempt int, ref string) error {
	if err := belay.CheckSandboxRef(ref); err != nil {
		return err
	}
	err := s.update(ctx, func(tx *sql.Tx) error {
		var (
			status  string
			current int
		)
		err := tx.QueryRowContext(ctx, "SELECT status, attempt FROM runs WHERE id = ?", runID).Scan(&status, &current)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		case err != nil:
			return fmt.Errorf("read run: %w", err)
		case belay.RunStatus(status).Terminal():
			return belay.Errorf(belay.CodeConflict, "run %s is already %s", runID, status)
		case current != attempt:
			return belay.Errorf(belay.CodeConflict, "run %s is at attempt %d, not %d", runID, current, attempt)
		}
		_, err = tx.ExecContext(ctx, "UPDATE runs SET sandbox_ref = ? WHERE id = ?", ref, runID)
		return err
	})
	return wrap("record sandbox of run "+runID, err)
}
