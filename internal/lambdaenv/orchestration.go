package lambdaenv

import (
	"context"
	"log/slog"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/ecs"
	"github.com/belay-dev/belay/internal/sfn"
)

// ECSTasks returns the task stopper of the sandbox cluster EnvClusterARN.
func (e *Env) ECSTasks(ctx context.Context) (*ecs.Tasks, error) {
	cluster, err := e.Require(EnvClusterARN, "give the ARN of the ECS cluster the sandboxes run in")
	if err != nil {
		return nil, err
	}
	client, err := e.ECS(ctx)
	if err != nil {
		return nil, err
	}
	return ecs.New(client, cluster), nil
}

// StateMachineARN returns EnvStateMachineARN.
func (e *Env) StateMachineARN() (string, error) {
	return e.Require(EnvStateMachineARN, "give the ARN of the runs' state machine")
}

// Orchestrator returns the Step Functions orchestrator of EnvStateMachineARN,
// which also stops a cancelled run's task in EnvClusterARN.
func (e *Env) Orchestrator(ctx context.Context, store belay.Store, log *slog.Logger) (*sfn.Orchestrator, error) {
	machine, err := e.StateMachineARN()
	if err != nil {
		return nil, err
	}
	client, err := e.SFN(ctx)
	if err != nil {
		return nil, err
	}
	tasks, err := e.ECSTasks(ctx)
	if err != nil {
		return nil, err
	}
	return sfn.New(sfn.Config{Client: client, StateMachineARN: machine, Store: store, Tasks: tasks, TaskARN: TaskARN, Logger: log})
}

// TaskARN returns the sandbox task a run recorded when it claimed: its
// SandboxRef, which on AWS is the ECS task's ARN.
func TaskARN(run belay.Run) string { return run.SandboxRef }
