// Command webhook is the Lambda function behind POST /v1/webhooks/github on
// the public REST API: it verifies a GitHub delivery's signature, matches
// it against the triggers, records it once, and puts the normalized
// repository event on belay's bus for the dispatcher, answering with the
// run id it promises (or why nothing starts). The README lists its
// environment.
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/webhook"
	"github.com/belay-dev/belay/internal/wire"
)

func main() { lambdaenv.Start("webhook", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (apigateway.BufferedHandler, error) {
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	trig, _, err := env.Triggers()
	if err != nil {
		return nil, err
	}
	secret, err := env.WebhookSecret(ctx)
	if err != nil {
		return nil, err
	}
	bus, err := env.EventBus(ctx)
	if err != nil {
		return nil, err
	}
	h, err := webhook.New(webhook.Config{Secret: secret, Triggers: trig, Deliveries: store, Runs: store, Bus: bus, Logger: log})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+wire.GitHubWebhookPath, h)
	return apigateway.Buffered(mux, apigateway.Options{Logger: log}), nil
}
