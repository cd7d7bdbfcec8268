package session

import (
	"context"

	"github.com/belay-dev/belay/internal/belay"
)

// EventPage is one page of a session's stream.
type EventPage struct {
	Events []belay.SessionEvent
	// Missed is set when events after the reader's position have left a
	// run's bounded buffer; OldestSeq is the oldest session-wide sequence
	// number still kept there.
	Missed    bool
	OldestSeq int64
	// Ended is set when nothing can follow: the session is closed, its
	// last turn ended and the page holds its last event.
	Ended bool
	// Idle is set when the reader has every event so far and no turn is
	// running: the next event comes with the next message.
	Idle bool
}

// Events returns up to limit events of sess's turns after the session-wide
// sequence number after (belay.SessionSeq), oldest first: the rest of the
// turn after is in, then the turns after it, stopping at a turn still
// running. sess should be fresh (Get or Refresh).
func (s *Service) Events(ctx context.Context, sess belay.Session, after int64, limit int) (EventPage, error) {
	return Reader{Store: s.cfg.Store}.Events(ctx, sess, after, limit)
}

// Reader reads sessions and their event streams and writes nothing: what
// a handler that only serves the stream needs (the stream function on
// AWS, whose access to the table is read-only).
type Reader struct{ Store belay.Store }

// Get returns the session with its last turn's status as the turn's run
// has it. Unlike Service.Get it does not record the end of a turn (the
// next Service that reads the session does). Returns not_found.
func (r Reader) Get(ctx context.Context, id string) (belay.Session, error) {
	sess, err := r.Store.GetSession(ctx, id)
	if err != nil {
		return belay.Session{}, err
	}
	if last := sess.LastTurn(); last != nil && !last.Status.Terminal() {
		run, err := r.Store.GetRun(ctx, last.RunID)
		switch {
		case belay.IsCode(err, belay.CodeNotFound):
			// Its run is not stored yet: the turn is queued.
		case err != nil:
			return belay.Session{}, err
		default:
			sess.Turns[len(sess.Turns)-1].Status = run.Status
		}
	}
	return sess, nil
}

// Events is Service.Events.
func (r Reader) Events(ctx context.Context, sess belay.Session, after int64, limit int) (EventPage, error) {
	var page EventPage
	turn, seq := belay.SplitSessionSeq(after)
	if turn < 1 {
		turn, seq = 1, 0
	}
	caughtUp := true
	for ; turn <= len(sess.Turns) && len(page.Events) < limit; turn, seq = turn+1, 0 {
		t := sess.Turns[turn-1]
		p, err := r.Store.ListEvents(ctx, t.RunID, seq, limit-len(page.Events))
		if belay.IsCode(err, belay.CodeNotFound) {
			continue // a turn whose run was never stored has no events
		}
		if err != nil {
			return EventPage{}, err
		}
		if p.Missed && !page.Missed {
			page.Missed, page.OldestSeq = true, belay.SessionSeq(turn, p.OldestSeq)
		}
		last := seq
		for _, e := range p.Events {
			page.Events = append(page.Events, belay.SessionEvent{Seq: belay.SessionSeq(turn, e.Seq), Turn: turn, RunID: t.RunID,
				RunSeq: e.Seq, Time: e.Time, Type: e.Type, Source: e.Source, Data: e.Data})
			last = e.Seq
		}
		if !p.Terminal || last < p.LastSeq {
			// The run is still going, or the page was full: the next
			// turn's events come after these.
			caughtUp = p.Terminal && last >= p.LastSeq
			if !caughtUp {
				break
			}
		}
	}
	lastTurn := sess.LastTurn()
	done := caughtUp && turn > len(sess.Turns) && (lastTurn == nil || lastTurn.Status.Terminal())
	page.Ended = done && sess.Status == belay.SessionClosed
	page.Idle = done && sess.Status != belay.SessionClosed
	return page, nil
}
