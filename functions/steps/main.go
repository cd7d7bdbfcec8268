// Command steps is the Lambda function the runs' state machine calls for
// each task state: one handler that switches on the input's "step"
// (activate, resume, validate, finalize, fail; CONTRACTS.md "Step
// Functions tasks"). The README lists its environment.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/sfn"
)

func main() { lambdaenv.Start("steps", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (func(context.Context, sfn.TaskRequest) (any, error), error) {
	// With a bus (BELAY_EVENT_BUS), each run state is put on it.
	store, err := env.RunStore(ctx, log)
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
	maxResumes, err := sfn.ParseMaxResumes(env.Get(belay.EnvMaxResumes))
	if err != nil {
		return nil, err
	}
	tasks, err := sfn.NewTasks(sfn.TasksConfig{
		Store: store, Artifacts: artifacts, Tasks: ecsTasks, TaskARN: lambdaenv.TaskARN,
		Metrics: env.Metrics(os.Stdout), Logger: log, MaxResumes: maxResumes,
	})
	if err != nil {
		return nil, err
	}
	return tasks.Handle, nil
}
