package belay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Orchestrator sequences runs: activate the capability, launch the sandbox,
// wait, validate the result, finalize, and on every path revoke the
// capability and clean the sandbox. The embedded one runs in-process; on AWS
// a Step Functions state machine runs the same steps.
type Orchestrator interface {
	// Submit starts sequencing a stored, queued run and returns without
	// waiting for it.
	Submit(ctx context.Context, runID string) error

	// Cancel stops the run's sandbox, if any, so the run finalizes as
	// cancelled. The caller has already recorded cancelRequested and
	// revoked the capability. It is idempotent.
	Cancel(ctx context.Context, runID string) error
}

// SandboxSpec is what a sandbox is told about its run. It is written as
// spec.json into the sandbox workspace (file mode) or answers the claim
// exchange (claim mode); Tokens and Claim never are part of it (tokens
// travel as owner-only files or in the claim answer, see DESIGN.md "Sandbox
// entry" and "Claim exchange").
type SandboxSpec struct {
	RunID       string `json:"runId"`
	Model       string `json:"model"`
	Instruction string `json:"instruction"`
	Files       []File `json:"files"`
	// Source, instead of Files, is a git source the control plane fetched:
	// the sandbox downloads its bundle (through the internal API, or the
	// claim answer's URL) and builds its repository from it, with
	// Source.Git.Commit as the base commit.
	Source          *Source        `json:"source,omitempty"`
	AllowedPaths    []string       `json:"allowedPaths"`
	Checks          [][]string     `json:"checks"`
	MaxSteps        int            `json:"maxSteps"`
	WallTimeSeconds int            `json:"wallTimeSeconds"`
	Approval        ApprovalConfig `json:"approval"`
	// Turn, for a session's turn, is the conversation of the earlier turns
	// and the session's skills, which the agent starts with.
	Turn *TurnContext `json:"turn,omitempty"`
	// APIBaseURL is where the internal routes are, for example
	// "http://belay" when APISocket is set (a Unix socket in the
	// workspace) or the private API's URL on AWS.
	APIBaseURL string `json:"apiBaseUrl"`
	APISocket  string `json:"apiSocket,omitempty"`
	// APIPeerUID is the uid the listener of APISocket must run as: the
	// entry checks every connection's peer (SO_PEERCRED) and refuses any
	// other, and one of its own uid unless APIPeerSharesUID. Required
	// with APISocket.
	APIPeerUID *int `json:"apiPeerUid,omitempty"`
	// APIPeerSharesUID says the listener runs as the sandbox's own uid:
	// only the weak, non-root isolation tier of the process launcher,
	// where a process of the sandbox cannot be told from the control
	// plane by its uid. The entry then accepts that uid.
	APIPeerSharesUID bool `json:"apiPeerSharesUid,omitempty"`
	// Attempt is the run's attempt this sandbox runs (Run.Attempt).
	Attempt int `json:"attempt"`
	// Lost is, for an attempt after the first, how the sandbox of the
	// attempt before ended: the entry then continues from the run's
	// latest checkpoint, and tells the model that the tool call it had
	// pending was interrupted, and why.
	Lost *LostAttempt `json:"lost,omitempty"`

	// Deadline is when the run's wall time ends (Run.Deadline): the one
	// clock the sandbox and the control plane both keep to. It is fixed
	// when the run starts and is the same for every attempt, so neither
	// side counts wall time from its own start.
	Deadline time.Time `json:"deadline"`

	// Tokens are the run's three audience tokens, for a launcher that
	// hands them over as files (file mode).
	Tokens SandboxTokens `json:"-"`
	// Claim is the attempt's single-use claim code, for a launcher that
	// starts the entry in claim mode (BELAY_CLAIM).
	Claim ClaimCode `json:"-"`
}

// SandboxTokens are a run's three audience tokens. They travel with a
// SandboxSpec to the launcher, so its String, Format and LogValue methods
// redact them: a spec or token set printed or logged by mistake leaks no
// token.
type SandboxTokens struct {
	Model     string
	Events    string
	Approvals string
}

const redactedTokens = "belay.SandboxTokens{Model:[redacted] Events:[redacted] Approvals:[redacted]}"

// String redacts the tokens.
func (SandboxTokens) String() string { return redactedTokens }

// Format redacts the tokens under every fmt verb, including %+v and %#v,
// which would otherwise print the fields, also of a SandboxSpec holding
// them.
func (SandboxTokens) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redactedTokens) }

// LogValue redacts the tokens in slog output, including the JSON handler,
// which would otherwise marshal the fields.
func (SandboxTokens) LogValue() slog.Value { return slog.StringValue(redactedTokens) }

// SpecFor builds the sandbox spec of a run from its canonical request.
func SpecFor(runID string, req RunRequest) SandboxSpec {
	return SandboxSpec{
		RunID:           runID,
		Model:           req.Model,
		Instruction:     req.Instruction,
		Files:           req.Files,
		Source:          req.Source,
		AllowedPaths:    req.AllowedPaths,
		Checks:          req.Checks,
		MaxSteps:        req.MaxSteps,
		WallTimeSeconds: req.WallTimeSeconds,
		Approval:        req.Approval,
		Turn:            req.Turn,
	}
}

// Deadline is when the run's wall time ends, in UTC: StartedAt plus the
// requested wall time. StartedAt is written once, when the run starts, so
// the deadline never moves, whichever attempt or process asks. Zero for a
// run that has not started.
func (r Run) Deadline() time.Time {
	if r.StartedAt.IsZero() {
		return time.Time{}
	}
	return r.StartedAt.Add(time.Duration(r.Request.WallTimeSeconds) * time.Second).UTC()
}

// SpecForRun builds the sandbox spec of a stored run: SpecFor its request,
// at the run's attempt, with the run's Deadline. The orchestrator and the
// claim exchange both build the spec here, so the two modes tell a sandbox
// the same.
func SpecForRun(run Run) SandboxSpec {
	spec := SpecFor(run.ID, run.Request)
	spec.Attempt = run.Attempt
	spec.Deadline = run.Deadline()
	if n := len(run.LostAttempts); n > 0 && run.LostAttempts[n-1].Attempt == run.Attempt-1 {
		lost := run.LostAttempts[n-1]
		spec.Lost = &lost
	}
	return spec
}

// Launcher starts sandboxes: a local hardened subprocess, or a Fargate task.
type Launcher interface {
	// Launch starts a sandbox for spec and returns once it is running.
	Launch(ctx context.Context, spec SandboxSpec) (Sandbox, error)
}

// Sandbox is one running sandbox.
type Sandbox interface {
	// Wait blocks until the sandbox exits or ctx ends, and returns how it
	// ended. What the sandbox produced it uploaded itself (see
	// StagedOutputName); a launcher never reads files a sandbox left.
	Wait(ctx context.Context) (SandboxExit, error)
	// Stop kills the sandbox; it is idempotent.
	Stop(ctx context.Context) error
	// Cleanup removes the sandbox's workspace; it is idempotent.
	Cleanup() error
}

// SandboxExit is how a sandbox ended.
type SandboxExit struct {
	ExitCode int
	Signaled bool
	// OOMKilled says the kernel killed a process of the sandbox (the
	// entry, or a command it ran) for going past the sandbox's memory
	// limit. A launcher that cannot tell leaves it false.
	OOMKilled bool
	Duration  time.Duration
}
