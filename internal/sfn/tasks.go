package sfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

// NewTasks checks cfg and returns the handler.
func NewTasks(cfg TasksConfig) (*Tasks, error) {
	if cfg.Store == nil || cfg.Artifacts == nil {
		return nil, errors.New("sfn: TasksConfig.Store and Artifacts are required")
	}
	t := &Tasks{store: cfg.Store, artifacts: cfg.Artifacts, tasks: cfg.Tasks, taskARN: cfg.TaskARN,
		metrics: cfg.Metrics, log: cfg.Logger, now: cfg.Now}
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
	exit, waitErr := ExitOf(req.Task, req.Error)
	files, err := t.outputs(ctx, run, req.Attempt)
	if err != nil {
		return Outcome{}, fmt.Errorf("validate run %s: %w", req.RunID, err)
	}
	exit.Files = files
	out := orchestrator.Validate(run, exit, waitErr)
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

// outputs reads what the sandbox of the attempt uploaded, by name; an
// output it did not upload is left out (validation then says what is
// missing).
func (t *Tasks) outputs(ctx context.Context, run belay.Run, attempt int) (map[string][]byte, error) {
	files := make(map[string][]byte)
	for _, name := range belay.ArtifactNames {
		content, err := t.artifacts.GetArtifact(ctx, run.ID, stagingName(attempt, name))
		if belay.IsCode(err, belay.CodeNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read output %s: %w", name, err)
		}
		files[name] = content
	}
	return files, nil
}

func stagingName(attempt int, name string) string {
	return fmt.Sprintf("sandbox-%d-%s", attempt, name)
}
