package apigateway

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

// Only serves the requests allow accepts with h, and answers every other
// with 404 not_found in the handler's error shape: each function serves
// only its own routes, whatever API Gateway sends it.
func Only(h http.Handler, allow func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allow(r) {
			writeError(w, r, http.StatusNotFound, belay.CodeNotFound, "no route for "+r.Method+" "+r.URL.Path+" in this function")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Public accepts the public routes (/v1 and below).
func Public(r *http.Request) bool {
	return r.URL.Path == "/v1" || strings.HasPrefix(r.URL.Path, "/v1/")
}

// Internal accepts the internal routes (/internal/v1/ and below).
func Internal(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/internal/v1/")
}

// ChatCompletionsPath is the model proxy's route.
const ChatCompletionsPath = "/internal/v1/chat/completions"

// ModelProxy accepts only the model proxy's route.
func ModelProxy(r *http.Request) bool { return r.URL.Path == ChatCompletionsPath }

// SandboxAPI accepts the internal routes other than the model proxy.
func SandboxAPI(r *http.Request) bool { return Internal(r) && !ModelProxy(r) }

// StreamRoutes accepts the routes the stream function serves: GET
// /v1/runs/{id}/events and GET /v1/sessions/{id}/events.
func StreamRoutes(r *http.Request) bool {
	return eventsRoute(r, "/v1/runs/") || eventsRoute(r, "/v1/sessions/")
}

// eventsRoute accepts GET <prefix>{id}/events.
func eventsRoute(r *http.Request, prefix string) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok || r.Method != http.MethodGet {
		return false
	}
	id, tail, _ := strings.Cut(rest, "/")
	return id != "" && tail == "events"
}

// NoStreams answers an SSE request for a run's or a session's events with
// 400 invalid naming the streaming route of the same path: a buffered
// integration would hold it until the function's timeout and then lose
// it. Other requests go to h.
func NoStreams(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if StreamRoutes(r) && httpapi.WantsStream(r) {
			writeError(w, r, http.StatusBadRequest, belay.CodeInvalid,
				"this route answers NDJSON; the SSE stream of these events is served by the streaming route of the same path")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// writeError answers before the handler runs, so the request id is API
// Gateway's.
func writeError(w http.ResponseWriter, r *http.Request, status int, code belay.Code, msg string) {
	id := ""
	if gw, ok := core.GetAPIGatewayContextFromContext(r.Context()); ok {
		id = gw.RequestID
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: msg, RequestID: id}})
}

// errorResponse answers an event the adapter could not turn into a request.
func errorResponse(ev events.APIGatewayProxyRequest, status int, code belay.Code, msg string) events.APIGatewayProxyResponse {
	b, _ := json.Marshal(wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: msg, RequestID: ev.RequestContext.RequestID}})
	return events.APIGatewayProxyResponse{
		StatusCode: status,
		MultiValueHeaders: map[string][]string{
			"Content-Type":           {"application/json"},
			"Cache-Control":          {"no-store"},
			"X-Content-Type-Options": {"nosniff"},
		},
		Body: string(b),
	}
}
