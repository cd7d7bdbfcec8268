package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// modelCallStmts are the statements of a proxied model call's two writes,
// prepared once on the writer connection: they are the model proxy's hot
// path, next to the spend itself.
type modelCallStmts struct {
	advance *sql.Stmt // advance a live run's last_seq by one; returns it
	usage   *sql.Stmt // add usage, and advance last_seq if the run is live; returns status, last_seq
	insert  *sql.Stmt // insert one event
	trim    *sql.Stmt // remove a run's events up to a seq
}

// terminalSQL lists the terminal statuses for an IN clause.
var terminalSQL = func() string {
	var q []string
	for _, s := range []belay.RunStatus{belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled} {
		if !s.Terminal() {
			panic("sqlite: " + string(s) + " is not terminal")
		}
		q = append(q, "'"+string(s)+"'")
	}
	return "(" + strings.Join(q, ", ") + ")"
}()

var (
	advanceSQL = `UPDATE runs SET last_seq = last_seq + 1 WHERE id = ? AND status NOT IN ` + terminalSQL + ` RETURNING last_seq`
	usageSQL   = `UPDATE runs SET model_requests = model_requests + ?, prompt_tokens = prompt_tokens + ?,
		completion_tokens = completion_tokens + ?, last_seq = last_seq + (status NOT IN ` + terminalSQL + `)
		WHERE id = ? RETURNING status, last_seq`
	insertEventSQL = `INSERT INTO events (run_id, seq, time, type, source, data) VALUES (?, ?, ?, ?, '` + belay.SourceControl + `', ?)`
	trimEventsSQL  = `DELETE FROM events WHERE run_id = ? AND seq <= ?`
)

func prepareModelCalls(ctx context.Context, db *sql.DB) (modelCallStmts, error) {
	var m modelCallStmts
	for _, p := range []struct {
		into **sql.Stmt
		sql  string
	}{{&m.advance, advanceSQL}, {&m.usage, usageSQL}, {&m.insert, insertEventSQL}, {&m.trim, trimEventsSQL}} {
		st, err := db.PrepareContext(ctx, p.sql)
		if err != nil {
			m.close()
			return modelCallStmts{}, err
		}
		*p.into = st
	}
	return m, nil
}

func (m modelCallStmts) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{m.advance, m.usage, m.insert, m.trim} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// errUndo rolls a write transaction back whose outcome is already decided
// (a refusal found after a change was made).
var errUndo = errors.New("undo")

// SpendModelRequest spends one request and appends its model.request
// event in one transaction: the conditional spend, then the run's
// last_seq advanced only while the run is live, then the event. A run that
// has ended (its capability not yet revoked) or is gone rolls the spend
// back and is inactive.
func (s *Store) SpendModelRequest(ctx context.Context, runID string, call belay.ModelCall, now time.Time) (belay.ConsumeResult, error) {
	if err := checkTimes("now", now); err != nil {
		return belay.ConsumeResult{}, err
	}
	var res belay.ConsumeResult
	err := s.update(ctx, func(tx *sql.Tx) error {
		var remaining int
		err := tx.StmtContext(ctx, s.spend).QueryRowContext(ctx, runID, call.Model, now.UnixNano()).Scan(&remaining)
		if errors.Is(err, sql.ErrNoRows) {
			res, err = refusal(ctx, tx, runID, call.Model, now)
			return err
		}
		if err != nil {
			return fmt.Errorf("spend request: %w", err)
		}
		var seq int64
		err = tx.StmtContext(ctx, s.calls.advance).QueryRowContext(ctx, runID).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			res = belay.ConsumeResult{Outcome: belay.ConsumeInactive}
			return errUndo
		}
		if err != nil {
			return fmt.Errorf("advance log: %w", err)
		}
		res = belay.ConsumeResult{Outcome: belay.ConsumeOK, Remaining: remaining}
		return s.appendAt(ctx, tx, runID, seq, belay.ModelRequestEvent(now, call, remaining))
	})
	if err != nil && !errors.Is(err, errUndo) {
		return belay.ConsumeResult{}, wrap("spend model request of run "+runID, err)
	}
	return res, nil
}

// RecordModelResponse adds the usage and appends the model.response event
// in one transaction; one statement adds the usage and advances last_seq
// if the run is still live, and says which.
func (s *Store) RecordModelResponse(ctx context.Context, runID string, d belay.UsageDelta, response belay.EventInput) (bool, error) {
	if err := checkEvents([]belay.EventInput{response}); err != nil {
		return false, err
	}
	appended := false
	err := s.update(ctx, func(tx *sql.Tx) error {
		var (
			status string
			seq    int64
		)
		err := tx.StmtContext(ctx, s.calls.usage).QueryRowContext(ctx, d.ModelRequests, d.PromptTokens, d.CompletionTokens, runID).Scan(&status, &seq)
		if errors.Is(err, sql.ErrNoRows) {
			return belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		}
		if err != nil {
			return fmt.Errorf("record usage: %w", err)
		}
		if belay.RunStatus(status).Terminal() {
			return nil
		}
		appended = true
		return s.appendAt(ctx, tx, runID, seq, response)
	})
	if err != nil {
		return false, wrap("record model response of run "+runID, err)
	}
	return appended, nil
}

// appendAt writes e as the run's event seq (last_seq is already seq) and
// drops what falls out of the buffer, as appendLocked does.
func (s *Store) appendAt(ctx context.Context, tx *sql.Tx, runID string, seq int64, e belay.EventInput) error {
	var data []byte
	if len(e.Data) > 0 {
		data = e.Data
	}
	if _, err := tx.StmtContext(ctx, s.calls.insert).ExecContext(ctx, runID, seq, nanos(e.Time), e.Type, data); err != nil {
		return fmt.Errorf("append event %d: %w", seq, err)
	}
	if drop := seq - int64(s.bufferSize); drop > 0 {
		if _, err := tx.StmtContext(ctx, s.calls.trim).ExecContext(ctx, runID, drop); err != nil {
			return fmt.Errorf("trim events: %w", err)
		}
	}
	return nil
}

// refusal says why a spend changed nothing, in the order a caller's answer
// depends on: inactive (missing, revoked, other model), then expired, then
// exhausted.
func refusal(ctx context.Context, q querier, runID, model string, now time.Time) (belay.ConsumeResult, error) {
	c, err := loadCapability(ctx, q, runID)
	switch {
	case belay.IsCode(err, belay.CodeNotFound):
		return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
	case err != nil:
		return belay.ConsumeResult{}, err
	case c.State != belay.CapabilityActive || c.Model != model:
		return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
	case !now.Before(c.ExpiresAt):
		return belay.ConsumeResult{Outcome: belay.ConsumeExpired, Remaining: max(c.MaxRequests-c.UsedRequests, 0)}, nil
	default:
		return belay.ConsumeResult{Outcome: belay.ConsumeExhausted}, nil
	}
}
