package sfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/emf"
)

// The EventBridge event the cleanup function takes.
const (
	StatusChangeSource     = "aws.states"
	StatusChangeDetailType = "Step Functions Execution Status Change"
)

// ExecutionStatus is the detail of a "Step Functions Execution Status
// Change" event, the part cleanup reads.
type ExecutionStatus struct {
	ExecutionARN    string  `json:"executionArn"`
	StateMachineARN string  `json:"stateMachineArn"`
	Name            string  `json:"name"`
	Status          string  `json:"status"`
	Input           *string `json:"input"`
}

// CleanupConfig is what the cleanup function needs. Store and
// StateMachineARN are required.
type CleanupConfig struct {
	Store belay.Store
	// StateMachineARN is the runs' state machine; events of any other
	// are ignored.
	StateMachineARN string
	Tasks           TaskStopper
	TaskARN         func(belay.Run) string
	Metrics         *emf.Recorder
	Logger          *slog.Logger
	Now             func() time.Time
}

// Cleanup ends the runs whose execution ended without running its Catch
// handlers: Step Functions runs none when an execution is stopped
// (ABORTED: a cancel, or an operator) or times out as a whole (TIMED_OUT),
// and a FAILED execution may have failed inside its fail step.
type Cleanup struct {
	store   belay.Store
	machine string
	tasks   TaskStopper
	taskARN func(belay.Run) string
	metrics *emf.Recorder
	log     *slog.Logger
	now     func() time.Time
}

// NewCleanup checks cfg and returns the handler.
func NewCleanup(cfg CleanupConfig) (*Cleanup, error) {
	if cfg.Store == nil {
		return nil, errors.New("sfn: CleanupConfig.Store is required")
	}
	if !strings.Contains(cfg.StateMachineARN, ":stateMachine:") {
		return nil, fmt.Errorf("sfn: %q is not a state machine ARN", cfg.StateMachineARN)
	}
	c := &Cleanup{store: cfg.Store, machine: cfg.StateMachineARN, tasks: cfg.Tasks, taskARN: cfg.TaskARN,
		metrics: cfg.Metrics, log: cfg.Logger, now: cfg.Now}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.taskARN == nil {
		c.taskARN = func(belay.Run) string { return "" }
	}
	return c, nil
}

// Handle takes one status-change event. For an execution of the runs'
// state machine that ended ABORTED, TIMED_OUT or FAILED it revokes the
// run's capability, finalizes the run (cancelled when a cancel was
// requested; else failed with reason "execution aborted", "timeout" or
// "orchestration failed") and stops its task. Every part is idempotent, so
// a repeated event, or one for a run its own steps already ended, changes
// nothing. Other events are logged and ignored. An error makes
// EventBridge retry the event.
func (c *Cleanup) Handle(ctx context.Context, ev events.CloudWatchEvent) error {
	if ev.Source != StatusChangeSource || ev.DetailType != StatusChangeDetailType {
		c.log.Warn("cleanup ignores an event it was not made for", "source", ev.Source, "detail_type", ev.DetailType)
		return nil
	}
	var st ExecutionStatus
	if err := json.Unmarshal(ev.Detail, &st); err != nil {
		return fmt.Errorf("cleanup: read event detail: %w", err)
	}
	if st.StateMachineARN != c.machine {
		c.log.Warn("cleanup ignores another state machine's execution", "state_machine", st.StateMachineARN)
		return nil
	}
	var out Outcome
	switch st.Status {
	case "ABORTED":
		out = Outcome{Status: belay.StatusFailed, Reason: ReasonAborted}
	case "TIMED_OUT":
		out = Outcome{Status: belay.StatusFailed, Reason: ReasonTimeout}
	case "FAILED":
		out = Outcome{Status: belay.StatusFailed, Reason: ReasonOrchestration}
	default:
		c.log.Info("cleanup ignores an execution that ended "+st.Status, "execution", st.Name)
		return nil
	}
	runID := st.Name
	if !strings.HasPrefix(runID, "run_") {
		c.log.Warn("cleanup ignores an execution not named by a run id", "execution", st.Name)
		return nil
	}
	log := c.log.With("run_id", runID)

	if err := c.store.RevokeCapability(ctx, runID); err != nil {
		return fmt.Errorf("cleanup run %s: %w", runID, err)
	}
	run, changed, err := Finalize(ctx, c.store, log, runID, out, c.now())
	if belay.IsCode(err, belay.CodeNotFound) {
		log.Warn("cleanup: the execution's run does not exist")
		return nil
	}
	if err != nil {
		return fmt.Errorf("cleanup run %s: %w", runID, err)
	}
	if changed {
		c.metrics.Count(emf.RunOutcomes, 1, "Status", string(run.Status))
	}
	if arn := c.taskARN(run); arn != "" && c.tasks != nil {
		if err := c.tasks.StopTask(ctx, arn, "belay: execution "+strings.ToLower(st.Status)); err != nil {
			return fmt.Errorf("cleanup run %s: %w", runID, err)
		}
	}
	log.Info("cleaned up after execution", "execution_status", st.Status, "run_status", run.Status, "changed", changed)
	return nil
}
