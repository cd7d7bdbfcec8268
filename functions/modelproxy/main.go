// Command modelproxy is the Lambda function behind POST
// /internal/v1/chat/completions on the private REST API: it checks the
// run token, the body and the run's budget, and only then attaches the
// provider key and forwards the call. It is the only function that reads
// the provider-key secret (Secrets Manager, cached, fetched again when the
// provider answers 401). Its integration streams the response, so a long
// model call is not cut at a buffered integration's 29 s. The README
// lists its environment.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/modelprovider"
)

func main() { lambdaenv.Start("modelproxy", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (apigateway.StreamingHandler, error) {
	store, err := env.Store(ctx, log)
	if err != nil {
		return nil, err
	}
	signer, err := env.Signer(ctx, nil)
	if err != nil {
		return nil, err
	}
	// The provider (BELAY_MODEL_PROVIDER: openai, anthropic or bedrock)
	// with its key, or, for Bedrock, the function role's credentials.
	deps := modelprovider.Deps{Logger: log}
	key, hasKey, err := env.ModelKey(ctx)
	if err != nil {
		return nil, err
	}
	if hasKey {
		deps.Key = key
	} else if cfg, err := env.AWSConfig(ctx); err == nil {
		deps.AWS = &cfg
	}
	provider, _, err := modelprovider.FromEnv(ctx, env.Lookup, deps)
	if err != nil {
		return nil, err
	}
	h, err := env.HTTP(lambdaenv.HTTPParts{Store: store, Signer: signer, Provider: provider, Logger: log})
	if err != nil {
		return nil, err
	}
	opts := apigateway.Options{Logger: log, OnResponse: lambdaenv.ObserveHTTP(env.Metrics(os.Stdout))}
	return apigateway.Streaming(apigateway.Only(h, apigateway.ModelProxy), apigateway.StreamOptions{Options: opts}), nil
}
