package sfn

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/orchestrator"
)

// SandboxContainer is the name of the sandbox's container in the task
// definition; ExitOf reads its exit code (else the first container's).
const SandboxContainer = "sandbox"

// ecsTask is the part of ECS's task description (the runTask.sync state's
// output, or a TaskFailed cause) that says how the task ended. Step
// Functions writes its fields in PascalCase; encoding/json matches them
// case-insensitively.
type ecsTask struct {
	TaskArn       string `json:"taskArn"`
	LastStatus    string `json:"lastStatus"`
	StopCode      string `json:"stopCode"`
	StoppedReason string `json:"stoppedReason"`
	Containers    []struct {
		Name     string `json:"name"`
		ExitCode *int   `json:"exitCode"`
		Reason   string `json:"reason"`
	} `json:"containers"`
}

// errNoExit is the wait error of a task whose sandbox container never
// reported an exit code (it did not start, or was lost with its host).
var errNoExit = errors.New("the sandbox's task ended without an exit code")

// ExitOf turns how the RunTask state ended into what the embedded
// orchestrator's Wait returns: the sandbox's exit, and why it did not
// simply exit (orchestrator.ErrTimeout for the state's timeout, another
// error when it was lost), for orchestrator.Validate.
func ExitOf(task json.RawMessage, stateErr *StateError) (belay.SandboxExit, error) {
	var desc *ecsTask
	if len(task) > 0 && string(task) != "null" {
		var t ecsTask
		if err := json.Unmarshal(task, &t); err != nil {
			return belay.SandboxExit{}, fmt.Errorf("read the RunTask output: %w", err)
		}
		desc = &t
	}
	if stateErr != nil {
		switch stateErr.Error {
		case "States.Timeout", "States.HeartbeatTimeout":
			return belay.SandboxExit{}, orchestrator.ErrTimeout
		}
		// A failed task's cause is its description, when ECS got as far
		// as one.
		var t ecsTask
		if desc == nil && json.Unmarshal([]byte(stateErr.Cause), &t) == nil && len(t.Containers) > 0 {
			desc = &t
		}
		if desc == nil {
			return belay.SandboxExit{}, fmt.Errorf("the RunTask state failed with %s", boundReason(stateErr.Error))
		}
	}
	if desc == nil {
		return belay.SandboxExit{}, errNoExit
	}
	idx := 0
	for i, c := range desc.Containers {
		if c.Name == SandboxContainer {
			idx = i
			break
		}
	}
	if len(desc.Containers) == 0 || desc.Containers[idx].ExitCode == nil {
		return belay.SandboxExit{}, errNoExit
	}
	code := *desc.Containers[idx].ExitCode
	exit := belay.SandboxExit{ExitCode: code}
	// 128+N is a signal's death (137: SIGKILL, as an out-of-memory kill or
	// a forced stop); an entry that exits by itself never uses it.
	if code > 128 && (desc.StopCode != "EssentialContainerExited" ||
		strings.Contains(desc.Containers[idx].Reason, "OutOfMemory")) {
		exit.Signaled = true
	}
	return exit, nil
}
