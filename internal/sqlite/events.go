package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/belay-dev/belay/internal/belay"
)

// checkEvents returns invalid for events belay.CheckEvents refuses, or with
// a time the store cannot hold.
func checkEvents(evs []belay.EventInput) error {
	if err := belay.CheckEvents(evs); err != nil {
		return err
	}
	for i, e := range evs {
		if err := checkTimes(fmt.Sprintf("events[%d].time", i), e.Time); err != nil {
			return err
		}
	}
	return nil
}

// appendLocked appends evs to run r's log inside write transaction tx,
// numbering them from r.LastSeq+1 and marking them with source, advances
// r.LastSeq (the caller saves r) and drops what falls out of the buffer.
func (s *Store) appendLocked(ctx context.Context, tx *sql.Tx, r *belay.Run, evs []belay.EventInput, source string) ([]belay.Event, error) {
	out := make([]belay.Event, 0, len(evs))
	for _, e := range evs {
		seq := r.LastSeq + 1
		var data []byte
		if len(e.Data) > 0 {
			data = e.Data
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO events (run_id, seq, time, type, source, data) VALUES (?, ?, ?, ?, ?, ?)",
			r.ID, seq, nanos(e.Time), e.Type, source, data); err != nil {
			return nil, fmt.Errorf("append event %d: %w", seq, err)
		}
		r.LastSeq = seq
		out = append(out, belay.Event{Seq: seq, Time: e.Time, Type: e.Type, Source: source, Data: e.Data})
	}
	if drop := r.LastSeq - int64(s.bufferSize); len(evs) > 0 && drop > 0 {
		if _, err := tx.ExecContext(ctx, "DELETE FROM events WHERE run_id = ? AND seq <= ?", r.ID, drop); err != nil {
			return nil, fmt.Errorf("trim events: %w", err)
		}
	}
	return out, nil
}

// readEvents returns the events of runID with from <= seq <= to, oldest
// first, at most limit of them.
func readEvents(ctx context.Context, q querier, runID string, from, to int64, limit int) ([]belay.Event, error) {
	rows, err := q.QueryContext(ctx,
		"SELECT seq, time, type, source, data FROM events WHERE run_id = ? AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?",
		runID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	defer rows.Close()
	var out []belay.Event
	for rows.Next() {
		var (
			e    belay.Event
			t    sql.NullInt64
			data []byte
		)
		if err := rows.Scan(&e.Seq, &t, &e.Type, &e.Source, &data); err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		e.Time = fromNanos(t)
		if len(data) > 0 {
			e.Data = json.RawMessage(data)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return out, nil
}

// AppendEvents appends events to a non-terminal run's log in one
// transaction. A repeated non-empty batchID appends nothing and returns the
// first call's events still in the buffer. Returns invalid for a malformed
// event; not_found if the run does not exist; conflict if it is terminal.
func (s *Store) AppendEvents(ctx context.Context, runID, batchID string, events []belay.EventInput) ([]belay.Event, error) {
	return s.appendEvents(ctx, runID, batchID, events, belay.SourceControl, nil)
}

// AppendSandboxEvents is AppendEvents for the sandbox's events, counted in
// the same transaction against the run's caps. Returns too_large, naming
// the cap, for a batch past them, besides AppendEvents' codes.
func (s *Store) AppendSandboxEvents(ctx context.Context, runID, batchID string, events []belay.EventInput, limits belay.SandboxEventLimits) ([]belay.Event, error) {
	if !limits.Valid() {
		return nil, belay.Errorf(belay.CodeInvalid, "sandbox event limits %+v must both be positive", limits)
	}
	return s.appendEvents(ctx, runID, batchID, events, belay.SourceSandbox, &limits)
}

func (s *Store) appendEvents(ctx context.Context, runID, batchID string, events []belay.EventInput, source string, limits *belay.SandboxEventLimits) ([]belay.Event, error) {
	if err := checkEvents(events); err != nil {
		return nil, err
	}
	var out []belay.Event
	err := s.update(ctx, func(tx *sql.Tx) error {
		r, err := loadRunState(ctx, tx, runID)
		if err != nil {
			return err
		}
		if batchID != "" {
			var first, last int64
			err := tx.QueryRowContext(ctx, "SELECT first_seq, last_seq FROM event_batches WHERE run_id = ? AND batch_id = ?",
				runID, batchID).Scan(&first, &last)
			switch {
			case err == nil:
				// A retry: answer with what the first call wrote.
				out, err = readEvents(ctx, tx, runID, first, last, int(last-first+1))
				return err
			case !errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("look up batch: %w", err)
			}
		}
		if r.Status.Terminal() {
			return belay.Errorf(belay.CodeConflict, "run %s is %s; its log has ended", runID, r.Status)
		}
		if len(events) == 0 {
			return nil
		}
		if limits != nil {
			if err := belay.CheckSandboxEventLimits(*limits, r.SandboxEvents, r.SandboxEventBytes, events); err != nil {
				return err
			}
			r.SandboxEvents += len(events)
			for _, e := range events {
				r.SandboxEventBytes += belay.EventBytes(e)
			}
		}
		if out, err = s.appendLocked(ctx, tx, &r, events, source); err != nil {
			return err
		}
		if batchID != "" {
			if _, err := tx.ExecContext(ctx, "INSERT INTO event_batches (run_id, batch_id, first_seq, last_seq) VALUES (?, ?, ?, ?)",
				runID, batchID, out[0].Seq, out[len(out)-1].Seq); err != nil {
				return fmt.Errorf("record batch: %w", err)
			}
		}
		_, err = tx.ExecContext(ctx, "UPDATE runs SET last_seq = ?, sandbox_events = ?, sandbox_event_bytes = ? WHERE id = ?",
			r.LastSeq, r.SandboxEvents, r.SandboxEventBytes, runID)
		return err
	})
	if err != nil {
		return nil, wrap("append events to run "+runID, err)
	}
	if out == nil {
		out = []belay.Event{}
	}
	return out, nil
}

// ListEvents returns up to limit events with Seq > after, oldest first,
// from one snapshot of the log. A limit of zero or above the buffer size
// means the buffer size. Returns not_found if the run does not exist.
func (s *Store) ListEvents(ctx context.Context, runID string, after int64, limit int) (belay.EventPage, error) {
	if limit <= 0 || limit > s.bufferSize {
		limit = s.bufferSize
	}
	after = max(after, 0)
	var page belay.EventPage
	err := s.view(ctx, func(tx *sql.Tx) error {
		var status string
		err := tx.QueryRowContext(ctx, "SELECT status, last_seq FROM runs WHERE id = ?", runID).Scan(&status, &page.LastSeq)
		if errors.Is(err, sql.ErrNoRows) {
			return belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		}
		if err != nil {
			return fmt.Errorf("read run: %w", err)
		}
		page.Terminal = belay.RunStatus(status).Terminal()
		var oldest sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT MIN(seq) FROM events WHERE run_id = ?", runID).Scan(&oldest); err != nil {
			return fmt.Errorf("read oldest event: %w", err)
		}
		page.OldestSeq = oldest.Int64
		page.Missed = oldest.Valid && after+1 < oldest.Int64
		page.Events, err = readEvents(ctx, tx, runID, after+1, page.LastSeq, limit)
		return err
	})
	if err != nil {
		return belay.EventPage{}, wrap("list events of run "+runID, err)
	}
	return page, nil
}
