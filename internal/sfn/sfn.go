// Package sfn is belay's run sequencing on AWS Step Functions, both sides of
// it: Orchestrator implements the belay.Orchestrator port by starting and
// stopping executions of the state machine the CDK stack defines, and
// Tasks and Cleanup are the Lambda handlers that machine and its
// EventBridge rule call (the steps and cleanup functions). The state
// machine runs the same steps as the embedded orchestrator (activate,
// launch, wait, validate, finalize; revoke and stop on every path), with
// ECS's runTask.sync as launch and wait.
//
// The contract with the state machine (CONTRACTS.md, "Step Functions
// tasks"): the execution's name is the run id and its input
// {"runId": "run_..."}; each task state calls the steps function with
// {"step": "<name>", "runId": ..., ...}.
package sfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/belay-dev/belay/internal/belay"
)

// TaskStopper stops a run's sandbox task (internal/ecs on AWS).
type TaskStopper interface {
	// StopTask stops the task; a task already stopped or gone is not an
	// error.
	StopTask(ctx context.Context, taskARN, reason string) error
}

// ExecutionInput is the input of a run's execution.
type ExecutionInput struct {
	RunID string `json:"runId"`
}

// The error and cause recorded on an execution stopped by a cancel.
const (
	CancelError = "belay.Cancelled"
	CancelCause = "the run was cancelled"
)

// Config is what an Orchestrator needs. Client, StateMachineARN and Store
// are required.
type Config struct {
	Client          *awssfn.Client
	StateMachineARN string
	Store           belay.Store
	// Tasks stops a cancelled run's sandbox task at once, when the run has
	// recorded one. Nil leaves that to the state machine and cleanup.
	Tasks TaskStopper
	// TaskARN returns the sandbox task a run recorded at claim time, or "".
	TaskARN func(belay.Run) string
	Logger  *slog.Logger
	// Now is the clock of stored times. Nil means time.Now.
	Now func() time.Time
}

// Orchestrator starts and stops runs' executions. It implements
// belay.Orchestrator and is safe for concurrent use.
type Orchestrator struct {
	client  *awssfn.Client
	machine string
	store   belay.Store
	tasks   TaskStopper
	taskARN func(belay.Run) string
	log     *slog.Logger
	now     func() time.Time
}

var _ belay.Orchestrator = (*Orchestrator)(nil)

// New checks cfg and returns an Orchestrator.
func New(cfg Config) (*Orchestrator, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("sfn: Config.Client is required")
	case cfg.Store == nil:
		return nil, errors.New("sfn: Config.Store is required")
	case !strings.Contains(cfg.StateMachineARN, ":stateMachine:"):
		return nil, fmt.Errorf("sfn: %q is not a state machine ARN (arn:aws:states:REGION:ACCOUNT:stateMachine:NAME)", cfg.StateMachineARN)
	}
	o := &Orchestrator{client: cfg.Client, machine: cfg.StateMachineARN, store: cfg.Store, tasks: cfg.Tasks, taskARN: cfg.TaskARN, log: cfg.Logger, now: cfg.Now}
	if o.now == nil {
		o.now = time.Now
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if o.taskARN == nil {
		o.taskARN = func(belay.Run) string { return "" }
	}
	return o, nil
}

// ExecutionARN returns the ARN of the execution named name of the state
// machine machineARN.
func ExecutionARN(machineARN, name string) string {
	return strings.Replace(machineARN, ":stateMachine:", ":execution:", 1) + ":" + name
}

// Submit starts the run's execution, named by the run id. Starting it again
// is not an error: Step Functions answers a repeat of the same name and
// input with the running execution, and ExecutionAlreadyExists once it has
// ended, which is taken as done too.
func (o *Orchestrator) Submit(ctx context.Context, runID string) error {
	input, err := json.Marshal(ExecutionInput{RunID: runID})
	if err != nil {
		return fmt.Errorf("submit run %s: %w", runID, err)
	}
	_, err = o.client.StartExecution(ctx, &awssfn.StartExecutionInput{
		StateMachineArn: aws.String(o.machine),
		Name:            aws.String(runID),
		Input:           aws.String(string(input)),
	})
	var exists *types.ExecutionAlreadyExists
	if errors.As(err, &exists) {
		o.log.Info("execution exists already", "run_id", runID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("start execution of run %s: %w", runID, err)
	}
	o.log.Info("execution started", "run_id", runID)
	return nil
}

// Cancel stops the run's execution (its status becomes ABORTED, and the
// cleanup function finalizes the run as cancelled, revokes its capability
// and stops its task) and stops the run's task at once when it has
// recorded one. A run with no execution (its start failed) is finalized as
// cancelled here. It is idempotent and succeeds for a terminal run.
// Returns not_found for an unknown run.
func (o *Orchestrator) Cancel(ctx context.Context, runID string) error {
	run, err := o.store.GetRun(ctx, runID)
	if err != nil {
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	if run.Status.Terminal() {
		return nil
	}
	_, err = o.client.StopExecution(ctx, &awssfn.StopExecutionInput{
		ExecutionArn: aws.String(ExecutionARN(o.machine, runID)),
		Error:        aws.String(CancelError),
		Cause:        aws.String(CancelCause),
	})
	var missing *types.ExecutionDoesNotExist
	switch {
	case errors.As(err, &missing):
		o.log.Info("run has no execution; finalizing it as cancelled", "run_id", runID)
		if _, _, err := Finalize(ctx, o.store, o.log, runID, Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled}, o.now()); err != nil {
			return fmt.Errorf("cancel run %s: %w", runID, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("stop execution of run %s: %w", runID, err)
	}
	o.log.Info("execution stopped", "run_id", runID)
	if arn := o.taskARN(run); arn != "" && o.tasks != nil {
		if err := o.tasks.StopTask(ctx, arn, "belay: "+CancelCause); err != nil {
			return fmt.Errorf("cancel run %s: %w", runID, err)
		}
	}
	return nil
}
