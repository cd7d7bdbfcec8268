// Command steps is the Lambda function the runs' state machine calls for
// each task state: one handler that switches on the input's "step"
// (activate, validate, finalize, fail; CONTRACTS.md "Step Functions
// tasks"). The README lists its environment.
package main

import (
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/sfn"
)

func main() {
	env := lambdaenv.FromOS("steps")
	log := env.Logger(os.Stdout)
	tasks, err := build(env, log)
	if err != nil {
		log.Error("steps: start", "err", err.Error())
		os.Exit(1)
	}
	lambda.Start(tasks.Handle)
}

func build(env *lambdaenv.Env, log *slog.Logger) (*sfn.Tasks, error) {
	ctx, cancel := lambdaenv.InitContext()
	defer cancel()
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	artifacts, err := env.Artifacts(ctx)
	if err != nil {
		return nil, err
	}
	ecsTasks, err := env.ECSTasks(ctx)
	if err != nil {
		return nil, err
	}
	return sfn.NewTasks(sfn.TasksConfig{
		Store: store, Artifacts: artifacts, Tasks: ecsTasks, TaskARN: lambdaenv.TaskARN,
		Metrics: env.Metrics(os.Stdout), Logger: log,
	})
}
