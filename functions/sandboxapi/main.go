// Command sandboxapi is the Lambda function behind the private REST API's
// internal routes other than the model proxy: the claim exchange
// (POST /internal/v1/claim), event append and approvals. The README lists
// its environment.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/lambdaenv"
)

func main() { lambdaenv.Start("sandboxapi", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (apigateway.BufferedHandler, error) {
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	artifacts, err := env.Artifacts(ctx)
	if err != nil {
		return nil, err
	}
	signer, err := env.Signer(ctx, nil)
	if err != nil {
		return nil, err
	}
	h, err := env.HTTP(lambdaenv.HTTPParts{Store: store, Artifacts: artifacts, Signer: signer, Presigner: artifacts, Logger: log})
	if err != nil {
		return nil, err
	}
	opts := apigateway.Options{Logger: log, OnResponse: lambdaenv.ObserveHTTP(env.Metrics(os.Stdout))}
	return apigateway.Buffered(apigateway.Only(h, apigateway.SandboxAPI), opts), nil
}
