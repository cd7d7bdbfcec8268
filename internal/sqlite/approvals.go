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

// approvalColumns are the columns scanApproval reads, in its order.
const approvalColumns = "run_id, id, tool, arguments, status, decision, reason, decided_by, requested_at, expires_at, decided_at"

func scanApproval(sc scanner) (belay.Approval, error) {
	var (
		a                           belay.Approval
		args                        []byte
		status, decision            string
		requested, expires, decided sql.NullInt64
	)
	if err := sc.Scan(&a.RunID, &a.ID, &a.Tool, &args, &status, &decision, &a.Reason, &a.DecidedBy, &requested, &expires, &decided); err != nil {
		return belay.Approval{}, err
	}
	if len(args) > 0 {
		a.Arguments = json.RawMessage(args)
	}
	a.Status, a.Decision = belay.ApprovalStatus(status), belay.Decision(decision)
	a.RequestedAt, a.ExpiresAt, a.DecidedAt = fromNanos(requested), fromNanos(expires), fromNanos(decided)
	return a, nil
}

// loadApproval reads one approval. Returns not_found if it does not exist.
func loadApproval(ctx context.Context, q querier, runID, id string) (belay.Approval, error) {
	a, err := scanApproval(q.QueryRowContext(ctx, "SELECT "+approvalColumns+" FROM approvals WHERE run_id = ? AND id = ?", runID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return belay.Approval{}, belay.Errorf(belay.CodeNotFound, "approval %s of run %s not found", id, runID)
	}
	if err != nil {
		return belay.Approval{}, fmt.Errorf("read approval %s: %w", id, err)
	}
	return a, nil
}

// CreateApproval stores a and appends approval.requested, and
// approval.decided when a is already decided. Returns invalid for an
// approval belay.CheckApproval refuses or with a time the store cannot
// hold; not_found if the run does not exist; conflict if it is terminal or
// the approval id exists.
func (s *Store) CreateApproval(ctx context.Context, a belay.Approval) (belay.Approval, error) {
	if err := belay.CheckApproval(a); err != nil {
		return belay.Approval{}, err
	}
	if err := checkTimes("approval", a.RequestedAt, a.ExpiresAt, a.DecidedAt); err != nil {
		return belay.Approval{}, err
	}
	requested, err := belay.ApprovalRequestedEvent(a)
	if err != nil {
		return belay.Approval{}, wrap(fmt.Sprintf("create approval %s of run %s", a.ID, a.RunID), err)
	}
	events := []belay.EventInput{requested}
	if a.Status == belay.ApprovalDecided {
		events = append(events, belay.ApprovalDecidedEvent(a))
	}
	err = s.update(ctx, func(tx *sql.Tx) error {
		r, err := loadRunState(ctx, tx, a.RunID)
		if err != nil {
			return err
		}
		if r.Status.Terminal() {
			return belay.Errorf(belay.CodeConflict, "run %s is %s; it takes no approvals", a.RunID, r.Status)
		}
		if _, err := loadApproval(ctx, tx, a.RunID, a.ID); err == nil {
			return belay.Errorf(belay.CodeConflict, "approval %s of run %s already exists", a.ID, a.RunID)
		} else if !belay.IsCode(err, belay.CodeNotFound) {
			return err
		}
		appended, err := s.appendLocked(ctx, tx, &r, events, belay.SourceControl)
		if err != nil {
			return err
		}
		var args []byte
		if len(a.Arguments) > 0 {
			args = a.Arguments
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO approvals (position, "+approvalColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			appended[0].Seq, a.RunID, a.ID, a.Tool, args, string(a.Status), string(a.Decision), a.Reason, a.DecidedBy,
			nanos(a.RequestedAt), nanos(a.ExpiresAt), nanos(a.DecidedAt)); err != nil {
			return fmt.Errorf("insert approval: %w", err)
		}
		_, err = tx.ExecContext(ctx, "UPDATE runs SET last_seq = ? WHERE id = ?", r.LastSeq, r.ID)
		return err
	})
	if err != nil {
		return belay.Approval{}, wrap(fmt.Sprintf("create approval %s of run %s", a.ID, a.RunID), err)
	}
	return a, nil
}

// GetApproval returns one approval. Returns not_found if it does not exist.
func (s *Store) GetApproval(ctx context.Context, runID, id string) (belay.Approval, error) {
	a, err := loadApproval(ctx, s.reader, runID, id)
	return a, wrap(fmt.Sprintf("get approval %s of run %s", id, runID), err)
}

// ListApprovals returns a run's approvals oldest first (by request time,
// then by the order they were stored). Returns not_found if the run does
// not exist.
func (s *Store) ListApprovals(ctx context.Context, runID string) ([]belay.Approval, error) {
	out := []belay.Approval{}
	err := s.view(ctx, func(tx *sql.Tx) error {
		if _, err := loadRunStatus(ctx, tx, runID); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT "+approvalColumns+" FROM approvals WHERE run_id = ? ORDER BY requested_at, position", runID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			a, err := scanApproval(rows)
			if err != nil {
				return err
			}
			out = append(out, a)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, wrap("list approvals of run "+runID, err)
	}
	return out, nil
}

// DecideApproval records the decision of a pending approval and appends
// approval.decided. Returns invalid for an unknown decision; not_found if
// the run or approval does not exist; conflict if it is already decided or
// the run is terminal (its log has ended).
func (s *Store) DecideApproval(ctx context.Context, runID, id string, d belay.Decision, reason, by string, at time.Time) (belay.Approval, error) {
	if !d.Valid() {
		return belay.Approval{}, belay.FieldErrorf(belay.CodeInvalid, "decision", "unknown decision %q", d)
	}
	if err := checkTimes("at", at); err != nil {
		return belay.Approval{}, err
	}
	var a belay.Approval
	err := s.update(ctx, func(tx *sql.Tx) error {
		r, err := loadRunState(ctx, tx, runID)
		if err != nil {
			return err
		}
		if a, err = loadApproval(ctx, tx, runID, id); err != nil {
			return err
		}
		if a.Status == belay.ApprovalDecided {
			return belay.Errorf(belay.CodeConflict, "approval %s is already decided (%s)", id, a.Decision)
		}
		if r.Status.Terminal() {
			return belay.Errorf(belay.CodeConflict, "run %s is %s; its approvals are closed", runID, r.Status)
		}
		a.Status, a.Decision, a.Reason, a.DecidedBy, a.DecidedAt = belay.ApprovalDecided, d, reason, by, at
		if _, err := s.appendLocked(ctx, tx, &r, []belay.EventInput{belay.ApprovalDecidedEvent(a)}, belay.SourceControl); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE approvals SET status = ?, decision = ?, reason = ?, decided_by = ?, decided_at = ? WHERE run_id = ? AND id = ?",
			string(a.Status), string(a.Decision), a.Reason, a.DecidedBy, nanos(a.DecidedAt), runID, id); err != nil {
			return fmt.Errorf("update approval: %w", err)
		}
		_, err = tx.ExecContext(ctx, "UPDATE runs SET last_seq = ? WHERE id = ?", r.LastSeq, r.ID)
		return err
	})
	if err != nil {
		return belay.Approval{}, wrap(fmt.Sprintf("decide approval %s of run %s", id, runID), err)
	}
	return a, nil
}
