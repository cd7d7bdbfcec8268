// Package apigateway serves belay's one http.Handler to API Gateway REST
// proxy events in Lambda: buffered, through aws-lambda-go-api-proxy, for
// the public and internal routes that answer at once; and streamed, in API
// Gateway's response-streaming format (the integration's
// responseTransferMode STREAM), for the event stream and the model proxy,
// which may take longer than a buffered integration allows.
//
// Both write one JSON access line per request, with the API Gateway request
// id, the Lambda request id, the handler's own request id (X-Request-Id,
// which its error lines carry), the run id when the path names one and the
// IAM caller's ARN when API Gateway authenticated one, so a request can be
// followed from API Gateway's log to the handler's.
package apigateway

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Options configures an adapter. The zero value is usable.
type Options struct {
	// Logger receives the access lines. Nil discards.
	Logger *slog.Logger
	// OnResponse, when set, is told each request's method, path and
	// status, for metrics.
	OnResponse func(method, path string, status int)
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// BufferedHandler is the Lambda handler of a buffered REST proxy integration.
type BufferedHandler func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error)

// Buffered serves h to buffered API Gateway REST proxy events: the whole
// answer is collected, then returned.
func Buffered(h http.Handler, o Options) BufferedHandler {
	adapter := httpadapter.New(h)
	log := o.logger()
	return func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		start := time.Now()
		resp, err := adapter.ProxyWithContext(ctx, ev)
		if err != nil {
			// A malformed event (a body that claims base64 and is not):
			// API Gateway would not send one, so this is logged as an
			// error and answered as the handler answers one.
			log.ErrorContext(ctx, "api gateway event", "apigw_request_id", ev.RequestContext.RequestID, "err", err.Error())
			return errorResponse(ev, http.StatusBadRequest, belay.CodeInvalid, "the request could not be read"), nil
		}
		access(ctx, log, o, ev, resp.StatusCode, http.Header(resp.MultiValueHeaders).Get(wire.RequestIDHeader), start, "")
		return resp, nil
	}
}

// access writes the access line and tells OnResponse.
func access(ctx context.Context, log *slog.Logger, o Options, ev events.APIGatewayProxyRequest, status int, requestID string, start time.Time, note string) {
	attrs := []any{
		"apigw_request_id", ev.RequestContext.RequestID,
		"request_id", requestID,
		"method", ev.HTTPMethod,
		"path", ev.Path,
		"status", status,
		"duration_ms", time.Since(start).Milliseconds(),
	}
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		attrs = append(attrs, "lambda_request_id", lc.AwsRequestID)
	}
	if id := RunIDOf(ev.Path); id != "" {
		attrs = append(attrs, "run_id", id)
	}
	if arn := ev.RequestContext.Identity.UserArn; arn != "" {
		// The IAM caller API Gateway authenticated (BELAY_AUTH=sigv4):
		// who did what, and no secret.
		attrs = append(attrs, "caller_arn", arn)
	}
	if note != "" {
		attrs = append(attrs, "note", note)
	}
	log.InfoContext(ctx, "request", attrs...)
	if o.OnResponse != nil {
		o.OnResponse(ev.HTTPMethod, ev.Path, status)
	}
}

// RunIDOf returns the run id a route's path names
// (/v1/runs/{id}/..., /internal/v1/runs/{id}/...), or "".
func RunIDOf(path string) string {
	for _, prefix := range []string{"/v1/runs/", "/internal/v1/runs/"} {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			id, _, _ := strings.Cut(rest, "/")
			if strings.HasPrefix(id, "run_") && len(id) <= 64 {
				return id
			}
		}
	}
	return ""
}

// request turns an event into the handler's request, with the API Gateway
// context in its context (core.GetAPIGatewayContextFromContext).
func request(ctx context.Context, ev events.APIGatewayProxyRequest) (*http.Request, error) {
	var acc core.RequestAccessor
	return acc.EventToRequestWithContext(ctx, ev)
}
