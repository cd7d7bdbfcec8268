package belay

import (
	"slices"
	"time"
)

// RunStatus is where a run is in its life.
type RunStatus string

// The run states: queued → running → completed | failed | cancelled, and
// queued → cancelled. A terminal state never changes.
const (
	StatusQueued    RunStatus = "queued"
	StatusRunning   RunStatus = "running"
	StatusCompleted RunStatus = "completed"
	StatusFailed    RunStatus = "failed"
	StatusCancelled RunStatus = "cancelled"
)

// Terminal reports whether s is a final state.
func (s RunStatus) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Valid reports whether s is one of the known states.
func (s RunStatus) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusCompleted, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// AllowedFrom lists the states a run may move to `to` from. Stores use it as
// the condition of their write, so a late completion cannot overwrite a
// cancellation. queued → failed is allowed for runs that fail before their
// sandbox starts (for example, activation fails).
func AllowedFrom(to RunStatus) []RunStatus {
	switch to {
	case StatusRunning:
		return []RunStatus{StatusQueued}
	case StatusCompleted:
		return []RunStatus{StatusRunning}
	case StatusFailed, StatusCancelled:
		return []RunStatus{StatusQueued, StatusRunning}
	}
	return nil
}

// CanTransition reports whether a run in state from may move to state to.
func CanTransition(from, to RunStatus) bool {
	return slices.Contains(AllowedFrom(to), from)
}

// Run is a run session: the canonical request and everything belay learned
// while running it. Zero times are unset.
type Run struct {
	ID              string        `json:"runId"`
	Status          RunStatus     `json:"status"`
	Request         RunRequest    `json:"request"`
	RequestHash     string        `json:"-"`
	CreatedAt       time.Time     `json:"createdAt"`
	UpdatedAt       time.Time     `json:"updatedAt"`
	StartedAt       time.Time     `json:"startedAt,omitzero"`
	FinishedAt      time.Time     `json:"finishedAt,omitzero"`
	CancelRequested bool          `json:"cancelRequested"`
	Reason          string        `json:"reason,omitempty"`
	ExitCode        *int          `json:"exitCode,omitempty"`
	Usage           Usage         `json:"usage"`
	Checks          []CheckResult `json:"checks,omitempty"`
	ChangedFiles    []string      `json:"changedFiles,omitempty"`
	Artifacts       []string      `json:"artifacts,omitempty"`
	LastSeq         int64         `json:"lastSeq"`
	// Attempt counts the sandboxes started for the run: 1 from activation
	// on, one more for each resume. A claim code admits one attempt.
	Attempt int `json:"attempt,omitempty"`
	// SandboxRef is what the sandbox of the current attempt is to the
	// platform running it (an ECS task ARN), recorded when it claims, so
	// cancel and cleanup can stop it. Empty when unknown.
	SandboxRef string `json:"sandboxRef,omitempty"`
	// SandboxEvents and SandboxEventBytes count what the run's sandbox has
	// appended to its log (see SandboxEventLimits).
	SandboxEvents     int   `json:"sandboxEvents,omitempty"`
	SandboxEventBytes int64 `json:"sandboxEventBytes,omitempty"`
}

// Usage counts what a run spent.
type Usage struct {
	ModelRequests    int   `json:"modelRequests"`
	MaxRequests      int   `json:"maxRequests"`
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// UsageDelta is what one model call adds to a run's usage.
type UsageDelta struct {
	ModelRequests    int
	PromptTokens     int64
	CompletionTokens int64
}

// CheckResult is the outcome of one check the sandbox ran.
type CheckResult struct {
	Argv       []string `json:"argv"`
	ExitCode   int      `json:"exitCode"`
	DurationMs int64    `json:"durationMs"`
	OutputTail string   `json:"outputTail,omitempty"`
}

// Transition moves a run to state To and appends Events in the same atomic
// write. Reason, ExitCode, Checks, ChangedFiles and Artifacts are recorded
// when set (they describe a terminal outcome); so is Attempt (activation
// sets 1).
type Transition struct {
	To           RunStatus
	At           time.Time
	Attempt      int
	Reason       string
	ExitCode     *int
	Checks       []CheckResult
	ChangedFiles []string
	Artifacts    []string
	Events       []EventInput
}

// ListRunsQuery selects runs newest first. Status filters when set; Cursor
// is the NextCursor of a previous page.
type ListRunsQuery struct {
	Status RunStatus
	Limit  int
	Cursor string
}

// RunPage is one page of runs. NextCursor is empty on the last page.
type RunPage struct {
	Runs       []Run
	NextCursor string
}
