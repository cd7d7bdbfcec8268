// Command ws is the Lambda function of the sessions' WebSocket API (API
// Gateway WebSocket API, routes $connect, $default and $disconnect, one
// function switching on the route key) and of the table's stream, from
// which it pushes each session's new events to its connections with
// PostToConnection (internal/apigatewayws). The README lists its
// environment.
package main

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/belay-dev/belay/internal/apigatewayws"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/lambdaenv"
)

func main() { lambdaenv.Start("ws", build) }

func build(ctx context.Context, env *lambdaenv.Env, log *slog.Logger) (func(context.Context, json.RawMessage) (any, error), error) {
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
	mode, err := env.Auth()
	if err != nil {
		return nil, err
	}
	auth, err := env.PublicAuth(ctx, log)
	if err != nil {
		return nil, err
	}
	poster, err := env.WebSocketPoster(ctx)
	if err != nil {
		return nil, err
	}
	srv, err := env.HTTP(lambdaenv.HTTPParts{Store: store, Artifacts: artifacts, Orchestrator: orch, PublicAuth: auth, Logger: log,
		// Sessions: each turn's workspace is built with go-git.
		Workspaces: gitsource.Workspaces{}})
	if err != nil {
		return nil, err
	}
	// With BELAY_AUTH=sigv4 API Gateway checks the caller's signature on
	// $connect (the stack's auth=sigv4); otherwise the control-plane token.
	h, err := apigatewayws.New(apigatewayws.Config{Server: srv, Store: store, Poster: poster, Logger: log,
		GatewayAuthorized: mode == lambdaenv.AuthSigV4})
	if err != nil {
		return nil, err
	}
	return h.Handle, nil
}
