package storetest

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

var allStatuses = []belay.RunStatus{
	belay.StatusQueued, belay.StatusRunning, belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled,
}

func testTransitions(t *testing.T, open opener) {
	t.Run("every_pair", func(t *testing.T) {
		// The whole state machine, spelled out rather than derived from
		// belay.AllowedFrom, so a change to either one shows here.
		allowed := map[[2]belay.RunStatus]bool{
			{belay.StatusQueued, belay.StatusRunning}:    true,
			{belay.StatusQueued, belay.StatusFailed}:     true,
			{belay.StatusQueued, belay.StatusCancelled}:  true,
			{belay.StatusRunning, belay.StatusCompleted}: true,
			{belay.StatusRunning, belay.StatusFailed}:    true,
			{belay.StatusRunning, belay.StatusCancelled}: true,
		}
		s := open(t, Options{})
		for _, from := range allStatuses {
			for _, to := range allStatuses {
				ok := allowed[[2]belay.RunStatus{from, to}]
				t.Run(name("%s_to_%s", from, to), func(t *testing.T) {
					id := name("run-%s-%s", from, to)
					before := createIn(t, s, id, from)
					beforeLog := allEvents(t, s, id)
					when := at(1000)
					tr := transitionTo(to, when)
					got, err := s.Transition(t.Context(), id, tr)
					if !ok {
						wantCode(t, err, belay.CodeConflict, name("Transition %s → %s", from, to))
						sameRun(t, "run after a refused transition", mustGet(t, s, id), before)
						sameEvents(t, "log after a refused transition", allEvents(t, s, id).Events, beforeLog.Events)
						return
					}
					if err != nil {
						t.Fatalf("Transition %s → %s: %v", from, to, err)
					}
					if got.Status != to || got.LastSeq != before.LastSeq+1 {
						t.Fatalf("Transition %s → %s = status %s lastSeq %d, want %s %d", from, to, got.Status, got.LastSeq, to, before.LastSeq+1)
					}
					sameRun(t, "GetRun after Transition", mustGet(t, s, id), got)
					p := allEvents(t, s, id)
					want := append(slices.Clone(beforeLog.Events), belay.Event{Seq: before.LastSeq + 1, Time: when, Type: tr.Events[0].Type, Source: belay.SourceControl, Data: tr.Events[0].Data})
					sameEvents(t, "log after Transition", p.Events, want)
					if p.LastSeq != got.LastSeq || p.Terminal != to.Terminal() {
						t.Fatalf("page after → %s: lastSeq %d terminal %v, want %d %v", to, p.LastSeq, p.Terminal, got.LastSeq, to.Terminal())
					}
				})
			}
		}
	})

	t.Run("not_found", func(t *testing.T) {
		s := open(t, Options{})
		_, err := s.Transition(t.Context(), "run-missing", transitionTo(belay.StatusRunning, at(1)))
		wantCode(t, err, belay.CodeNotFound, "Transition(missing)")
	})

	t.Run("outcome_recorded", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-out", at(0), "hash-out"), "")
		started := mustTransition(t, s, "run-out", belay.StatusRunning, at(10))
		sameTime(t, "StartedAt", started.StartedAt, at(10))
		sameTime(t, "FinishedAt while running", started.FinishedAt, time.Time{})
		if started.LastSeq != 2 {
			t.Fatalf("LastSeq after start = %d, want 2", started.LastSeq)
		}

		checks := []belay.CheckResult{
			{Argv: []string{"python3", "-m", "pytest", "-q"}, ExitCode: 0, DurationMs: 812, OutputTail: "3 passed"},
			{Argv: []string{"git", "diff", "--check"}, ExitCode: 0, DurationMs: 9},
		}
		tr := belay.Transition{
			To: belay.StatusCompleted, At: at(20),
			Reason: "checks passed", ExitCode: intp(0), Checks: checks,
			ChangedFiles: []string{"calc.py"},
			Artifacts:    []string{"result.json", "patch.diff", "transcript.jsonl"},
			Events: []belay.EventInput{
				{Time: at(19), Type: belay.EventCheckFinished, Data: json.RawMessage(`{"exitCode":0}`)},
				{Time: at(20), Type: belay.EventRunCompleted, Data: json.RawMessage(`{"exitCode":0}`)},
			},
		}
		done, err := s.Transition(t.Context(), "run-out", tr)
		if err != nil {
			t.Fatalf("Transition → completed: %v", err)
		}
		stored := mustGet(t, s, "run-out")
		sameRun(t, "GetRun after completion", stored, done)
		if stored.Status != belay.StatusCompleted || stored.Reason != tr.Reason ||
			stored.ExitCode == nil || *stored.ExitCode != 0 ||
			!slices.Equal(stored.ChangedFiles, tr.ChangedFiles) || !slices.Equal(stored.Artifacts, tr.Artifacts) {
			t.Fatalf("completed run = %s reason %q exit %v changed %v artifacts %v; want the transition's outcome",
				stored.Status, stored.Reason, stored.ExitCode, stored.ChangedFiles, stored.Artifacts)
		}
		if len(stored.Checks) != len(checks) {
			t.Fatalf("Checks = %+v, want %+v", stored.Checks, checks)
		}
		for i := range checks {
			g, w := stored.Checks[i], checks[i]
			if !slices.Equal(g.Argv, w.Argv) || g.ExitCode != w.ExitCode || g.DurationMs != w.DurationMs || g.OutputTail != w.OutputTail {
				t.Fatalf("Checks[%d] = %+v, want %+v", i, g, w)
			}
		}
		sameTime(t, "StartedAt after completion", stored.StartedAt, at(10))
		sameTime(t, "FinishedAt", stored.FinishedAt, at(20))
		sameRequest(t, "request after completion", stored.Request, newRun("x", at(0), "").Request)

		p := allEvents(t, s, "run-out")
		if got := eventTypes(p.Events); !slices.Equal(got, []string{belay.EventRunQueued, belay.EventRunStarted, belay.EventCheckFinished, belay.EventRunCompleted}) {
			t.Fatalf("log = %v", got)
		}
		if !slices.Equal(eventSeqs(p.Events), seqRange(1, 4)) || p.LastSeq != 4 || !p.Terminal || stored.LastSeq != 4 {
			t.Fatalf("log seqs %v lastSeq %d terminal %v run.lastSeq %d; want 1..4, 4, true, 4",
				eventSeqs(p.Events), p.LastSeq, p.Terminal, stored.LastSeq)
		}
	})

	t.Run("event_time_defaults_to_transition", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-time", at(0), "hash-time"), "")
		r, err := s.Transition(t.Context(), "run-time", belay.Transition{
			To: belay.StatusRunning, At: at(7),
			Events: []belay.EventInput{{Type: belay.EventRunStarted}, {Time: at(8), Type: belay.EventSandboxReady}},
		})
		if err != nil {
			t.Fatalf("Transition: %v", err)
		}
		want := []belay.Event{
			{Seq: 2, Time: at(7), Type: belay.EventRunStarted, Source: belay.SourceControl},
			{Seq: 3, Time: at(8), Type: belay.EventSandboxReady, Source: belay.SourceControl},
		}
		sameEvents(t, "events of the transition", allEvents(t, s, "run-time").Events[1:], want)
		sameTime(t, "StartedAt", r.StartedAt, at(7))
	})

	t.Run("invalid_events", func(t *testing.T) {
		s := open(t, Options{})
		before := createIn(t, s, "run-inv", belay.StatusRunning)
		log := allEvents(t, s, "run-inv")
		for _, ev := range []belay.EventInput{
			{Time: at(5), Type: ""},
			{Time: at(5), Type: belay.EventRunCompleted, Data: json.RawMessage(`{"exitCode":`)},
		} {
			tr := transitionTo(belay.StatusCompleted, at(5))
			tr.Events = append(tr.Events, ev)
			_, err := s.Transition(t.Context(), "run-inv", tr)
			wantCode(t, err, belay.CodeInvalid, name("Transition with event %q %s", ev.Type, ev.Data))
			sameRun(t, "run after a refused transition", mustGet(t, s, "run-inv"), before)
			sameEvents(t, "log after a refused transition", allEvents(t, s, "run-inv").Events, log.Events)
		}
	})

	t.Run("fail_before_start", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-fail", at(0), "hash-fail"), "")
		r, err := s.Transition(t.Context(), "run-fail", belay.Transition{
			To: belay.StatusFailed, At: at(3), Reason: "capability activation failed", ExitCode: intp(3),
			Events: []belay.EventInput{{Time: at(3), Type: belay.EventRunFailed}},
		})
		if err != nil {
			t.Fatalf("Transition queued → failed: %v", err)
		}
		if r.Status != belay.StatusFailed || r.Reason != "capability activation failed" || r.ExitCode == nil || *r.ExitCode != 3 {
			t.Fatalf("failed run = %s %q %v", r.Status, r.Reason, r.ExitCode)
		}
		sameTime(t, "StartedAt of a run that never started", r.StartedAt, time.Time{})
		sameTime(t, "FinishedAt", r.FinishedAt, at(3))
		sameRun(t, "GetRun", mustGet(t, s, "run-fail"), r)
	})

	t.Run("late_completion_after_cancel", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-late", at(0), "hash-late"), "")
		mustTransition(t, s, "run-late", belay.StatusRunning, at(1))
		cancelled, err := s.Transition(t.Context(), "run-late", belay.Transition{
			To: belay.StatusCancelled, At: at(2), Reason: "cancelled by user",
			Events: []belay.EventInput{{Time: at(2), Type: belay.EventRunCancelled}},
		})
		if err != nil {
			t.Fatalf("Transition → cancelled: %v", err)
		}
		log := allEvents(t, s, "run-late")
		for _, late := range []belay.Transition{
			{To: belay.StatusCompleted, At: at(3), Reason: "checks passed", ExitCode: intp(0),
				ChangedFiles: []string{"calc.py"}, Artifacts: []string{"result.json"},
				Events: []belay.EventInput{{Time: at(3), Type: belay.EventRunCompleted}}},
			{To: belay.StatusFailed, At: at(4), Reason: "sandbox died", ExitCode: intp(1),
				Events: []belay.EventInput{{Time: at(4), Type: belay.EventRunFailed}}},
			{To: belay.StatusCancelled, At: at(5), Reason: "again",
				Events: []belay.EventInput{{Time: at(5), Type: belay.EventRunCancelled}}},
		} {
			_, err := s.Transition(t.Context(), "run-late", late)
			wantCode(t, err, belay.CodeConflict, name("late Transition → %s", late.To))
			sameRun(t, name("run after a late → %s", late.To), mustGet(t, s, "run-late"), cancelled)
			sameEvents(t, name("log after a late → %s", late.To), allEvents(t, s, "run-late").Events, log.Events)
		}
	})
}

func testCancel(t *testing.T, open opener) {
	for _, from := range []belay.RunStatus{belay.StatusQueued, belay.StatusRunning} {
		t.Run("request_"+string(from), func(t *testing.T) {
			s := open(t, Options{})
			before := createIn(t, s, "run-c", from)
			r, err := s.RequestCancel(t.Context(), "run-c", at(500))
			if err != nil {
				t.Fatalf("RequestCancel: %v", err)
			}
			if !r.CancelRequested || r.Status != from || r.LastSeq != before.LastSeq+1 {
				t.Fatalf("after RequestCancel: cancelRequested %v status %s lastSeq %d; want true %s %d",
					r.CancelRequested, r.Status, r.LastSeq, from, before.LastSeq+1)
			}
			sameRun(t, "GetRun after RequestCancel", mustGet(t, s, "run-c"), r)
			p := allEvents(t, s, "run-c")
			last := p.Events[len(p.Events)-1]
			if last.Type != belay.EventCancelRequested || last.Seq != r.LastSeq {
				t.Fatalf("last event = %d %s, want %d %s", last.Seq, last.Type, r.LastSeq, belay.EventCancelRequested)
			}
			sameTime(t, "run.cancel_requested time", last.Time, at(500))

			again, err := s.RequestCancel(t.Context(), "run-c", at(501))
			if err != nil {
				t.Fatalf("second RequestCancel: %v", err)
			}
			if !again.CancelRequested || again.LastSeq != r.LastSeq {
				t.Fatalf("second RequestCancel: cancelRequested %v lastSeq %d, want true %d", again.CancelRequested, again.LastSeq, r.LastSeq)
			}
			sameEvents(t, "log after a second RequestCancel", allEvents(t, s, "run-c").Events, p.Events)

			// The orchestrator then records the cancellation; the flag stays.
			done := mustTransition(t, s, "run-c", belay.StatusCancelled, at(502))
			if !done.CancelRequested {
				t.Fatal("cancelled run lost cancelRequested")
			}
		})
	}

	for _, term := range []belay.RunStatus{belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled} {
		t.Run("terminal_"+string(term), func(t *testing.T) {
			s := open(t, Options{})
			before := createIn(t, s, "run-t", term)
			_, err := s.RequestCancel(t.Context(), "run-t", at(500))
			wantCode(t, err, belay.CodeConflict, "RequestCancel(terminal)")
			sameRun(t, "terminal run after RequestCancel", mustGet(t, s, "run-t"), before)
		})
	}

	t.Run("not_found", func(t *testing.T) {
		s := open(t, Options{})
		_, err := s.RequestCancel(t.Context(), "run-missing", at(1))
		wantCode(t, err, belay.CodeNotFound, "RequestCancel(missing)")
	})
}
