package sfn

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/orchestrator"
)

// StepResume is the task state after RunSandbox (CONTRACTS.md "Step
// Functions tasks"): it decides whether the run goes on with a new
// sandbox task.
const StepResume = "resume"

// ResumeResult is the resume step's output. With Resume, the state machine
// runs the sandbox task again for Attempt, with Claim as BELAY_CLAIM and
// TimeoutSeconds as its timeout (the same fields as ActivateResult, so the
// next RunSandbox reads them in one place); without, it goes on to
// Validate, which records Reason, when set, as the run's failure: how the
// sandbox was lost and why it was not replaced.
type ResumeResult struct {
	Resume         bool   `json:"resume"`
	RunID          string `json:"runId"`
	Attempt        int    `json:"attempt"`
	Claim          string `json:"claim,omitempty"`
	TimeoutSeconds int    `json:"timeoutSeconds,omitempty"`
	Reason         string `json:"reason,omitempty"`
}

// ParseMaxResumes reads belay.EnvMaxResumes for TasksConfig.MaxResumes:
// unset is the default (0), "0" turns resumes off (-1), 1 to
// belay.MaxMaxResumes is that many. Anything else is an error naming the
// variable.
func ParseMaxResumes(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > belay.MaxMaxResumes {
		return 0, fmt.Errorf("%s is %q; want a whole number from 0 to %d", belay.EnvMaxResumes, v, belay.MaxMaxResumes)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// resume decides, after the run's sandbox task of req.Attempt stopped
// (req.Task, or the Catch's req.Error), whether the run resumes, exactly
// as the embedded orchestrator does (orchestrator.SandboxLost,
// DecideResume, ResumeOf): a task that uploaded a result, or was stopped
// on purpose, goes on to Validate; a lost one is replaced while the run
// has resumes and time left and no cancel was asked. A replacement moves
// the run to its next attempt (sandbox.lost, run.resumed) and issues that
// attempt's claim code. When resumes are used up it appends sandbox.lost
// and says why in Reason.
//
// A repeated resume (Step Functions retries a task whose Lambda call
// failed in transit) finds the run already at the next attempt with no
// task yet, and issues a new code for it.
func (t *Tasks) resume(ctx context.Context, req TaskRequest) (ResumeResult, error) {
	run, err := t.store.GetRun(ctx, req.RunID)
	if err != nil {
		return ResumeResult{}, fmt.Errorf("resume run %s: %w", req.RunID, err)
	}
	res := ResumeResult{RunID: run.ID, Attempt: run.Attempt}
	if run.Status != belay.StatusRunning {
		return res, nil
	}
	if req.Attempt != run.Attempt {
		n := len(run.LostAttempts)
		if run.Attempt == req.Attempt+1 && n > 0 && run.LostAttempts[n-1].Attempt == req.Attempt && run.SandboxRef == "" {
			t.log.Info("resume repeated; issuing a new claim code", "run_id", run.ID, "attempt", run.Attempt)
			return t.claimAttempt(ctx, run)
		}
		return ResumeResult{}, belay.Errorf(belay.CodeConflict, "run %s is at attempt %d, not %d", run.ID, run.Attempt, req.Attempt)
	}
	exit, waitErr := ExitOf(req.Task, req.Error)
	files := orchestrator.ReadOutputs(ctx, t.artifacts, run, t.log.With("run_id", run.ID))
	lost, isLost := orchestrator.SandboxLost(exit, files, waitErr)
	if !isLost || t.maxResumes < 1 {
		return res, nil
	}
	now := t.now().UTC()
	resume, why := orchestrator.DecideResume(run, lost, t.maxResumes, now)
	if resume {
		capability, err := t.store.GetCapability(ctx, run.ID)
		if err != nil {
			return ResumeResult{}, fmt.Errorf("resume run %s: %w", run.ID, err)
		}
		if capability.State != belay.CapabilityActive || !capability.ExpiresAt.After(now.Add(time.Second)) {
			resume, why = false, lost
		}
	}
	if !resume {
		// One sandbox.lost per attempt, however often this is retried.
		batch := "resume:lost:" + strconv.Itoa(run.Attempt)
		if _, err := t.store.AppendEvents(ctx, run.ID, batch, []belay.EventInput{orchestrator.LostEvent(run, lost, exit, false, now)}); err != nil {
			return ResumeResult{}, fmt.Errorf("resume run %s: %w", run.ID, err)
		}
		t.log.Info("sandbox lost; the run is not resumed", "run_id", run.ID, "attempt", run.Attempt, "lost", lost, "reason", why)
		res.Reason = why
		return res, nil
	}
	next, err := t.store.ResumeRun(ctx, run.ID, orchestrator.ResumeOf(run, lost, exit, t.maxResumes, now))
	if err != nil {
		return ResumeResult{}, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	t.log.Info("sandbox lost; resuming the run on a new task", "run_id", run.ID, "attempt", next.Attempt, "lost", lost)
	return t.claimAttempt(ctx, next)
}

// claimAttempt stores a claim code for the run's current attempt and
// answers the resume with it, and with the time left until the run's
// deadline plus the grace as the task's timeout.
func (t *Tasks) claimAttempt(ctx context.Context, run belay.Run) (ResumeResult, error) {
	now := t.now().UTC()
	code, claim, err := belay.NewClaim(run.ID, run.Attempt, now, t.entropy)
	if err != nil {
		return ResumeResult{}, err
	}
	if err := t.store.CreateClaim(ctx, claim); err != nil {
		return ResumeResult{}, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	timeout := int(run.Deadline().Add(t.grace).Sub(now).Round(time.Second) / time.Second)
	return ResumeResult{Resume: true, RunID: run.ID, Attempt: run.Attempt, Claim: code.Reveal(), TimeoutSeconds: max(timeout, 1)}, nil
}
