package functions_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sfn"
	"github.com/belay-dev/belay/internal/wire"
)

// The api bootstrap under the emulator, on DynamoDB Local and gofakes3.
// Step Functions and ECS have no peer here: awstest servers check each
// request the function's SDK clients send.
func TestAPI(t *testing.T) {
	p := startPeers(t)
	fn, states := startAPI(t, p, map[string]string{"BELAY_AUTH": "token", "BELAY_TOKEN": controlToken})

	t.Run("bad body", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "create-run-bad-body.json"))
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, resp.Body) != belay.CodeInvalid {
			t.Fatalf("bad body: %d %s, want 400 invalid", resp.StatusCode, resp.Body)
		}
		if !strings.Contains(resp.Body, "maxSteps") {
			t.Fatalf("bad body: %s does not name the field", resp.Body)
		}
	})
	recordInit(t, fn)

	t.Run("no token", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "create-run-no-token.json"))
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
			t.Fatalf("no token: %d %s, want 401 unauthorized", resp.StatusCode, resp.Body)
		}
	})
	t.Run("an IAM identity is no credential under token auth", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "create-run-sigv4.json"))
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
			t.Fatalf("signed, no token: %d %s, want 401 unauthorized", resp.StatusCode, resp.Body)
		}
	})
	if n := len(states.All()); n != 0 {
		t.Fatalf("refused requests made %d Step Functions calls", n)
	}

	var created wire.CreateRunResponse
	t.Run("valid run", func(t *testing.T) {
		created = createRun(t, fn, p, apiEvent(t, "api", "create-run.json"))
		starts := states.Calls("StartExecution")
		if len(starts) != 1 || starts[0]["name"] != created.RunID || starts[0]["stateMachineArn"] != stateMachine ||
			starts[0]["input"] != `{"runId":"`+created.RunID+`"}` {
			t.Fatalf("StartExecution calls %v, want one named by the run", starts)
		}
		// The same Idempotency-Key and body: the same run, started again
		// harmlessly.
		again := buffered(t, fn, apiEvent(t, "api", "create-run.json"))
		var second wire.CreateRunResponse
		_ = json.Unmarshal([]byte(again.Body), &second)
		if again.StatusCode != http.StatusAccepted || second.RunID != created.RunID {
			t.Fatalf("repeat: %d %s, want 202 with %s", again.StatusCode, again.Body, created.RunID)
		}
	})
	if created.RunID == "" {
		t.FailNow()
	}

	t.Run("get run", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "get-run.json", forRun(created.RunID)))
		var view wire.RunView
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &view) != nil || view.RunID != created.RunID {
			t.Fatalf("get: %d %s", resp.StatusCode, resp.Body)
		}
		missing := buffered(t, fn, apiEvent(t, "api", "get-run.json"))
		if missing.StatusCode != http.StatusNotFound || errorCode(t, missing.Body) != belay.CodeNotFound {
			t.Fatalf("get unknown: %d %s, want 404", missing.StatusCode, missing.Body)
		}
	})

	t.Run("no SSE on a buffered route", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "events-sse.json", forRun(created.RunID)))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(resp.Body, "stream") {
			t.Fatalf("SSE through api: %d %s, want 400 naming the streaming route", resp.StatusCode, resp.Body)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "api", "cancel-run.json", forRun(created.RunID)))
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("cancel: %d %s, want 202", resp.StatusCode, resp.Body)
		}
		stops := states.Calls("StopExecution")
		if len(stops) != 1 || stops[0]["executionArn"] != sfn.ExecutionARN(stateMachine, created.RunID) {
			t.Fatalf("StopExecution calls %v", stops)
		}
		run, _ := p.store.GetRun(t.Context(), created.RunID)
		if !run.CancelRequested {
			t.Fatal("cancel was not recorded")
		}
	})

	t.Run("logs", func(t *testing.T) {
		// Nine requests so far, each with its access line.
		fn.WaitLogs(func(logs string) bool { return strings.Count(logs, `"msg":"request"`) >= 9 })
		var access int
		for _, line := range fn.JSONLines() {
			if line["msg"] != "request" || line["function"] != "api" {
				continue
			}
			access++
			if line["apigw_request_id"] == "" || line["apigw_request_id"] == nil {
				t.Errorf("access line without the API Gateway request id: %v", line)
			}
			if strings.Contains(line["path"].(string), created.RunID) && line["run_id"] != created.RunID {
				t.Errorf("access line of a run's route without run_id: %v", line)
			}
		}
		if access == 0 {
			t.Fatalf("no access lines in the log:\n%s", fn.Logs())
		}
		if strings.Contains(fn.Logs(), controlToken) {
			t.Fatal("the control-plane token is in the function's log")
		}
	})
}

// startAPI starts the api bootstrap on p with the given authentication
// environment. Step Functions and ECS have no peer here: awstest servers
// check each request the function's SDK clients send; the Step Functions
// one is returned.
func startAPI(tb testing.TB, p peers, auth map[string]string) (*rie.Function, *awstest.Server) {
	tb.Helper()
	states := awstest.New(tb, awstest.StepFunctions)
	states.Handle("StartExecution", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"executionArn": sfn.ExecutionARN(stateMachine, body["name"].(string)), "startDate": 1796130330.0}
	})
	states.Handle("StopExecution", func(map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"stopDate": 1796130400.0}
	})
	cluster := awstest.New(tb, awstest.ECS)
	env := map[string]string{
		"BELAY_STATE_MACHINE_ARN": stateMachine,
		"BELAY_CLUSTER_ARN":       clusterARN,
		"BELAY_SFN_ENDPOINT":      states.URL,
		"BELAY_ECS_ENDPOINT":      cluster.URL,
	}
	maps.Copy(env, auth)
	return rie.Start(tb, "api", p.env(env)), states
}

// createRun sends a run-creation event to the api function and checks the
// answer (202 with a run id) and the run in DynamoDB Local (queued, with
// the configured model).
func createRun(tb testing.TB, fn *rie.Function, p peers, event []byte) wire.CreateRunResponse {
	tb.Helper()
	resp := buffered(tb, fn, event)
	if resp.StatusCode != http.StatusAccepted {
		tb.Fatalf("create: %d %s, want 202", resp.StatusCode, resp.Body)
	}
	var created wire.CreateRunResponse
	if err := json.Unmarshal([]byte(resp.Body), &created); err != nil || !strings.HasPrefix(created.RunID, "run_") {
		tb.Fatalf("create answer %s: %v", resp.Body, err)
	}
	run, err := p.store.GetRun(tb.Context(), created.RunID)
	if err != nil || run.Status != belay.StatusQueued || run.Request.Model != testModel {
		tb.Fatalf("run in DynamoDB Local: %+v, %v; want queued with the configured model", run.Status, err)
	}
	return created
}
