package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/belay-dev/belay/internal/belay"
)

// RecordCheckpoint points the run at c in one transaction, after checking
// that the run is running at c's attempt and that c is newer than the
// checkpoint it points at. It returns the one it pointed at before.
// Returns invalid for a bad ref; not_found if the run does not exist;
// conflict if it is not running, at another attempt, or points at a newer
// checkpoint.
func (s *Store) RecordCheckpoint(ctx context.Context, runID string, c belay.CheckpointRef) (belay.CheckpointRef, error) {
	if err := belay.CheckCheckpointRef(c); err != nil {
		return belay.CheckpointRef{}, err
	}
	if err := checkTimes("checkpoint.at", c.At); err != nil {
		return belay.CheckpointRef{}, err
	}
	var previous belay.CheckpointRef
	err := s.update(ctx, func(tx *sql.Tx) error {
		r, err := loadRunState(ctx, tx, runID)
		if err != nil {
			return err
		}
		if r.Checkpoint != nil && r.Checkpoint.Seq == c.Seq && r.Checkpoint.Attempt == c.Attempt {
			return nil
		}
		if err := belay.CheckpointAllowed(r, c); err != nil {
			return err
		}
		if r.Checkpoint != nil {
			previous = *r.Checkpoint
		}
		c.At = c.At.UTC()
		r.Checkpoint = &c
		return saveRun(ctx, tx, r)
	})
	if err != nil {
		return belay.CheckpointRef{}, wrap("record checkpoint of run "+runID, err)
	}
	return previous, nil
}

// ResumeRun moves the running run from attempt r.From to the next and
// appends r.Events, in one transaction (see belay.ApplyResume). Returns
// invalid for a malformed resume; not_found if the run does not exist;
// conflict if it is not running, its cancel was requested, or it is at
// another attempt.
func (s *Store) ResumeRun(ctx context.Context, runID string, rs belay.Resume) (belay.Run, error) {
	if err := belay.CheckResume(rs); err != nil {
		return belay.Run{}, err
	}
	if err := checkTimes("at", rs.At); err != nil {
		return belay.Run{}, err
	}
	events := make([]belay.EventInput, len(rs.Events))
	for i, e := range rs.Events {
		if e.Time.IsZero() {
			e.Time = rs.At
		}
		events[i] = e
	}
	if err := checkEvents(events); err != nil {
		return belay.Run{}, err
	}
	var r belay.Run
	err := s.update(ctx, func(tx *sql.Tx) error {
		var err error
		if r, err = loadRun(ctx, tx, runID); err != nil {
			return err
		}
		if err := belay.ApplyResume(&r, rs); err != nil {
			return err
		}
		if _, err := s.appendLocked(ctx, tx, &r, events, belay.SourceControl); err != nil {
			return err
		}
		return saveRun(ctx, tx, r)
	})
	if err != nil {
		return belay.Run{}, wrap(fmt.Sprintf("resume run %s from attempt %d", runID, rs.From), err)
	}
	return r, nil
}
