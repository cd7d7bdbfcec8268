// Command stream is the Lambda function behind GET /v1/runs/{id}/events on
// the public REST API, whose integration streams the response
// (responseTransferMode STREAM): the run's events as SSE, resumed from
// DynamoDB at Last-Event-ID, with heartbeats, and closed with a retry hint
// before the integration's limit so the client reconnects and loses
// nothing. The README lists its environment.
package main

import (
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/lambdaenv"
)

func main() {
	env := lambdaenv.FromOS("stream")
	log := env.Logger(os.Stdout)
	h, err := build(env, log)
	if err != nil {
		log.Error("stream: start", "err", err.Error())
		os.Exit(1)
	}
	lambda.Start(h)
}

func build(env *lambdaenv.Env, log *slog.Logger) (apigateway.StreamingHandler, error) {
	ctx, cancel := lambdaenv.InitContext()
	defer cancel()
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	tokens, err := env.ControlTokens(ctx)
	if err != nil {
		return nil, err
	}
	maxStream, err := env.Seconds(lambdaenv.EnvStreamMaxSeconds, lambdaenv.DefaultStreamMax)
	if err != nil {
		return nil, err
	}
	h, err := env.HTTP(lambdaenv.HTTPParts{Store: store, ControlTokens: tokens, Logger: log})
	if err != nil {
		return nil, err
	}
	return apigateway.Streaming(apigateway.Only(h, apigateway.EventsRoute),
		apigateway.StreamOptions{Options: apigateway.Options{Logger: log}, MaxDuration: maxStream}), nil
}
