package functions_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/wire"
)

// The IAM caller the sigv4 testdata events carry, as API Gateway fills
// requestContext.identity for a method whose authorization is AWS_IAM.
const (
	sigv4CallerARN     = "arn:aws:sts::123456789012:assumed-role/belay-developers/alice"
	sigv4SecurityToken = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKENbelaytestdataONLYnotarealtoken"
)

// withoutIdentity empties the event's IAM identity: what the function gets
// from a method deployed without IAM authorization.
func withoutIdentity(ev *events.APIGatewayProxyRequest) {
	ev.RequestContext.Identity = events.APIGatewayRequestIdentity{SourceIP: ev.RequestContext.Identity.SourceIP, UserAgent: ev.RequestContext.Identity.UserAgent}
}

// Under BELAY_AUTH=sigv4 the api function takes no control-plane token:
// a signed request (API Gateway's request context names the IAM caller)
// creates and reads a run; the same request without the identity is 401,
// whatever bearer token it carries. Step Functions and ECS have no peer
// here: awstest servers check each request the function's SDK clients
// send.
func TestAPISigV4(t *testing.T) {
	p := startPeers(t)
	fn, states := startAPI(t, p, map[string]string{
		"BELAY_AUTH": "sigv4",
		// Left over from a token deployment: ignored, with a warning.
		"BELAY_TOKEN": controlToken,
	})

	t.Run("no identity", func(t *testing.T) {
		for name, ev := range map[string][]byte{
			"unsigned":            apiEvent(t, "api", "create-run-sigv4.json", withoutIdentity),
			"with the old bearer": apiEvent(t, "api", "create-run-sigv4.json", withoutIdentity, withHeader("Authorization", "Bearer "+controlToken)),
		} {
			resp := buffered(t, fn, ev)
			if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
				t.Fatalf("%s: %d %s, want 401 unauthorized", name, resp.StatusCode, resp.Body)
			}
		}
		if n := len(states.All()); n != 0 {
			t.Fatalf("refused requests made %d Step Functions calls", n)
		}
	})

	var created wire.CreateRunResponse
	t.Run("signed create", func(t *testing.T) {
		created = createRun(t, fn, p, apiEvent(t, "api", "create-run-sigv4.json"))
		if starts := states.Calls("StartExecution"); len(starts) != 1 || starts[0]["name"] != created.RunID {
			t.Fatalf("StartExecution calls %v, want one named by the run", starts)
		}
	})
	if created.RunID == "" {
		t.FailNow()
	}

	t.Run("signed read", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "get-run-sigv4.json", forRun(created.RunID)))
		var view wire.RunView
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &view) != nil || view.RunID != created.RunID {
			t.Fatalf("get: %d %s", resp.StatusCode, resp.Body)
		}
		denied := buffered(t, fn, apiEvent(t, "api", "get-run-sigv4.json", forRun(created.RunID), withoutIdentity))
		if denied.StatusCode != http.StatusUnauthorized || errorCode(t, denied.Body) != belay.CodeUnauthorized {
			t.Fatalf("get without the identity: %d %s, want 401 unauthorized", denied.StatusCode, denied.Body)
		}
	})

	t.Run("logs", func(t *testing.T) {
		// Five requests, each with its access line; the two signed ones
		// name the caller.
		fn.WaitLogs(func(logs string) bool { return strings.Count(logs, `"msg":"request"`) >= 5 })
		var named, warned, refused int
		for _, line := range fn.JSONLines() {
			switch {
			case line["msg"] == "request" && line["caller_arn"] == sigv4CallerARN:
				named++
			case strings.Contains(str(line["msg"]), "BELAY_TOKEN is set, but BELAY_AUTH=sigv4"):
				warned++
			case strings.Contains(str(line["msg"]), "without an IAM identity") && line["apigw_request_id"] != "":
				refused++
			}
		}
		if named != 2 || warned != 1 || refused != 3 {
			t.Fatalf("access lines naming the caller %d (want 2), warnings about the ignored token %d (want 1), refusals logged %d (want 3):\n%s",
				named, warned, refused, fn.Logs())
		}
		for _, secret := range []string{controlToken, sigv4SecurityToken} {
			if strings.Contains(fn.Logs(), secret) {
				t.Fatalf("the function's log holds a credential (%.12s...)", secret)
			}
		}
	})
}

// The stream function under BELAY_AUTH=sigv4, with no control-plane token
// anywhere in its environment, streams a signed reader's events and
// refuses an unsigned one; under BELAY_AUTH=token an IAM identity alone
// opens nothing.
func TestStreamAuth(t *testing.T) {
	p := startPeers(t)
	done := newRunID()
	seedRun(t, p.store, done)
	startRun(t, p.store, done)
	now := time.Now().UTC()
	if _, err := p.store.Transition(t.Context(), done, belay.Transition{To: belay.StatusCompleted, At: now,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunCompleted, Data: json.RawMessage(`{}`)}}}); err != nil {
		t.Fatal(err)
	}
	all := runEvents(t, p.store, done)

	t.Run("sigv4", func(t *testing.T) {
		fn := rie.Start(t, "stream", p.env(map[string]string{"BELAY_AUTH": "sigv4"}))
		resp := streamed(t, fn, apiEvent(t, "stream", "events-sse-sigv4.json", forRun(done)))
		ids := sseIDs(string(resp.Body))
		// Last-Event-ID: 1 in the testdata: everything after the first.
		if resp.StatusCode != 200 || len(ids) != len(all)-1 || !strings.Contains(string(resp.Body), "event: run.completed") {
			t.Fatalf("signed reader: %d, ids %v, want 200 with events 2..%d\n%s", resp.StatusCode, ids, len(all), resp.Body)
		}
		denied := streamed(t, fn, apiEvent(t, "stream", "events-sse-sigv4.json", forRun(done), withoutIdentity))
		if denied.StatusCode != 401 || errorCode(t, string(denied.Body)) != belay.CodeUnauthorized {
			t.Fatalf("unsigned reader: %d %s, want 401 unauthorized", denied.StatusCode, denied.Body)
		}
		if !fn.WaitLogs(func(logs string) bool { return strings.Contains(logs, `"caller_arn":"`+sigv4CallerARN+`"`) }) {
			t.Fatalf("no access line names the caller:\n%s", fn.Logs())
		}
	})

	t.Run("token", func(t *testing.T) {
		fn := rie.Start(t, "stream", p.env(map[string]string{"BELAY_AUTH": "token", "BELAY_TOKEN": controlToken}))
		if resp := streamed(t, fn, apiEvent(t, "stream", "events-sse.json", forRun(done))); resp.StatusCode != 200 {
			t.Fatalf("bearer reader: %d %s, want 200", resp.StatusCode, resp.Body)
		}
		if resp := streamed(t, fn, apiEvent(t, "stream", "events-sse-sigv4.json", forRun(done))); resp.StatusCode != 401 {
			t.Fatalf("an IAM identity without the token under BELAY_AUTH=token: %d %s, want 401", resp.StatusCode, resp.Body)
		}
	})
}

// A BELAY_AUTH the functions do not know stops them at start, with a log
// line naming the variable and the values it takes; nothing is served.
func TestBadAuthFailsStart(t *testing.T) {
	p := startPeers(t)
	for _, function := range []string{"api", "stream"} {
		t.Run(function, func(t *testing.T) {
			fn := rie.Start(t, function, p.env(map[string]string{
				"BELAY_AUTH": "iam", "BELAY_TOKEN": controlToken,
				"BELAY_STATE_MACHINE_ARN": stateMachine, "BELAY_CLUSTER_ARN": clusterARN,
			}))
			status, body, err := fn.Call(t.Context(), apiEvent(t, function, map[string]string{"api": "get-run.json", "stream": "events-sse.json"}[function]))
			if err == nil && status == http.StatusOK {
				if _, isErr := rie.HandlerError(body); !isErr {
					t.Fatalf("%s with BELAY_AUTH=iam answered %d %s, want an init failure", function, status, body)
				}
			}
			want := `BELAY_AUTH is \"iam\"; want \"token\" (the control-plane token, the default) or \"sigv4\"`
			if !fn.WaitLogs(func(logs string) bool { return strings.Contains(logs, want) }) {
				t.Fatalf("the start-up error does not name the variable and its values:\n%s", fn.Logs())
			}
		})
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
