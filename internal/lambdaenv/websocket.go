package lambdaenv

import (
	"context"

	"github.com/belay-dev/belay/internal/apigatewayws"
)

// EnvWebSocketEndpoint is the ws function's WebSocket API stage URL
// (https://{api-id}.execute-api.{region}.amazonaws.com/{stage}), where it
// posts to connections (API Gateway's management API); a local server in
// tests.
const EnvWebSocketEndpoint = "BELAY_WS_ENDPOINT"

// WebSocketPoster returns the management API of the WebSocket API at
// EnvWebSocketEndpoint, signing with the function's credentials.
func (e *Env) WebSocketPoster(ctx context.Context) (*apigatewayws.ManagementAPI, error) {
	endpoint, err := e.Require(EnvWebSocketEndpoint, "the WebSocket API's stage URL")
	if err != nil {
		return nil, err
	}
	cfg, err := e.config(ctx)
	if err != nil {
		return nil, err
	}
	return apigatewayws.NewManagementAPI(endpoint, cfg)
}
