package apigateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/apigateway"
)

func TestRunIDOf(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/runs/run_abc":                        "run_abc",
		"/v1/runs/run_abc/events":                 "run_abc",
		"/internal/v1/runs/run_x/outputs/a":       "run_x",
		"/v1/runs":                                "",
		"/v1/runs/notarun/events":                 "",
		"/internal/v1/claim":                      "",
		"/v1/runs/run_" + strings.Repeat("a", 80): "",
	} {
		if got := apigateway.RunIDOf(path); got != want {
			t.Errorf("RunIDOf(%q) = %q, want %q", path, got, want)
		}
	}
}

// Buffered serves the handler, answers other functions' routes with the
// handler's error shape, and logs one access line with the API Gateway
// request id and the run id.
func TestBufferedRoutesAndAccessLine(t *testing.T) {
	var logs bytes.Buffer
	var seen []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req_1")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	serve := apigateway.Buffered(apigateway.NoStreams(apigateway.Only(h, apigateway.Public)), apigateway.Options{
		Logger:     slog.New(slog.NewJSONHandler(&logs, nil)),
		OnResponse: func(method, path string, status int) { seen = append(seen, method+" "+path) },
	})
	ev := func(method, path string, headers map[string]string) events.APIGatewayProxyRequest {
		return events.APIGatewayProxyRequest{HTTPMethod: method, Path: path, Headers: headers,
			RequestContext: events.APIGatewayProxyRequestContext{RequestID: "gw-42", DomainName: "example.com"}}
	}

	resp, err := serve(t.Context(), ev("GET", "/v1/runs/run_abc", nil))
	if err != nil || resp.StatusCode != 200 || resp.Body != `{"ok":true}` {
		t.Fatalf("public route: %+v, %v", resp, err)
	}
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(logs.Bytes()), &line); err != nil {
		t.Fatalf("access line %q: %v", logs.String(), err)
	}
	if line["apigw_request_id"] != "gw-42" || line["request_id"] != "req_1" || line["run_id"] != "run_abc" || line["status"] != 200.0 {
		t.Fatalf("access line %v", line)
	}

	resp, _ = serve(t.Context(), ev("POST", "/internal/v1/claim", nil))
	if resp.StatusCode != 404 || !strings.Contains(resp.Body, `"code":"not_found"`) || !strings.Contains(resp.Body, `"requestId":"gw-42"`) {
		t.Fatalf("internal route through the public function: %d %s", resp.StatusCode, resp.Body)
	}
	resp, _ = serve(t.Context(), ev("GET", "/v1/runs/run_abc/events", map[string]string{"Accept": "text/event-stream"}))
	if resp.StatusCode != 400 || !strings.Contains(resp.Body, `"code":"invalid"`) {
		t.Fatalf("SSE through a buffered function: %d %s", resp.StatusCode, resp.Body)
	}
	// A session's SSE form would be held until the function's timeout too:
	// refused, naming the streaming route. Its NDJSON form is served.
	for _, q := range []struct {
		path   string
		header map[string]string
	}{
		{"/v1/sessions/ses_abc/events", map[string]string{"Accept": "text/event-stream"}},
		{"/v1/sessions/ses_abc/events?stream=1", nil},
	} {
		e := ev("GET", q.path, q.header)
		if p, query, ok := strings.Cut(q.path, "?"); ok {
			k, v, _ := strings.Cut(query, "=")
			e.Path, e.QueryStringParameters = p, map[string]string{k: v}
		}
		resp, _ = serve(t.Context(), e)
		if resp.StatusCode != 400 || !strings.Contains(resp.Body, `"code":"invalid"`) || !strings.Contains(resp.Body, "streaming route") {
			t.Fatalf("session SSE (%s) through a buffered function: %d %s", q.path, resp.StatusCode, resp.Body)
		}
	}
	resp, _ = serve(t.Context(), ev("GET", "/v1/sessions/ses_abc/events", nil))
	if resp.StatusCode != 200 || resp.Body != `{"ok":true}` {
		t.Fatalf("session events as NDJSON through a buffered function: %d %s", resp.StatusCode, resp.Body)
	}
	if len(seen) != 6 {
		t.Fatalf("OnResponse saw %v, want every request", seen)
	}

	bad := ev("POST", "/v1/runs", nil)
	bad.Body, bad.IsBase64Encoded = "%%% not base64", true
	resp, err = serve(t.Context(), bad)
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("malformed event: %d, %v; want a 400 answer, not a handler error", resp.StatusCode, err)
	}
}
