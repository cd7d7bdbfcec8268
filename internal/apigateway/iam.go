package apigateway

import (
	"log/slog"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
)

// IAMCaller returns the IAM identity API Gateway authenticated for a
// request, from the event's request context (which both adapters put in
// the request's context): for a method whose authorization is AWS_IAM,
// API Gateway checks the caller's SigV4 signature and IAM policy before
// it invokes the function, and fills requestContext.identity with the
// caller's ARN (userArn) and principal id (caller). ok is false when
// either is empty, as it is for a method without IAM authorization, or
// for a request that did not come through API Gateway.
func IAMCaller(r *http.Request) (identity events.APIGatewayRequestIdentity, ok bool) {
	gw, found := core.GetAPIGatewayContextFromContext(r.Context())
	if !found {
		return events.APIGatewayRequestIdentity{}, false
	}
	id := gw.Identity
	return id, id.UserArn != "" && id.Caller != ""
}

// errNoIAMIdentity is the refusal of a request without an IAM identity.
var errNoIAMIdentity = belay.Errorf(belay.CodeUnauthorized, "the request carries no AWS IAM identity: sign it with SigV4 (BELAY_AUTH=sigv4 in the CLI)")

// RequireIAM returns the public routes' authenticator under
// BELAY_AUTH=sigv4: a request goes on only when API Gateway says it
// authenticated an IAM identity (IAMCaller). The functions then hold no
// control-plane token, and a request without that identity — a method
// deployed without IAM authorization, say — is refused 401 unauthorized:
// it fails closed. A refusal is logged as a warning with the API Gateway
// request id, so an operator can find the misconfigured method; the ARN of
// an accepted caller goes in the access line (it is no secret).
func RequireIAM(log *slog.Logger) httpapi.Authenticator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(r *http.Request) error {
		if _, ok := IAMCaller(r); ok {
			return nil
		}
		gwID := ""
		if gw, ok := core.GetAPIGatewayContextFromContext(r.Context()); ok {
			gwID = gw.RequestID
		}
		log.WarnContext(r.Context(), "public request without an IAM identity: is the method's authorization AWS_IAM?",
			"apigw_request_id", gwID, "run_id", RunIDOf(r.URL.Path), "method", r.Method, "path", r.URL.Path)
		return errNoIAMIdentity
	}
}
