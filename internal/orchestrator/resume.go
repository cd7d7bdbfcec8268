package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// Resume (DESIGN.md "Checkpoints and resume"): a sandbox that ends without
// a result, for a run that was not cancelled and has time left, is
// replaced by a new one, a new attempt of the same run, which continues
// from the run's latest checkpoint; at most MaxResumes times. The
// capability is neither reset nor activated again: its budget and its
// expiry, and the run's deadline, span every attempt. Each attempt gets
// fresh tokens and a fresh claim code. The decision and the events are
// made here once, for the embedded orchestrator and for the steps
// function's resume task on AWS alike.

// The reasons of lost sandboxes that are not Validate's own.
const (
	// ReasonRestarted is how a sandbox was lost to a control plane that
	// stopped or died while the run was running.
	ReasonRestarted = "control plane restarted"
	// ReasonNoResult is a sandbox that exited 0 without uploading a
	// result.
	ReasonNoResult = "sandbox exited without a result"
)

// SandboxLost reports whether a sandbox that ended as exit (after Wait's
// waitErr) was lost: it left no result.json for its attempt (files, as
// Collect read them), and it was not stopped on purpose (the run's
// deadline, a cancel, a shutdown). reason says how, in the words Validate
// uses: "sandbox out of memory", "sandbox killed", "sandbox lost",
// "sandbox exited with code N", or ReasonNoResult.
func SandboxLost(exit belay.SandboxExit, files map[string][]byte, waitErr error) (reason string, lost bool) {
	if _, ok := files["result.json"]; ok {
		return "", false
	}
	switch {
	case errors.Is(waitErr, ErrTimeout), errors.Is(waitErr, ErrCancelled), errors.Is(waitErr, ErrShutdown):
		return "", false
	case waitErr != nil:
		return ReasonLost, true
	case exit.OOMKilled && (exit.Signaled || exit.ExitCode != 0):
		// The kernel killed the entry, or something it needed, at the
		// sandbox's memory limit (on Fargate: the task's).
		return ReasonOutOfMemory, true
	case exit.Signaled:
		return ReasonKilled, true
	case exit.ExitCode != 0:
		return fmt.Sprintf("sandbox exited with code %d", exit.ExitCode), true
	}
	return ReasonNoResult, true
}

// DecideResume decides whether a running run whose sandbox was lost
// (lostReason) resumes on a new sandbox at now, with at most maxResumes
// resumes (Attempt-1 done so far). It does not when its cancel was
// requested, when less than belay.MinResumeTime is left before its
// deadline (belay.Run.Deadline, the same for every attempt), when its latest checkpoint is marked unresumable, or when its
// resumes are used up; reason is then what the run fails with, naming the
// attempts. maxResumes below 1 never resumes, and reason is lostReason
// itself.
func DecideResume(run belay.Run, lostReason string, maxResumes int, now time.Time) (resume bool, reason string) {
	deadline := run.Deadline()
	switch {
	case maxResumes < 1:
		return false, lostReason
	case run.Status != belay.StatusRunning || run.CancelRequested:
		return false, lostReason
	case !deadline.IsZero() && deadline.Sub(now) < belay.MinResumeTime:
		return false, fmt.Sprintf("%s on attempt %d, with too little of the run's wall time left to resume", lostReason, run.Attempt)
	case run.Checkpoint != nil && !run.Checkpoint.Resumable():
		return false, fmt.Sprintf("%s on attempt %d; its last checkpoint cannot be resumed from: %s", lostReason, run.Attempt, run.Checkpoint.Unresumable)
	case run.Attempt-1 >= maxResumes:
		return false, fmt.Sprintf("%s on attempt %d; gave up after %d attempts (%d resumes, the limit)", lostReason, run.Attempt, run.Attempt, maxResumes)
	}
	return true, ""
}

// LostEvent is the sandbox.lost event of the run's current attempt.
func LostEvent(run belay.Run, lostReason string, exit belay.SandboxExit, resumes bool, now time.Time) belay.EventInput {
	d := belay.SandboxLostData{Attempt: run.Attempt, Reason: lostReason, Signaled: exit.Signaled, Resumes: resumes}
	if !exit.Signaled && exit.ExitCode != 0 {
		code := exit.ExitCode
		d.ExitCode = &code
	}
	data, _ := json.Marshal(d) // ints, bools and a string: it cannot fail
	return belay.EventInput{Time: now, Type: belay.EventSandboxLost, Data: data}
}

// ResumeOf is the store's resume of run from its current attempt, whose
// sandbox was lost (lostReason), with its sandbox.lost and run.resumed
// events, at now.
func ResumeOf(run belay.Run, lostReason string, exit belay.SandboxExit, maxResumes int, now time.Time) belay.Resume {
	resumed, _ := json.Marshal(belay.RunResumedData{
		Attempt: run.Attempt + 1, Checkpoint: run.Checkpoint, ResumesLeft: max(maxResumes-run.Attempt, 0),
	})
	return belay.Resume{From: run.Attempt, At: now, Reason: lostReason, Events: []belay.EventInput{
		LostEvent(run, lostReason, exit, true, now),
		{Time: now, Type: belay.EventRunResumed, Data: resumed},
	}}
}

// Resume moves the run, whose sandbox of its current attempt was lost
// (lostReason, exit), on to its next attempt (belay.CheckpointStore's
// ResumeRun, with sandbox.lost and run.resumed), and returns it with the
// spec of its next sandbox: fresh tokens, living as long as the
// capability, and a claim code for the new attempt. The capability is
// left as it is. Returns conflict if the run's capability is no longer
// active (a cancel revoked it) or the store refuses the resume (a cancel
// was requested, or the run moved on).
func (o *Orchestrator) Resume(ctx context.Context, run belay.Run, lostReason string, exit belay.SandboxExit) (belay.Run, belay.SandboxSpec, error) {
	now := o.now()
	capability, err := o.store.GetCapability(ctx, run.ID)
	if err != nil {
		return belay.Run{}, belay.SandboxSpec{}, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	ttl := capability.ExpiresAt.Sub(now).Truncate(time.Second)
	if capability.State != belay.CapabilityActive || ttl < time.Second {
		return belay.Run{}, belay.SandboxSpec{}, belay.Errorf(belay.CodeConflict, "run %s: its capability is no longer active; it does not resume", run.ID)
	}
	next, err := o.store.ResumeRun(ctx, run.ID, ResumeOf(run, lostReason, exit, o.maxResumes, now))
	if err != nil {
		return belay.Run{}, belay.SandboxSpec{}, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	set, err := o.signer.IssueSet(run.ID, next.Request.Model, ttl)
	if err != nil {
		return next, belay.SandboxSpec{}, fmt.Errorf("issue tokens of run %s: %w", run.ID, err)
	}
	code, claim, err := belay.NewClaim(run.ID, next.Attempt, now, o.entropy)
	if err != nil {
		return next, belay.SandboxSpec{}, err
	}
	if err := o.store.CreateClaim(ctx, claim); err != nil {
		return next, belay.SandboxSpec{}, fmt.Errorf("store claim of run %s: %w", run.ID, err)
	}
	spec := belay.SpecForRun(next)
	spec.Tokens = belay.SandboxTokens{Model: set.Model, Events: set.Events, Approvals: set.Approvals}
	spec.Claim = code
	seq := int64(0)
	if next.Checkpoint != nil {
		seq = next.Checkpoint.Seq
	}
	o.log.Info("run resumed on a new sandbox", "run_id", run.ID, "attempt", next.Attempt, "lost", lostReason,
		"checkpoint", seq, "resumes_left", max(o.maxResumes-next.Attempt+1, 0))
	return next, spec, nil
}
