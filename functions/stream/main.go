// Command stream is the Lambda function behind GET /v1/runs/{id}/events
// and GET /v1/sessions/{id}/events on the public REST API, whose
// integrations stream the response (responseTransferMode STREAM): the
// events as SSE (or NDJSON), resumed from DynamoDB at Last-Event-ID, with
// heartbeats, and closed with a retry hint before the integration's limit
// so the client reconnects and loses nothing. It only reads the table. The
// README lists its environment.
package main

import (
	"context"
	"log/slog"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/lambdaenv"
)

func main() { lambdaenv.Start("stream", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (apigateway.StreamingHandler, error) {
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	auth, err := env.PublicAuth(ctx, log) // BELAY_AUTH
	if err != nil {
		return nil, err
	}
	maxStream, err := env.Seconds(lambdaenv.EnvStreamMaxSeconds, lambdaenv.DefaultStreamMax)
	if err != nil {
		return nil, err
	}
	h, err := env.HTTP(lambdaenv.HTTPParts{Store: store, PublicAuth: auth, ReadSessions: true, Logger: log})
	if err != nil {
		return nil, err
	}
	return apigateway.Streaming(apigateway.Only(h, apigateway.StreamRoutes),
		apigateway.StreamOptions{Options: apigateway.Options{Logger: log}, MaxDuration: maxStream}), nil
}
