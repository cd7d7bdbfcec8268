package storetest

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// ref is a checkpoint of the run's attempt, stored at sec.
func ref(seq int64, attempt, step int, sec int) belay.CheckpointRef {
	return belay.CheckpointRef{Seq: seq, Attempt: attempt, Step: step, Size: 1000 + seq, At: at(sec)}
}

// mustRecord points the run at c and returns the previous checkpoint.
func mustRecord(tb testing.TB, s belay.Store, runID string, c belay.CheckpointRef) belay.CheckpointRef {
	tb.Helper()
	prev, err := s.RecordCheckpoint(tb.Context(), runID, c)
	if err != nil {
		tb.Fatalf("RecordCheckpoint(%s, seq %d, attempt %d): %v", runID, c.Seq, c.Attempt, err)
	}
	return prev
}

// sameRef fails unless the run points at want.
func sameRef(tb testing.TB, what string, got *belay.CheckpointRef, want belay.CheckpointRef) {
	tb.Helper()
	if got == nil {
		tb.Fatalf("%s: the run points at no checkpoint; want seq %d", what, want.Seq)
	}
	g, w := *got, want
	if !g.At.Equal(w.At) {
		tb.Fatalf("%s: checkpoint at %v, want %v", what, g.At, w.At)
	}
	g.At, w.At = time.Time{}, time.Time{}
	if g != w {
		tb.Fatalf("%s: checkpoint %+v, want %+v", what, g, w)
	}
}

// lost is a resume from attempt from at sec, with its two events.
func lost(from, sec int, reason string) belay.Resume {
	data, _ := json.Marshal(belay.SandboxLostData{Attempt: from, Reason: reason, Resumes: true})
	resumed, _ := json.Marshal(belay.RunResumedData{Attempt: from + 1, ResumesLeft: 1})
	return belay.Resume{From: from, At: at(sec), Reason: reason, Events: []belay.EventInput{
		{Type: belay.EventSandboxLost, Data: data},
		{Type: belay.EventRunResumed, Data: resumed},
	}}
}

func testCheckpoints(t *testing.T, open opener) {
	t.Run("pointer", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-ckpt")
		if r := mustGet(t, s, "run-ckpt"); r.Checkpoint != nil {
			t.Fatalf("a new run points at checkpoint %+v; want none", *r.Checkpoint)
		}
		first := ref(1, 1, 0, 11)
		first.Pending = "shell"
		if prev := mustRecord(t, s, "run-ckpt", first); prev != (belay.CheckpointRef{}) {
			t.Fatalf("first checkpoint: previous %+v, want none", prev)
		}
		sameRef(t, "after the first", mustGet(t, s, "run-ckpt").Checkpoint, first)

		second := ref(2, 1, 1, 12)
		second.Unresumable = "the checkpoint is over the cap"
		prev := mustRecord(t, s, "run-ckpt", second)
		sameRef(t, "previous of the second", &prev, first)
		sameRef(t, "after the second", mustGet(t, s, "run-ckpt").Checkpoint, second)
		if second.Resumable() {
			t.Fatal("a ref with a reason says it is resumable")
		}

		// A repeat of the last write changes nothing and has nothing to prune.
		if prev := mustRecord(t, s, "run-ckpt", second); prev != (belay.CheckpointRef{}) {
			t.Fatalf("repeated checkpoint: previous %+v, want none", prev)
		}
		// An older, or equal but different, checkpoint never replaces it.
		for _, stale := range []belay.CheckpointRef{ref(1, 1, 0, 13), ref(2, 2, 5, 13)} {
			_, err := s.RecordCheckpoint(t.Context(), "run-ckpt", stale)
			wantCode(t, err, belay.CodeConflict, name("checkpoint seq %d attempt %d after seq 2", stale.Seq, stale.Attempt))
		}
		// Nor does a newer one of another attempt.
		_, err := s.RecordCheckpoint(t.Context(), "run-ckpt", ref(3, 2, 2, 13))
		wantCode(t, err, belay.CodeConflict, "a checkpoint of attempt 2 while the run is at attempt 1")
		sameRef(t, "after the refusals", mustGet(t, s, "run-ckpt").Checkpoint, second)

		// What the port checks before it writes.
		for _, bad := range []belay.CheckpointRef{
			ref(0, 1, 0, 14), ref(4, 0, 0, 14), ref(4, 1, -1, 14),
			{Seq: 4, Attempt: 1, Size: belay.MaxCheckpointBytes + 1, At: at(14)},
			{Seq: 4, Attempt: 1},
		} {
			_, err := s.RecordCheckpoint(t.Context(), "run-ckpt", bad)
			wantCode(t, err, belay.CodeInvalid, name("checkpoint %+v", bad))
		}
		_, err = s.RecordCheckpoint(t.Context(), "run-missing", ref(1, 1, 0, 14))
		wantCode(t, err, belay.CodeNotFound, "checkpoint of a missing run")
	})

	t.Run("pointer_states", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-queued", belay.StatusQueued)
		_, err := s.RecordCheckpoint(t.Context(), "run-queued", ref(1, 1, 0, 11))
		wantCode(t, err, belay.CodeConflict, "checkpoint of a queued run")
		startAttempt(t, s, "run-done")
		mustRecord(t, s, "run-done", ref(1, 1, 0, 11))
		mustTransition(t, s, "run-done", belay.StatusCompleted, at(20))
		_, err = s.RecordCheckpoint(t.Context(), "run-done", ref(2, 1, 1, 21))
		wantCode(t, err, belay.CodeConflict, "checkpoint of a completed run")
		// The run ends still pointing at its last checkpoint.
		sameRef(t, "after completion", mustGet(t, s, "run-done").Checkpoint, ref(1, 1, 0, 11))
	})

	t.Run("resume", func(t *testing.T) {
		s := open(t, Options{})
		started := startAttempt(t, s, "run-resume")
		c := newCapability("run-resume", 14, at(600))
		mustActivate(t, s, c)
		consume(t, s, "run-resume", testModel, at(12))
		if err := s.RecordSandboxRef(t.Context(), "run-resume", 1, "task-1"); err != nil {
			t.Fatal(err)
		}
		mustRecord(t, s, "run-resume", ref(1, 1, 1, 13))
		before := allEvents(t, s, "run-resume").Events

		r, err := s.ResumeRun(t.Context(), "run-resume", lost(1, 20, "sandbox killed"))
		if err != nil {
			t.Fatalf("ResumeRun from attempt 1: %v", err)
		}
		stored := mustGet(t, s, "run-resume")
		sameRun(t, "ResumeRun's answer", r, stored)
		want := []belay.LostAttempt{{Attempt: 1, StartedAt: started.StartedAt, LostAt: at(20), Reason: "sandbox killed"}}
		if stored.Attempt != 2 || stored.Status != belay.StatusRunning || stored.SandboxRef != "" || !sameLost(stored.LostAttempts, want) {
			t.Fatalf("after the resume: attempt %d, %s, sandboxRef %q, lost %+v; want attempt 2, running, no ref, %+v",
				stored.Attempt, stored.Status, stored.SandboxRef, stored.LostAttempts, want)
		}
		sameTime(t, "startedAt after the resume", stored.StartedAt, started.StartedAt)
		sameTime(t, "the second attempt's start", stored.AttemptStartedAt(), at(20))
		// The checkpoint and the capability span the attempts.
		sameRef(t, "checkpoint after the resume", stored.Checkpoint, ref(1, 1, 1, 13))
		wantCapability(t, s, c, belay.CapabilityActive, 1)
		evs := allEvents(t, s, "run-resume").Events
		added := evs[len(before):]
		if got := eventTypes(added); !slices.Equal(got, []string{belay.EventSandboxLost, belay.EventRunResumed}) ||
			!slices.Equal(eventSeqs(evs), seqRange(1, int64(len(evs)))) {
			t.Fatalf("events after the resume %v (seqs %v); want sandbox.lost, run.resumed, gapless", got, eventSeqs(evs))
		}
		for _, e := range added {
			if e.Source != belay.SourceControl || !e.Time.Equal(at(20)) {
				t.Fatalf("resume event %s: source %q at %v; want control at %v", e.Type, e.Source, e.Time, at(20))
			}
		}
		if stored.LastSeq != evs[len(evs)-1].Seq {
			t.Fatalf("lastSeq %d, want %d", stored.LastSeq, evs[len(evs)-1].Seq)
		}

		// A second decider for the same loss finds the run moved on.
		_, err = s.ResumeRun(t.Context(), "run-resume", lost(1, 21, "sandbox killed"))
		wantCode(t, err, belay.CodeConflict, "a second resume from attempt 1")
		// A checkpoint of the lost attempt is refused; one of the new
		// attempt must still be newer than the last.
		_, err = s.RecordCheckpoint(t.Context(), "run-resume", ref(2, 1, 2, 22))
		wantCode(t, err, belay.CodeConflict, "a checkpoint of attempt 1 after the resume")
		_, err = s.RecordCheckpoint(t.Context(), "run-resume", ref(1, 2, 2, 22))
		wantCode(t, err, belay.CodeConflict, "an attempt-2 checkpoint not newer than the last")
		prev := mustRecord(t, s, "run-resume", ref(2, 2, 2, 22))
		sameRef(t, "previous after the resume", &prev, ref(1, 1, 1, 13))
		// The lost attempt's claim is no good any more.
		mustCreateClaim(t, s, newClaim("run-resume", 1, "late", at(300)))
		_, err = s.ConsumeClaim(t.Context(), codeHash("late"), "", at(23))
		wantRefusal(t, err, belay.ClaimWrongAttempt, "a claim of attempt 1 after the resume")

		if _, err := s.ResumeRun(t.Context(), "run-resume", lost(2, 30, "sandbox out of memory")); err != nil {
			t.Fatalf("ResumeRun from attempt 2: %v", err)
		}
		stored = mustGet(t, s, "run-resume")
		want = append(want, belay.LostAttempt{Attempt: 2, StartedAt: at(20), LostAt: at(30), Reason: "sandbox out of memory"})
		if stored.Attempt != 3 || !sameLost(stored.LostAttempts, want) {
			t.Fatalf("after the second resume: attempt %d, lost %+v; want 3, %+v", stored.Attempt, stored.LostAttempts, want)
		}
		// Completion keeps the history.
		done := mustTransition(t, s, "run-resume", belay.StatusCompleted, at(40))
		if done.Attempt != 3 || !sameLost(done.LostAttempts, want) {
			t.Fatalf("completed: attempt %d, lost %+v; want 3, %+v", done.Attempt, done.LostAttempts, want)
		}
		_, err = s.ResumeRun(t.Context(), "run-resume", lost(3, 41, "sandbox killed"))
		wantCode(t, err, belay.CodeConflict, "resume of a completed run")
	})

	t.Run("resume_refusals", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-cancelled")
		if _, err := s.RequestCancel(t.Context(), "run-cancelled", at(15)); err != nil {
			t.Fatal(err)
		}
		n := len(allEvents(t, s, "run-cancelled").Events)
		_, err := s.ResumeRun(t.Context(), "run-cancelled", lost(1, 20, "sandbox killed"))
		wantCode(t, err, belay.CodeConflict, "resume of a run whose cancel was requested")
		if r := mustGet(t, s, "run-cancelled"); r.Attempt != 1 || len(r.LostAttempts) != 0 || len(allEvents(t, s, "run-cancelled").Events) != n {
			t.Fatalf("a refused resume wrote: attempt %d, lost %+v", r.Attempt, r.LostAttempts)
		}
		createIn(t, s, "run-queued", belay.StatusQueued)
		_, err = s.ResumeRun(t.Context(), "run-queued", lost(1, 20, "sandbox killed"))
		wantCode(t, err, belay.CodeConflict, "resume of a queued run")
		_, err = s.ResumeRun(t.Context(), "run-missing", lost(1, 20, "sandbox killed"))
		wantCode(t, err, belay.CodeNotFound, "resume of a missing run")
		startAttempt(t, s, "run-bad")
		for _, bad := range []belay.Resume{
			{From: 0, At: at(20), Reason: "x"},
			{From: 1, Reason: "x"},
			{From: 1, At: at(20)},
			{From: 1, At: at(20), Reason: "x", Events: []belay.EventInput{{Type: ""}}},
		} {
			_, err := s.ResumeRun(t.Context(), "run-bad", bad)
			wantCode(t, err, belay.CodeInvalid, name("resume %+v", bad))
		}
	})

	t.Run("resume_once", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-race")
		errs := parallel(8, func(int) error {
			_, err := s.ResumeRun(t.Context(), "run-race", lost(1, 20, "sandbox killed"))
			return err
		})
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
				continue
			}
			wantCode(t, err, belay.CodeConflict, "a losing concurrent resume")
		}
		r := mustGet(t, s, "run-race")
		if won != 1 || r.Attempt != 2 || len(r.LostAttempts) != 1 {
			t.Fatalf("8 concurrent resumes from attempt 1: %d won, attempt %d, %d lost attempts; want 1, 2, 1", won, r.Attempt, len(r.LostAttempts))
		}
		if got := eventTypes(allEvents(t, s, "run-race").Events); len(got) != 4 {
			t.Fatalf("events %v; want queued, started, one sandbox.lost and one run.resumed", got)
		}
	})
}

// sameLost compares lost attempts, times by instant.
func sameLost(got, want []belay.LostAttempt) bool {
	return slices.EqualFunc(got, want, func(a, b belay.LostAttempt) bool {
		return a.Attempt == b.Attempt && a.Reason == b.Reason && a.StartedAt.Equal(b.StartedAt) && a.LostAt.Equal(b.LostAt)
	})
}
