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
	"github.com/belay-dev/belay/internal/belay"
)

const callerARN = "arn:aws:sts::123456789012:assumed-role/belay-developers/alice"

func withIdentity(ev events.APIGatewayProxyRequest, arn, caller string) events.APIGatewayProxyRequest {
	ev.RequestContext.Identity = events.APIGatewayRequestIdentity{
		AccountID: "123456789012", UserArn: arn, Caller: caller, SourceIP: "203.0.113.17",
	}
	return ev
}

// RequireIAM lets a request through only when the event's request context
// names an IAM identity (userArn and caller), through both adapters; a
// request without one is refused unauthorized and logged as a warning.
// The access line names the accepted caller.
func TestRequireIAM(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	auth := apigateway.RequireIAM(log)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := auth(r); err != nil {
			if belay.ErrorCode(err) != belay.CodeUnauthorized {
				t.Errorf("refusal code %q, want unauthorized", belay.ErrorCode(err))
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		id, _ := apigateway.IAMCaller(r)
		_, _ = io.WriteString(w, id.UserArn)
	})
	buffered := apigateway.Buffered(h, apigateway.Options{Logger: log})
	streaming := apigateway.Streaming(h, apigateway.StreamOptions{Options: apigateway.Options{Logger: log}})
	serve := func(t *testing.T, ev events.APIGatewayProxyRequest) (int, string) {
		t.Helper()
		b, err := buffered(t.Context(), ev)
		if err != nil {
			t.Fatal(err)
		}
		s, err := streaming(t.Context(), ev)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(s.Body)
		if s.StatusCode != b.StatusCode || string(body) != b.Body {
			t.Fatalf("the adapters disagree: buffered %d %q, streamed %d %q", b.StatusCode, b.Body, s.StatusCode, body)
		}
		return b.StatusCode, b.Body
	}

	ev := sseEvent()
	if status, body := serve(t, withIdentity(ev, callerARN, "AROAEXAMPLEID:alice")); status != 200 || body != callerARN {
		t.Fatalf("signed request: %d %q, want 200 with the caller", status, body)
	}
	var sawCaller bool
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "request" && m["caller_arn"] == callerARN {
			sawCaller = true
		}
	}
	if !sawCaller {
		t.Fatalf("no access line names the caller:\n%s", logs.String())
	}

	logs.Reset()
	for name, ev := range map[string]events.APIGatewayProxyRequest{
		"no identity":   ev,
		"no user ARN":   withIdentity(ev, "", "AROAEXAMPLEID:alice"),
		"no caller":     withIdentity(ev, callerARN, ""),
		"only a source": withIdentity(ev, "", ""),
	} {
		if status, _ := serve(t, ev); status != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, status)
		}
	}
	if !strings.Contains(logs.String(), "without an IAM identity") || !strings.Contains(logs.String(), `"apigw_request_id":"gw-1"`) {
		t.Fatalf("refusals not logged with the API Gateway request id:\n%s", logs.String())
	}

	// Outside API Gateway (no request context at all): refused.
	r, _ := http.NewRequest("GET", "/v1/runs", nil)
	if err := auth(r); belay.ErrorCode(err) != belay.CodeUnauthorized {
		t.Fatalf("a request from no API Gateway: %v, want unauthorized", err)
	}
}
