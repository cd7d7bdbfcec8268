// Command dispatcher is the target of the EventBridge rules on repository
// events (belay's own from the webhook, CodeCommit's from the default bus):
// it matches the event against the triggers, fetches the source with the
// control plane's git credentials and creates the run through the same
// path as POST /v1/runs, starting its execution. The README lists its
// environment.
package main

import (
	"context"
	"log/slog"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dispatch"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/intake"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/lambdaenv/gitenv"
	"github.com/belay-dev/belay/internal/webhook"
)

func main() { lambdaenv.Start("dispatcher", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (func(context.Context, belay.BusEvent) (dispatch.Outcome, error), error) {
	// With a bus (BELAY_EVENT_BUS), each run state is put on it.
	store, err := env.RunStore(ctx, log)
	if err != nil {
		return nil, err
	}
	artifacts, err := env.Artifacts(ctx)
	if err != nil {
		return nil, err
	}
	orch, err := env.Orchestrator(ctx, store, log)
	if err != nil {
		return nil, err
	}
	trig, lim, err := env.Triggers()
	if err != nil {
		return nil, err
	}
	creds, err := gitenv.Credentials(ctx, env)
	if err != nil {
		return nil, err
	}
	runs, err := intake.New(intake.Config{Store: store, Orchestrator: orch, Git: gitsource.New(gitsource.Config{Credentials: creds, Logger: log}),
		Sources: artifacts, Limits: lim, NewID: webhook.NewRunID, Logger: log})
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(dispatch.Config{Triggers: trig, Intake: runs, Store: store, NewID: webhook.NewRunID, Logger: log})
	if err != nil {
		return nil, err
	}
	return d.HandleBusEvent, nil
}
