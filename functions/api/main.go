// Command api is the Lambda function behind the public REST API's buffered
// routes: the httpapi handler (through aws-lambda-go-api-proxy) on the
// DynamoDB store, the S3 artifacts and the Step Functions orchestrator.
// The README lists its environment.
package main

import (
	"context"
	"log/slog"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/lambdaenv/gitenv"
)

func main() { lambdaenv.Start("api", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (apigateway.BufferedHandler, error) {
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
	// BELAY_AUTH: the control-plane token, or the IAM caller API Gateway
	// authenticated.
	auth, err := env.PublicAuth(ctx, log)
	if err != nil {
		return nil, err
	}
	h, err := env.HTTP(lambdaenv.HTTPParts{Store: store, Artifacts: artifacts, Orchestrator: orch, PublicAuth: auth, Logger: log,
		// Git sources of runs and sessions are fetched here, with the
		// control plane's git credentials (BELAY_GIT_CREDENTIALS(_SECRET_ARN);
		// none: anonymous fetches), read at the first fetch.
		Git: gitenv.NewFetcher(env, log),
		// Sessions: each turn's workspace is built with go-git.
		Workspaces: gitsource.Workspaces{}})
	if err != nil {
		return nil, err
	}
	return apigateway.Buffered(apigateway.NoStreams(apigateway.Only(h, apigateway.Public)), apigateway.Options{Logger: log}), nil
}
