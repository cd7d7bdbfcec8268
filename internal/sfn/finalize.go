package sfn

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/orchestrator"
)

// The reasons recorded on runs that the AWS side ends itself; the others
// are the embedded orchestrator's (orchestrator.Reason*), so a run reads
// the same on both.
const (
	ReasonCancelled = orchestrator.ReasonCancelled
	ReasonTimeout   = orchestrator.ReasonTimeout
	// ReasonAborted ends a run whose execution was stopped without a
	// cancel (by an operator, in the console).
	ReasonAborted = "execution aborted"
	// ReasonOrchestration prefixes the reason of a run whose execution
	// failed outside the sandbox; the Step Functions error name follows.
	ReasonOrchestration = "orchestration failed"
)

// Outcome is how a run ends, as the validate task decides it and the
// finalize task records it. It travels in the execution's state, so it
// holds the names of the stored artifacts, never their content.
type Outcome struct {
	Status       belay.RunStatus     `json:"status"`
	Reason       string              `json:"reason,omitempty"`
	ExitCode     *int                `json:"exitCode,omitempty"`
	Checks       []belay.CheckResult `json:"checks,omitempty"`
	ChangedFiles []string            `json:"changedFiles,omitempty"`
	Artifacts    []string            `json:"artifacts,omitempty"`
}

// Finalize moves the run to the outcome's terminal state with its
// terminal event (run.completed, run.failed or run.cancelled, with reason
// and exitCode) in one write, as the embedded orchestrator's Finalize
// does. A run whose cancel was requested ends cancelled whatever the
// outcome. A run that is already terminal keeps its state: changed is
// then false and the stored run is returned without error, so every task
// and the cleanup may call it again. now is the time recorded.
func Finalize(ctx context.Context, store belay.Store, log *slog.Logger, runID string, out Outcome, now time.Time) (run belay.Run, changed bool, err error) {
	stored, err := store.GetRun(ctx, runID)
	if err != nil {
		return belay.Run{}, false, fmt.Errorf("finalize run %s: %w", runID, err)
	}
	if stored.Status.Terminal() {
		log.Info("run already ended; its state stands", "run_id", runID, "status", stored.Status, "outcome", out.Status)
		return stored, false, nil
	}
	if !out.Status.Terminal() {
		return belay.Run{}, false, fmt.Errorf("finalize run %s: outcome status %q is not terminal", runID, out.Status)
	}
	if stored.CancelRequested && out.Status != belay.StatusCancelled {
		out = Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled, Artifacts: out.Artifacts}
	}
	data, err := json.Marshal(struct {
		Reason   string `json:"reason,omitempty"`
		ExitCode *int   `json:"exitCode,omitempty"`
	}{out.Reason, out.ExitCode})
	if err != nil {
		return belay.Run{}, false, fmt.Errorf("finalize run %s: %w", runID, err)
	}
	done, err := store.Transition(ctx, runID, belay.Transition{
		To:           out.Status,
		At:           now,
		Reason:       out.Reason,
		ExitCode:     out.ExitCode,
		Checks:       out.Checks,
		ChangedFiles: out.ChangedFiles,
		Artifacts:    out.Artifacts,
		Events:       []belay.EventInput{{Time: now, Type: belay.TerminalEventType(out.Status), Data: data}},
	})
	if belay.IsCode(err, belay.CodeConflict) {
		log.Info("run ended meanwhile; its state stands", "run_id", runID, "outcome", out.Status)
		if done, err = store.GetRun(ctx, runID); err != nil {
			return belay.Run{}, false, fmt.Errorf("finalize run %s: %w", runID, err)
		}
		return done, false, nil
	}
	if err != nil {
		return belay.Run{}, false, fmt.Errorf("finalize run %s: %w", runID, err)
	}
	attrs := []any{"run_id", runID, "status", done.Status, "reason", done.Reason}
	if done.ExitCode != nil {
		attrs = append(attrs, "exit_code", *done.ExitCode)
	}
	log.Info("run finished", attrs...)
	return done, true, nil
}
