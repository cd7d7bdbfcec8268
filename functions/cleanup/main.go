// Command cleanup is the EventBridge target for the runs' executions that
// end ABORTED, TIMED_OUT or FAILED, for which Step Functions runs no Catch:
// it finalizes the run (cancelled or failed), revokes its capability and
// stops its task, idempotently. The README lists its environment.
package main

import (
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/sfn"
)

func main() {
	env := lambdaenv.FromOS("cleanup")
	log := env.Logger(os.Stdout)
	cleanup, err := build(env, log)
	if err != nil {
		log.Error("cleanup: start", "err", err.Error())
		os.Exit(1)
	}
	lambda.Start(cleanup.Handle)
}

func build(env *lambdaenv.Env, log *slog.Logger) (*sfn.Cleanup, error) {
	ctx, cancel := lambdaenv.InitContext()
	defer cancel()
	store, err := env.Store(ctx, log)
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
	return sfn.NewCleanup(sfn.CleanupConfig{
		Store: store, StateMachineARN: machine, Tasks: ecsTasks, TaskARN: lambdaenv.TaskARN,
		Metrics: env.Metrics(os.Stdout), Logger: log,
	})
}
