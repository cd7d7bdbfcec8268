package sfn_test

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/sfn"
)

// stepInput reads a task input of the steps function's testdata.
func stepInput(tb testing.TB, name string) sfn.TaskRequest {
	tb.Helper()
	raw, err := os.ReadFile("../../functions/steps/testdata/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	var req sfn.TaskRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		tb.Fatal(err)
	}
	return req
}

func TestExitOf(t *testing.T) {
	tests := []struct {
		file     string
		code     int
		signaled bool
		wantErr  error
	}{
		{file: "validate.json", code: 0},
		{file: "validate-oom.json", code: 137, signaled: true},
		{file: "validate-timeout.json", wantErr: orchestrator.ErrTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			req := stepInput(t, tt.file)
			exit, err := sfn.ExitOf(req.Task, req.Error)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ExitOf error = %v, want %v", err, tt.wantErr)
			}
			if exit.ExitCode != tt.code || exit.Signaled != tt.signaled {
				t.Fatalf("ExitOf = code %d signaled %v, want %d %v", exit.ExitCode, exit.Signaled, tt.code, tt.signaled)
			}
		})
	}
	// A task that failed to start: no exit code, a lost sandbox.
	if _, err := sfn.ExitOf(json.RawMessage(`{"Containers":[{"Name":"sandbox","Reason":"CannotPullContainerError"}],"StopCode":"TaskFailedToStart"}`), nil); err == nil {
		t.Fatal("ExitOf(no exit code) = nil error, want the sandbox lost")
	}
	// A TaskFailed whose cause is the task's description.
	cause := `{"Containers":[{"Name":"sandbox","ExitCode":3}],"StopCode":"EssentialContainerExited"}`
	exit, err := sfn.ExitOf(nil, &sfn.StateError{Error: "States.TaskFailed", Cause: cause})
	if err != nil || exit.ExitCode != 3 || exit.Signaled {
		t.Fatalf("ExitOf(TaskFailed) = %+v, %v; want exit code 3", exit, err)
	}
	if _, err := sfn.ExitOf(nil, &sfn.StateError{Error: "States.Runtime", Cause: "not json"}); err == nil {
		t.Fatal("ExitOf(Runtime error) = nil error")
	}
}
