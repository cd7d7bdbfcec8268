package sfn

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/emf"
	"github.com/belay-dev/belay/internal/orchestrator"
)

// The steps the state machine's task states name.
const (
	StepActivate = "activate"
	StepValidate = "validate"
	StepFinalize = "finalize"
	StepFail     = "fail"
)

// TaskRequest is the input of every task state: the step and what it
// needs. Fields a step does not use are absent.
type TaskRequest struct {
	Step    string `json:"step"`
	RunID   string `json:"runId"`
	Attempt int    `json:"attempt,omitempty"`
	// Task is the RunTask state's output (ECS's description of the
	// stopped task), or null when the state failed.
	Task json.RawMessage `json:"task,omitempty"`
	// Error is the Catch's error, or null.
	Error   *StateError `json:"error,omitempty"`
	Outcome *Outcome    `json:"outcome,omitempty"`
}

// StateError is what a Catch passes on: the error's name and its cause.
type StateError struct {
	Error string `json:"Error"`
	Cause string `json:"Cause"`
}

// ActivateResult is the activate step's output: the claim code the task
// gets as BELAY_CLAIM, and how long the RunTask state may wait for it
// (TimeoutSecondsPath).
type ActivateResult struct {
	RunID          string `json:"runId"`
	Attempt        int    `json:"attempt"`
	Claim          string `json:"claim"`
	TimeoutSeconds int    `json:"timeoutSeconds"`
}

// FinalizeResult is the finalize and fail steps' output.
type FinalizeResult struct {
	Status belay.RunStatus `json:"status"`
}

// TasksConfig is what the steps function needs. Store and Artifacts are
// required.
type TasksConfig struct {
	Store     belay.Store
	Artifacts belay.ArtifactStore
	// Tasks stops the run's sandbox task on the fail path; nil skips it.
	Tasks   TaskStopper
	TaskARN func(belay.Run) string
	Metrics *emf.Recorder
	Logger  *slog.Logger
	Now     func() time.Time
	// Entropy feeds claim codes. Nil means crypto/rand.
	Entropy io.Reader
	// TokenGrace is how long the run's capability, and the RunTask state,
	// outlive its wall time. Zero means orchestrator.DefaultTokenGrace.
	TokenGrace time.Duration
}

// Tasks is the steps function's handler: one entry point that switches on
// the request's step.
type Tasks struct {
	store     belay.Store
	artifacts belay.ArtifactStore
	tasks     TaskStopper
	taskARN   func(belay.Run) string
	metrics   *emf.Recorder
	log       *slog.Logger
	now       func() time.Time
	entropy   io.Reader
	grace     time.Duration
}

// NewTasks checks cfg and returns the handler.
func NewTasks(cfg TasksConfig) (*Tasks, error) {
	if cfg.Store == nil || cfg.Artifacts == nil {
		return nil, errors.New("sfn: TasksConfig.Store and Artifacts are required")
	}
	t := &Tasks{store: cfg.Store, artifacts: cfg.Artifacts, tasks: cfg.Tasks, taskARN: cfg.TaskARN,
		metrics: cfg.Metrics, log: cfg.Logger, now: cfg.Now, entropy: cfg.Entropy, grace: cfg.TokenGrace}
	if t.entropy == nil {
		t.entropy = rand.Reader
	}
	if t.grace <= 0 {
		t.grace = orchestrator.DefaultTokenGrace
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.now == nil {
		t.now = time.Now
	}
	if t.taskARN == nil {
		t.taskARN = func(belay.Run) string { return "" }
	}
	return t, nil
}

// Handle runs one step. An unknown step or a request without a run id is
// an error, which fails the task state (and its Catch goes to fail).
func (t *Tasks) Handle(ctx context.Context, req TaskRequest) (any, error) {
	if !strings.HasPrefix(req.RunID, "run_") {
		return nil, fmt.Errorf("step %q: runId %q is not a run id", req.Step, req.RunID)
	}
	switch req.Step {
	case StepActivate:
		return t.activate(ctx, req.RunID)
	case StepValidate:
		return t.validate(ctx, req)
	case StepFinalize:
		if req.Outcome == nil {
			return nil, fmt.Errorf("finalize run %s: no outcome", req.RunID)
		}
		return t.finalize(ctx, req.RunID, *req.Outcome)
	case StepFail:
		return t.fail(ctx, req)
	}
	return nil, fmt.Errorf("unknown step %q (want %s, %s, %s or %s)", req.Step, StepActivate, StepValidate, StepFinalize, StepFail)
}

// finalize revokes the run's capability (its sandbox is gone) and records
// the outcome.
func (t *Tasks) finalize(ctx context.Context, runID string, out Outcome) (FinalizeResult, error) {
	if err := t.store.RevokeCapability(ctx, runID); err != nil {
		return FinalizeResult{}, fmt.Errorf("finalize run %s: %w", runID, err)
	}
	run, changed, err := Finalize(ctx, t.store, t.log, runID, out, t.now())
	if err != nil {
		return FinalizeResult{}, err
	}
	if changed {
		t.metrics.Count(emf.RunOutcomes, 1, "Status", string(run.Status))
	}
	return FinalizeResult{Status: run.Status}, nil
}

// fail ends a run whose execution took a Catch: revoke, stop its task if it
// recorded one, and finalize it failed with the error's name as reason (the
// cause stays in the execution's history; it may quote anything).
func (t *Tasks) fail(ctx context.Context, req TaskRequest) (FinalizeResult, error) {
	name := "unknown error"
	if req.Error != nil && req.Error.Error != "" {
		name = req.Error.Error
	}
	reason := ReasonOrchestration + ": " + boundReason(name)
	t.log.Error("execution failed", "run_id", req.RunID, "error", boundReason(name))
	res, err := t.finalize(ctx, req.RunID, Outcome{Status: belay.StatusFailed, Reason: reason})
	if err != nil {
		return res, err
	}
	t.stopTask(ctx, req.RunID, "belay: "+reason)
	return res, nil
}

// stopTask stops the run's recorded task, if any, logging a failure: the
// run's state is already written.
func (t *Tasks) stopTask(ctx context.Context, runID, reason string) {
	if t.tasks == nil {
		return
	}
	run, err := t.store.GetRun(ctx, runID)
	if err != nil {
		t.log.Error("stop task: read run", "run_id", runID, "err", err.Error())
		return
	}
	if arn := t.taskARN(run); arn != "" {
		if err := t.tasks.StopTask(ctx, arn, reason); err != nil {
			t.log.Error("stop task", "run_id", runID, "err", err.Error())
		}
	}
}

// boundReason keeps an error name short and printable: it ends up in the
// run's public reason.
func boundReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > 100 {
		s = s[:100]
	}
	return s
}

// validate decides the run's outcome from how its task ended and the
// outputs the sandbox uploaded, and stores the validated artifacts under
// their public names. The sandbox does not decide: orchestrator.Validate
// does, as embedded.
func (t *Tasks) validate(ctx context.Context, req TaskRequest) (Outcome, error) {
	run, err := t.store.GetRun(ctx, req.RunID)
	if err != nil {
		return Outcome{}, fmt.Errorf("validate run %s: %w", req.RunID, err)
	}
	if req.Attempt != 0 && req.Attempt != run.Attempt {
		// The run moved on (a resume) since this state's input was made;
		// the run's own attempt is the one whose outputs count.
		t.log.Warn("validate: the state's attempt is not the run's", "run_id", run.ID, "state_attempt", req.Attempt, "run_attempt", run.Attempt)
	}
	exit, waitErr := ExitOf(req.Task, req.Error)
	if waitErr != nil {
		// The task did not simply exit (timed out, lost): make sure it is
		// gone before the outcome is recorded.
		t.stopTask(ctx, run.ID, "belay: "+boundReason(waitErr.Error()))
	}
	files := orchestrator.ReadOutputs(ctx, t.artifacts, run, t.log.With("run_id", run.ID))
	out := orchestrator.Validate(run, exit, files, waitErr)
	res := Outcome{Status: out.Status, Reason: out.Reason, ExitCode: out.ExitCode, Checks: out.Checks, ChangedFiles: out.ChangedFiles}
	for _, name := range belay.ArtifactNames {
		content, ok := out.Files[name]
		if !ok {
			continue
		}
		if err := t.artifacts.PutArtifact(ctx, run.ID, name, content); err != nil {
			t.log.Error("store artifact", "run_id", run.ID, "artifact", name, "size", len(content), "err", err.Error())
			continue
		}
		res.Artifacts = append(res.Artifacts, name)
	}
	t.log.Info("run validated", "run_id", run.ID, "status", res.Status, "reason", res.Reason)
	return res, nil
}

// activate starts the run's first attempt: it moves the queued run to
// running (attempt 1, run.started), gives it its capability (expiring
// TokenGrace after its wall time, as embedded) and a claim code for the
// task, and says how long the RunTask state may wait: until the run's
// deadline (its start plus its wall time) plus the grace.
//
// A retried activate (Step Functions retries a task whose Lambda call
// failed in transit) finds the run running at attempt 1 with no sandbox
// yet, and issues a new code for the same attempt. A run cancelled before
// it started is finalized cancelled, and activate fails, so the execution
// goes to its fail step (which changes nothing more).
func (t *Tasks) activate(ctx context.Context, runID string) (ActivateResult, error) {
	run, err := t.store.GetRun(ctx, runID)
	if err != nil {
		return ActivateResult{}, fmt.Errorf("activate run %s: %w", runID, err)
	}
	now := t.now().UTC()
	switch {
	case run.Status == belay.StatusQueued && run.CancelRequested:
		if _, _, err := Finalize(ctx, t.store, t.log, runID, Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled}, now); err != nil {
			return ActivateResult{}, err
		}
		return ActivateResult{}, belay.Errorf(belay.CodeConflict, "run %s was cancelled before it started", runID)
	case run.Status == belay.StatusQueued:
		req := run.Request
		started, err := json.Marshal(struct {
			MaxRequests     int `json:"maxRequests"`
			WallTimeSeconds int `json:"wallTimeSeconds"`
		}{req.MaxRequests(), req.WallTimeSeconds})
		if err != nil {
			return ActivateResult{}, fmt.Errorf("activate run %s: %w", runID, err)
		}
		run, err = t.store.Transition(ctx, runID, belay.Transition{
			To: belay.StatusRunning, At: now, Attempt: 1,
			Events: []belay.EventInput{{Time: now, Type: belay.EventRunStarted, Data: started}},
		})
		if err != nil {
			return ActivateResult{}, fmt.Errorf("activate run %s: %w", runID, err)
		}
		if err := t.store.ActivateCapability(ctx, belay.Capability{
			RunID:       runID,
			Model:       req.Model,
			State:       belay.CapabilityActive,
			ExpiresAt:   run.StartedAt.Add(time.Duration(req.WallTimeSeconds)*time.Second + t.grace),
			MaxRequests: req.MaxRequests(),
		}); err != nil {
			return ActivateResult{}, fmt.Errorf("activate capability of run %s: %w", runID, err)
		}
	case run.Status == belay.StatusRunning && run.Attempt == 1 && run.SandboxRef == "":
		t.log.Info("activate repeated; issuing a new claim code for attempt 1", "run_id", runID)
	default:
		return ActivateResult{}, belay.Errorf(belay.CodeConflict, "run %s is %s at attempt %d; only a queued run is activated", runID, run.Status, run.Attempt)
	}

	code, claim, err := belay.NewClaim(runID, run.Attempt, now, t.entropy)
	if err != nil {
		return ActivateResult{}, err
	}
	if err := t.store.CreateClaim(ctx, claim); err != nil {
		return ActivateResult{}, fmt.Errorf("activate run %s: %w", runID, err)
	}
	deadline := run.StartedAt.Add(time.Duration(run.Request.WallTimeSeconds) * time.Second)
	timeout := int(deadline.Add(t.grace).Sub(now).Round(time.Second) / time.Second)
	t.log.Info("run started", "run_id", runID, "attempt", run.Attempt, "timeout_seconds", timeout,
		"wall_time_seconds", run.Request.WallTimeSeconds, "max_requests", run.Request.MaxRequests())
	return ActivateResult{RunID: runID, Attempt: run.Attempt, Claim: code.Reveal(), TimeoutSeconds: max(timeout, 1)}, nil
}
