package sfn_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsecs "github.com/aws/aws-sdk-go-v2/service/ecs"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/ecs"
	"github.com/belay-dev/belay/internal/sfn"
	"github.com/belay-dev/belay/internal/sqlite"
)

// Step Functions and ECS have no peer that runs here: these tests use
// awstest, an HTTP server that checks each request the SDK sends (method,
// X-Amz-Target, body) and answers what the test scripted. The run store is
// the real SQLite adapter.

const machine = "arn:aws:states:eu-west-1:123456789012:stateMachine:belay-runs"

func sfnClient(url string) *awssfn.Client {
	return awssfn.New(awssfn.Options{Region: "eu-west-1", BaseEndpoint: aws.String(url),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
}

func ecsClient(url string) *awsecs.Client {
	return awsecs.New(awsecs.Options{Region: "eu-west-1", BaseEndpoint: aws.String(url),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
}

func openStore(tb testing.TB) *sqlite.Store {
	tb.Helper()
	st, err := sqlite.Open(tb.Context(), filepath.Join(tb.TempDir(), "belay.db"), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}

func createRun(tb testing.TB, st belay.Store, id string) {
	tb.Helper()
	req, err := belay.DefaultLimits("m").Validate(belay.RunRequest{
		Instruction:  "Fix the failing test",
		Files:        []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"}},
		AllowedPaths: []string{"calc.py"},
		Checks:       [][]string{{"python3", "-m", "pytest", "-q"}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	if _, _, err := st.CreateRun(tb.Context(), belay.Run{
		ID: id, Status: belay.StatusQueued, Request: req, RequestHash: belay.RequestHash(req),
		CreatedAt: time.Now().UTC(), Usage: belay.Usage{MaxRequests: req.MaxRequests()},
	}, ""); err != nil {
		tb.Fatal(err)
	}
}

func TestExecutionARN(t *testing.T) {
	got := sfn.ExecutionARN(machine, "run_abc")
	if want := "arn:aws:states:eu-west-1:123456789012:execution:belay-runs:run_abc"; got != want {
		t.Fatalf("ExecutionARN = %q, want %q", got, want)
	}
}

func TestSubmitStartsAnExecutionNamedByTheRun(t *testing.T) {
	srv := awstest.New(t, awstest.StepFunctions)
	started := 0
	srv.Handle("StartExecution", func(body map[string]any) (int, any) {
		started++
		if started > 1 {
			return http.StatusBadRequest, awstest.Error("ExecutionAlreadyExists", "Execution Already Exists: 'arn:...'")
		}
		return http.StatusOK, map[string]any{"executionArn": sfn.ExecutionARN(machine, "run_one"), "startDate": 1796130330.0}
	})
	st := openStore(t)
	o, err := sfn.New(sfn.Config{Client: sfnClient(srv.URL), StateMachineARN: machine, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Submit(t.Context(), "run_one"); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	// A repeat (a retried request) is not an error.
	if err := o.Submit(t.Context(), "run_one"); err != nil {
		t.Fatalf("second Submit: %v, want nil for ExecutionAlreadyExists", err)
	}
	calls := srv.Calls("StartExecution")
	if len(calls) != 2 {
		t.Fatalf("%d StartExecution calls, want 2", len(calls))
	}
	body := calls[0]
	if body["stateMachineArn"] != machine || body["name"] != "run_one" {
		t.Fatalf("StartExecution body %v: want the state machine and name run_one", body)
	}
	var input sfn.ExecutionInput
	if err := json.Unmarshal([]byte(body["input"].(string)), &input); err != nil || input.RunID != "run_one" {
		t.Fatalf("execution input %v: want {\"runId\":\"run_one\"}", body["input"])
	}
}

func TestSubmitReportsOtherErrors(t *testing.T) {
	srv := awstest.New(t, awstest.StepFunctions)
	srv.Handle("StartExecution", func(map[string]any) (int, any) {
		return http.StatusBadRequest, awstest.Error("StateMachineDoesNotExist", "State Machine Does Not Exist")
	})
	o, _ := sfn.New(sfn.Config{Client: sfnClient(srv.URL), StateMachineARN: machine, Store: openStore(t)})
	err := o.Submit(t.Context(), "run_two")
	if err == nil || !strings.Contains(err.Error(), "StateMachineDoesNotExist") {
		t.Fatalf("Submit = %v, want the service's error", err)
	}
}

func TestCancelStopsTheExecutionAndTheTask(t *testing.T) {
	states := awstest.New(t, awstest.StepFunctions)
	states.Handle("StopExecution", func(map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"stopDate": 1796130400.0}
	})
	cluster := awstest.New(t, awstest.ECS)
	cluster.Handle("StopTask", func(map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"task": map[string]any{"taskArn": "arn:aws:ecs:eu-west-1:123456789012:task/belay/abc", "lastStatus": "RUNNING", "desiredStatus": "STOPPED"}}
	})
	st := openStore(t)
	createRun(t, st, "run_three")
	const task = "arn:aws:ecs:eu-west-1:123456789012:task/belay/abc"
	o, _ := sfn.New(sfn.Config{
		Client: sfnClient(states.URL), StateMachineARN: machine, Store: st,
		Tasks: ecs.New(ecsClient(cluster.URL), "belay"), TaskARN: func(belay.Run) string { return task },
	})
	if err := o.Cancel(t.Context(), "run_three"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	stops := states.Calls("StopExecution")
	if len(stops) != 1 || stops[0]["executionArn"] != sfn.ExecutionARN(machine, "run_three") || stops[0]["error"] != sfn.CancelError {
		t.Fatalf("StopExecution calls %v", stops)
	}
	tasks := cluster.Calls("StopTask")
	if len(tasks) != 1 || tasks[0]["task"] != task || tasks[0]["cluster"] != "belay" || !strings.Contains(tasks[0]["reason"].(string), "cancel") {
		t.Fatalf("StopTask calls %v", tasks)
	}
	// The run is finalized by the cleanup of the ABORTED execution, not here.
	if run, _ := st.GetRun(t.Context(), "run_three"); run.Status != belay.StatusQueued {
		t.Fatalf("run is %s after Cancel, want queued until cleanup", run.Status)
	}
}

func TestCancelWithoutExecutionFinalizesTheRun(t *testing.T) {
	states := awstest.New(t, awstest.StepFunctions)
	states.Handle("StopExecution", func(map[string]any) (int, any) {
		return http.StatusBadRequest, awstest.Error("ExecutionDoesNotExist", "Execution Does Not Exist")
	})
	st := openStore(t)
	createRun(t, st, "run_four")
	o, _ := sfn.New(sfn.Config{Client: sfnClient(states.URL), StateMachineARN: machine, Store: st})
	for range 2 { // idempotent
		if err := o.Cancel(t.Context(), "run_four"); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}
	run, err := st.GetRun(t.Context(), "run_four")
	if err != nil || run.Status != belay.StatusCancelled || run.Reason != sfn.ReasonCancelled {
		t.Fatalf("run = %s %q, %v; want cancelled", run.Status, run.Reason, err)
	}
	// The second Cancel found a terminal run and called nothing.
	if n := len(states.Calls("StopExecution")); n != 1 {
		t.Fatalf("%d StopExecution calls, want 1", n)
	}
}

func TestCancelUnknownRun(t *testing.T) {
	states := awstest.New(t, awstest.StepFunctions)
	o, _ := sfn.New(sfn.Config{Client: sfnClient(states.URL), StateMachineARN: machine, Store: openStore(t)})
	if err := o.Cancel(t.Context(), "run_missing"); !belay.IsCode(err, belay.CodeNotFound) {
		t.Fatalf("Cancel(unknown) = %v, want not_found", err)
	}
}

func TestStopTaskAlreadyGone(t *testing.T) {
	cluster := awstest.New(t, awstest.ECS)
	cluster.Handle("StopTask", func(map[string]any) (int, any) {
		return http.StatusBadRequest, awstest.Error("InvalidParameterException", "The referenced task was not found.")
	})
	tasks := ecs.New(ecsClient(cluster.URL), "belay")
	if err := tasks.StopTask(t.Context(), "arn:aws:ecs:eu-west-1:123456789012:task/belay/gone", strings.Repeat("r", 300)); err != nil {
		t.Fatalf("StopTask(gone) = %v, want nil", err)
	}
	if got := cluster.Calls("StopTask")[0]["reason"].(string); len(got) != 255 {
		t.Fatalf("reason of %d bytes sent, want it cut to 255", len(got))
	}
	cluster.Handle("StopTask", func(map[string]any) (int, any) {
		return http.StatusBadRequest, awstest.Error("AccessDeniedException", "not authorized")
	})
	if err := tasks.StopTask(t.Context(), "arn:aws:ecs:eu-west-1:123456789012:task/belay/x", "r"); err == nil {
		t.Fatal("StopTask with access denied = nil, want an error")
	}
}
