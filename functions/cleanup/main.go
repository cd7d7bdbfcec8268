// Command cleanup is the EventBridge target for the runs' executions that
// end ABORTED, TIMED_OUT or FAILED, for which Step Functions runs no Catch:
// it finalizes the run (cancelled or failed), revokes its capability and
// stops its task, idempotently. The README lists its environment.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/sfn"
)

func main() { lambdaenv.Start("cleanup", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (func(context.Context, events.CloudWatchEvent) error, error) {
	// With a bus (BELAY_EVENT_BUS), each run state is put on it.
	store, err := env.RunStore(ctx, log)
	if err != nil {
		return nil, err
	}
	machine, err := env.StateMachineARN()
	if err != nil {
		return nil, err
	}
	ecsTasks, err := env.ECSTasks(ctx)
	if err != nil {
		return nil, err
	}
	cleanup, err := sfn.NewCleanup(sfn.CleanupConfig{
		Store: store, StateMachineARN: machine, Tasks: ecsTasks, TaskARN: lambdaenv.TaskARN,
		Metrics: env.Metrics(os.Stdout), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return cleanup.Handle, nil
}
