// Command publisher is the target of the EventBridge rule on run status
// changes: for a run a repository event started that has ended, it writes
// the safe outputs (the validated patch pushed as belay/<runId>, a pull
// request, an outcome comment) with the control plane's credentials. The
// README lists its environment.
package main

import (
	"context"
	"log/slog"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/lambdaenv/gitenv"
	"github.com/belay-dev/belay/internal/publish"
)

func main() { lambdaenv.Start("publisher", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (func(context.Context, belay.BusEvent) (publish.Result, error), error) {
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	artifacts, err := env.Artifacts(ctx)
	if err != nil {
		return nil, err
	}
	creds, err := gitenv.Credentials(ctx, env)
	if err != nil {
		return nil, err
	}
	gh, err := gitenv.GitHub(ctx, env, creds)
	if err != nil {
		return nil, err
	}
	p, err := publish.New(publish.Config{
		Store: store, Artifacts: artifacts, Sources: artifacts,
		Git: gitsource.New(gitsource.Config{Credentials: creds, Logger: log}), GitHub: gh, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return p.HandleBusEvent, nil
}
