package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// runStateColumns are the columns of a run's row, which scanRun reads in
// this order: everything but the request, which is kept apart
// (run_requests) so that the writes of every event and model call rewrite
// a row whose size does not depend on the upload.
const runStateColumns = `id, status, request_hash, created_at, updated_at, started_at, finished_at,
	cancel_requested, reason, exit_code, model_requests, max_requests, prompt_tokens, completion_tokens,
	checks, changed_files, artifacts, last_seq, attempt, sandbox_ref, sandbox_events, sandbox_event_bytes,
	checkpoint, lost_attempts`

// runColumns are runStateColumns and then the request, from run_requests.
const runColumns = runStateColumns + `, (SELECT request FROM run_requests WHERE run_id = runs.id)`

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanRun reads one row of runColumns, or of runStateColumns when
// withRequest is false (the run's Request is then left zero).
func scanRun(sc scanner, withRequest bool) (belay.Run, error) {
	var (
		r                                      belay.Run
		request                                string
		created, updated, started, finished    sql.NullInt64
		exitCode                               sql.NullInt64
		checks, changedFiles, artifacts        sql.NullString
		checkpoint, lostAttempts               sql.NullString
		status                                 string
		modelRequests, maxRequests             int
		promptTokens, completionTokens, lastSq int64
	)
	dest := []any{&r.ID, &status, &r.RequestHash, &created, &updated, &started, &finished,
		&r.CancelRequested, &r.Reason, &exitCode, &modelRequests, &maxRequests, &promptTokens, &completionTokens,
		&checks, &changedFiles, &artifacts, &lastSq, &r.Attempt, &r.SandboxRef, &r.SandboxEvents, &r.SandboxEventBytes,
		&checkpoint, &lostAttempts}
	if withRequest {
		dest = append(dest, &request)
	}
	if err := sc.Scan(dest...); err != nil {
		return belay.Run{}, err
	}
	r.Status = belay.RunStatus(status)
	r.CreatedAt, r.UpdatedAt = fromNanos(created), fromNanos(updated)
	r.StartedAt, r.FinishedAt = fromNanos(started), fromNanos(finished)
	if exitCode.Valid {
		c := int(exitCode.Int64)
		r.ExitCode = &c
	}
	r.Usage = belay.Usage{ModelRequests: modelRequests, MaxRequests: maxRequests, PromptTokens: promptTokens, CompletionTokens: completionTokens}
	r.LastSeq = lastSq
	if withRequest {
		if err := json.Unmarshal([]byte(request), &r.Request); err != nil {
			return belay.Run{}, fmt.Errorf("decode request of run %s: %w", r.ID, err)
		}
	}
	for _, f := range []struct {
		col  sql.NullString
		into any
	}{{checks, &r.Checks}, {changedFiles, &r.ChangedFiles}, {artifacts, &r.Artifacts}, {checkpoint, &r.Checkpoint}, {lostAttempts, &r.LostAttempts}} {
		if f.col.Valid {
			if err := json.Unmarshal([]byte(f.col.String), f.into); err != nil {
				return belay.Run{}, fmt.Errorf("decode outcome of run %s: %w", r.ID, err)
			}
		}
	}
	return r, nil
}

// jsonColumn encodes v for a nullable JSON column: NULL when the list is
// empty.
func jsonColumn[T any](v []T) (sql.NullString, error) {
	if len(v) == 0 {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return sql.NullString{}, err
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// loadRun reads the run inside tx. Returns not_found if it does not exist.
func loadRun(ctx context.Context, q querier, id string) (belay.Run, error) {
	return readRun(ctx, q, id, true)
}

// loadRunState is loadRun without the request (Request is left zero), for
// the writes that only need the run's state: saveRun never writes the
// request, so what it loaded can be saved back.
func loadRunState(ctx context.Context, q querier, id string) (belay.Run, error) {
	return readRun(ctx, q, id, false)
}

func readRun(ctx context.Context, q querier, id string, withRequest bool) (belay.Run, error) {
	cols := runStateColumns
	if withRequest {
		cols = runColumns
	}
	r, err := scanRun(q.QueryRowContext(ctx, "SELECT "+cols+" FROM runs WHERE id = ?", id), withRequest)
	if errors.Is(err, sql.ErrNoRows) {
		return belay.Run{}, belay.Errorf(belay.CodeNotFound, "run %s not found", id)
	}
	if err != nil {
		return belay.Run{}, fmt.Errorf("read run %s: %w", id, err)
	}
	return r, nil
}

// saveRun writes every mutable field of r back to its row.
func saveRun(ctx context.Context, tx *sql.Tx, r belay.Run) error {
	checks, err := jsonColumn(r.Checks)
	if err != nil {
		return err
	}
	changed, err := jsonColumn(r.ChangedFiles)
	if err != nil {
		return err
	}
	artifacts, err := jsonColumn(r.Artifacts)
	if err != nil {
		return err
	}
	lost, err := jsonColumn(r.LostAttempts)
	if err != nil {
		return err
	}
	var checkpoint sql.NullString
	if r.Checkpoint != nil {
		b, err := json.Marshal(r.Checkpoint)
		if err != nil {
			return err
		}
		checkpoint = sql.NullString{String: string(b), Valid: true}
	}
	var exitCode sql.NullInt64
	if r.ExitCode != nil {
		exitCode = sql.NullInt64{Int64: int64(*r.ExitCode), Valid: true}
	}
	_, err = tx.ExecContext(ctx, `UPDATE runs SET
		status = ?, updated_at = ?, started_at = ?, finished_at = ?, cancel_requested = ?, reason = ?, exit_code = ?,
		model_requests = ?, max_requests = ?, prompt_tokens = ?, completion_tokens = ?,
		checks = ?, changed_files = ?, artifacts = ?, last_seq = ?, attempt = ?, sandbox_ref = ?,
		sandbox_events = ?, sandbox_event_bytes = ?, checkpoint = ?, lost_attempts = ?
		WHERE id = ?`,
		string(r.Status), nanos(r.UpdatedAt), nanos(r.StartedAt), nanos(r.FinishedAt), r.CancelRequested, r.Reason, exitCode,
		r.Usage.ModelRequests, r.Usage.MaxRequests, r.Usage.PromptTokens, r.Usage.CompletionTokens,
		checks, changed, artifacts, r.LastSeq, r.Attempt, r.SandboxRef, r.SandboxEvents, r.SandboxEventBytes, checkpoint, lost, r.ID)
	if err != nil {
		return fmt.Errorf("write run %s: %w", r.ID, err)
	}
	return nil
}

// CreateRun stores a queued run and its run.queued event, or with a known
// idempotency key returns the earlier run. Returns invalid for a run
// belay.PrepareNewRun refuses or with a time the store cannot hold;
// conflict if the key was used with another request hash or the run id
// exists.
func (s *Store) CreateRun(ctx context.Context, run belay.Run, idempotencyKey string) (belay.Run, bool, error) {
	stored, err := belay.PrepareNewRun(run)
	if err != nil {
		return belay.Run{}, false, err
	}
	if err := checkTimes("createdAt", stored.CreatedAt, stored.UpdatedAt); err != nil {
		return belay.Run{}, false, err
	}
	request, err := json.Marshal(stored.Request)
	if err != nil {
		return belay.Run{}, false, wrap("create run "+run.ID, fmt.Errorf("encode request: %w", err))
	}
	key := sql.NullString{String: idempotencyKey, Valid: idempotencyKey != ""}
	created := false
	err = s.update(ctx, func(tx *sql.Tx) error {
		if key.Valid {
			var earlierID, earlierHash string
			err := tx.QueryRowContext(ctx, "SELECT id, request_hash FROM runs WHERE idempotency_key = ?", key).Scan(&earlierID, &earlierHash)
			switch {
			case err == nil && earlierHash == run.RequestHash:
				stored, err = loadRun(ctx, tx, earlierID)
				return err
			case err == nil:
				return belay.FieldErrorf(belay.CodeConflict, "Idempotency-Key", "was used for run %s with a different request", earlierID)
			case !errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("look up idempotency key: %w", err)
			}
		}
		var exists int
		switch err := tx.QueryRowContext(ctx, "SELECT 1 FROM runs WHERE id = ?", run.ID).Scan(&exists); {
		case err == nil:
			return belay.Errorf(belay.CodeConflict, "run %s already exists", run.ID)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("look up run id: %w", err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO runs
			(id, status, request_hash, idempotency_key, created_at, updated_at, max_requests, model_requests, prompt_tokens, completion_tokens)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			stored.ID, string(stored.Status), stored.RequestHash, key, nanos(stored.CreatedAt), nanos(stored.UpdatedAt),
			stored.Usage.MaxRequests, stored.Usage.ModelRequests, stored.Usage.PromptTokens, stored.Usage.CompletionTokens)
		if err != nil {
			return fmt.Errorf("insert run: %w", err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO run_requests (run_id, request) VALUES (?, ?)", stored.ID, string(request)); err != nil {
			return fmt.Errorf("insert run request: %w", err)
		}
		if _, err := s.appendLocked(ctx, tx, &stored, []belay.EventInput{belay.RunQueuedEvent(stored)}, belay.SourceControl); err != nil {
			return err
		}
		created = true
		return saveRun(ctx, tx, stored)
	})
	if err != nil {
		return belay.Run{}, false, wrap("create run "+run.ID, err)
	}
	return stored, created, nil
}

// GetRun returns the run. Returns not_found if it does not exist.
func (s *Store) GetRun(ctx context.Context, id string) (belay.Run, error) {
	r, err := loadRun(ctx, s.reader, id)
	return r, wrap("get run "+id, err)
}

// The page sizes of ListRuns: a zero Limit means defaultRunPage, and no
// page is larger than maxRunPage.
const (
	defaultRunPage = 50
	maxRunPage     = 200
)

// runCursor is the position after the last run of a page. It goes out as
// base64url JSON: opaque to callers, but checked when it comes back.
type runCursor struct {
	CreatedAt int64  `json:"t"`
	ID        string `json:"id"`
}

func encodeCursor(r belay.Run) string {
	b, _ := json.Marshal(runCursor{CreatedAt: r.CreatedAt.UnixNano(), ID: r.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (runCursor, error) {
	bad := belay.FieldErrorf(belay.CodeInvalid, "cursor", "is not a cursor this server issued")
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return runCursor{}, bad
	}
	var c runCursor
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.ID == "" || dec.More() {
		return runCursor{}, bad
	}
	return c, nil
}

// ListRuns returns runs newest first (ties by id, descending). Returns
// invalid for an unknown status or a cursor it did not issue.
func (s *Store) ListRuns(ctx context.Context, q belay.ListRunsQuery) (belay.RunPage, error) {
	if q.Status != "" && !q.Status.Valid() {
		return belay.RunPage{}, belay.FieldErrorf(belay.CodeInvalid, "status", "unknown status %q", q.Status)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = defaultRunPage
	}
	limit = min(limit, maxRunPage)
	where, args := "1", []any{}
	if q.Status != "" {
		where += " AND status = ?"
		args = append(args, string(q.Status))
	}
	if q.Cursor != "" {
		c, err := decodeCursor(q.Cursor)
		if err != nil {
			return belay.RunPage{}, err
		}
		where += " AND (created_at < ? OR (created_at = ? AND id < ?))"
		args = append(args, c.CreatedAt, c.CreatedAt, c.ID)
	}
	// One more than the page, to know whether another page follows.
	args = append(args, limit+1)
	rows, err := s.reader.QueryContext(ctx,
		"SELECT "+runColumns+" FROM runs WHERE "+where+" ORDER BY created_at DESC, id DESC LIMIT ?", args...)
	if err != nil {
		return belay.RunPage{}, wrap("list runs", err)
	}
	defer rows.Close()
	var page belay.RunPage
	for rows.Next() {
		r, err := scanRun(rows, true)
		if err != nil {
			return belay.RunPage{}, wrap("list runs", err)
		}
		page.Runs = append(page.Runs, r)
	}
	if err := rows.Err(); err != nil {
		return belay.RunPage{}, wrap("list runs", err)
	}
	if len(page.Runs) > limit {
		page.Runs = page.Runs[:limit]
		page.NextCursor = encodeCursor(page.Runs[limit-1])
	}
	return page, nil
}

// Transition moves the run to t.To when belay.AllowedFrom permits it,
// records the outcome and appends t.Events, all in one transaction.
// An event without a time takes t.At. Returns invalid for an unknown state
// or a malformed event; not_found if the run does not exist; conflict if
// its state does not allow the move.
func (s *Store) Transition(ctx context.Context, id string, t belay.Transition) (belay.Run, error) {
	if !t.To.Valid() {
		return belay.Run{}, belay.FieldErrorf(belay.CodeInvalid, "status", "unknown status %q", t.To)
	}
	if t.Attempt < 0 {
		return belay.Run{}, belay.FieldErrorf(belay.CodeInvalid, "attempt", "must not be negative, not %d", t.Attempt)
	}
	if err := checkTimes("at", t.At); err != nil {
		return belay.Run{}, err
	}
	events := t.TimedEvents()
	if err := checkEvents(events); err != nil {
		return belay.Run{}, err
	}
	var r belay.Run
	err := s.update(ctx, func(tx *sql.Tx) error {
		var err error
		if r, err = loadRun(ctx, tx, id); err != nil {
			return err
		}
		if !belay.CanTransition(r.Status, t.To) {
			return belay.Errorf(belay.CodeConflict, "run %s is %s and cannot become %s", id, r.Status, t.To)
		}
		r.Status = t.To
		r.UpdatedAt = t.At
		if t.To == belay.StatusRunning {
			r.StartedAt = t.At
		}
		if t.To.Terminal() {
			r.FinishedAt = t.At
		}
		if t.Reason != "" {
			r.Reason = t.Reason
		}
		if t.Attempt > 0 {
			r.Attempt = t.Attempt
		}
		if t.ExitCode != nil {
			c := *t.ExitCode
			r.ExitCode = &c
		}
		if len(t.Checks) > 0 {
			r.Checks = t.Checks
		}
		if len(t.ChangedFiles) > 0 {
			r.ChangedFiles = t.ChangedFiles
		}
		if len(t.Artifacts) > 0 {
			r.Artifacts = t.Artifacts
		}
		if _, err := s.appendLocked(ctx, tx, &r, events, belay.SourceControl); err != nil {
			return err
		}
		return saveRun(ctx, tx, r)
	})
	if err != nil {
		return belay.Run{}, wrap(fmt.Sprintf("transition run %s to %s", id, t.To), err)
	}
	return r, nil
}

// RequestCancel marks the run for cancellation and appends
// run.cancel_requested, once. Returns not_found if the run does not exist;
// conflict if it is terminal.
func (s *Store) RequestCancel(ctx context.Context, id string, at time.Time) (belay.Run, error) {
	if err := checkTimes("at", at); err != nil {
		return belay.Run{}, err
	}
	var r belay.Run
	err := s.update(ctx, func(tx *sql.Tx) error {
		var err error
		if r, err = loadRun(ctx, tx, id); err != nil {
			return err
		}
		if r.Status.Terminal() {
			return belay.Errorf(belay.CodeConflict, "run %s is already %s", id, r.Status)
		}
		if r.CancelRequested {
			return nil
		}
		r.CancelRequested = true
		r.UpdatedAt = at
		if _, err := s.appendLocked(ctx, tx, &r, []belay.EventInput{{Time: at, Type: belay.EventCancelRequested}}, belay.SourceControl); err != nil {
			return err
		}
		return saveRun(ctx, tx, r)
	})
	if err != nil {
		return belay.Run{}, wrap("request cancel of run "+id, err)
	}
	return r, nil
}

// RecordUsage adds d to the run's usage counters. Returns not_found if the
// run does not exist.
func (s *Store) RecordUsage(ctx context.Context, id string, d belay.UsageDelta) error {
	err := s.update(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE runs SET
			model_requests = model_requests + ?, prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?
			WHERE id = ?`, d.ModelRequests, d.PromptTokens, d.CompletionTokens, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return belay.Errorf(belay.CodeNotFound, "run %s not found", id)
		}
		return nil
	})
	return wrap("record usage of run "+id, err)
}
