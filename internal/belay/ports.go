package belay

import (
	"context"
	"io"
	"time"
)

// RunStore keeps run sessions and their event logs. Every state change and
// the events it causes are written in one atomic step; sequence numbers are
// gapless per run.
type RunStore interface {
	// CreateRun stores run (status queued, with ID, Request, RequestHash,
	// CreatedAt and Usage.MaxRequests set) together with its run.queued
	// event (RunQueuedEvent). With a non-empty idempotencyKey that was used
	// before, it stores nothing and returns the earlier run and
	// created=false when the RequestHash matches. Returns invalid for a run
	// PrepareNewRun refuses; conflict if the key was used with another
	// request hash or the run id exists.
	CreateRun(ctx context.Context, run Run, idempotencyKey string) (stored Run, created bool, err error)

	// GetRun returns the run. Returns not_found if it does not exist.
	GetRun(ctx context.Context, id string) (Run, error)

	// ListRuns returns runs newest first. Returns invalid for a cursor it
	// did not issue.
	ListRuns(ctx context.Context, q ListRunsQuery) (RunPage, error)

	// Transition moves the run to t.To if its current state allows it (see
	// AllowedFrom), recording the outcome fields and appending t.Events in
	// the same atomic write (TimedEvents). Returns invalid for an unknown
	// state or events CheckEvents refuses; not_found if the run does not
	// exist; conflict if its state does not allow the move (a terminal state
	// never changes), leaving the run and its log untouched.
	Transition(ctx context.Context, id string, t Transition) (Run, error)

	// RequestCancel sets cancelRequested and appends a run.cancel_requested
	// event, once; a second request changes nothing and succeeds. Returns
	// not_found if the run does not exist; conflict if it is terminal.
	RequestCancel(ctx context.Context, id string, at time.Time) (Run, error)

	// RecordUsage adds d to the run's usage counters. Returns not_found if
	// the run does not exist.
	RecordUsage(ctx context.Context, id string, d UsageDelta) error

	// AppendEvents appends events to a non-terminal run's log in one atomic
	// step and returns them with their sequence numbers. A non-empty batchID
	// makes the call idempotent: repeating it appends nothing and returns
	// the events of the first call (those still in the buffer). Events that
	// fall out of the bounded buffer are removed. Every adapter takes up to
	// MaxAppendEvents events in one call; one may refuse more with
	// too_large. Returns invalid for events CheckEvents refuses; not_found
	// if the run does not exist; conflict if it is terminal.
	AppendEvents(ctx context.Context, runID, batchID string, events []EventInput) ([]Event, error)

	// AppendSandboxEvents is AppendEvents for what the run's sandbox sent:
	// the events are marked SourceSandbox (every other write marks its
	// events SourceControl), and the same atomic write counts them against
	// the run's sandbox-event caps (Run.SandboxEvents,
	// Run.SandboxEventBytes). A batch that would take the run past
	// limits.MaxEvents or limits.MaxBytes is refused whole with too_large,
	// naming the cap, and appends nothing; a repeated batchID is answered
	// as AppendEvents answers it, without counting again. Returns invalid
	// for limits that are not Valid, besides AppendEvents' codes.
	AppendSandboxEvents(ctx context.Context, runID, batchID string, events []EventInput, limits SandboxEventLimits) ([]Event, error)

	// ListEvents returns up to limit events with Seq > after, oldest first,
	// and always reports OldestSeq as the oldest event still kept. Returns
	// not_found if the run does not exist.
	ListEvents(ctx context.Context, runID string, after int64, limit int) (EventPage, error)
}

// CapabilityStore keeps each run's model-call budget. Consume is atomic: of
// any number of concurrent calls against MaxRequests = n, exactly n succeed.
type CapabilityStore interface {
	// ActivateCapability stores c as the run's active capability (UsedRequests
	// 0). Returns invalid for a capability CheckCapability refuses;
	// not_found, storing nothing, if the run does not exist (a capability
	// never outlives or precedes its run, so nothing can spend one for a
	// run id that names no run); conflict if the run already has a
	// capability, active or revoked: a capability is never swapped mid-run
	// or revived.
	ActivateCapability(ctx context.Context, c Capability) error

	// ConsumeModelRequest spends one request of the run's capability for the
	// given model at time now. The outcome is inactive for a missing,
	// revoked or other-model capability, expired at or after ExpiresAt,
	// exhausted when UsedRequests reached MaxRequests. Only ok spends.
	// Remaining is what is left to spend after the call: 0 when inactive.
	ConsumeModelRequest(ctx context.Context, runID, model string, now time.Time) (ConsumeResult, error)

	// RevokeCapability ends the run's capability for good. It is idempotent
	// and succeeds when the run has none.
	RevokeCapability(ctx context.Context, runID string) error

	// GetCapability returns the run's capability. Returns not_found if it has none.
	GetCapability(ctx context.Context, runID string) (Capability, error)
}

// ApprovalStore keeps approval requests and their decisions. Each write
// appends its event (approval.requested, approval.decided) atomically.
type ApprovalStore interface {
	// CreateApproval stores a, pending or already decided (by policy), and
	// appends approval.requested (and approval.decided when decided; see
	// ApprovalRequestedEvent, ApprovalDecidedEvent). Returns invalid for an
	// approval CheckApproval refuses; not_found if the run does not exist;
	// conflict if it is terminal or the approval id exists.
	CreateApproval(ctx context.Context, a Approval) (Approval, error)

	// GetApproval returns one approval. Returns not_found if it does not exist.
	GetApproval(ctx context.Context, runID, id string) (Approval, error)

	// ListApprovals returns a run's approvals, pending and decided, oldest
	// first. Returns not_found if the run does not exist.
	ListApprovals(ctx context.Context, runID string) ([]Approval, error)

	// DecideApproval records the decision of a pending approval. Returns
	// not_found if it does not exist; conflict if it is already decided or
	// the run is terminal. Approval events carry the approvalId in their data.
	DecideApproval(ctx context.Context, runID, id string, d Decision, reason, by string, at time.Time) (Approval, error)
}

// ClaimStore keeps the claim codes of the claim exchange (see Claim), and
// what a claimed sandbox is to the platform that runs it.
type ClaimStore interface {
	// CreateClaim stores c, unused. Returns invalid for a claim CheckClaim
	// refuses; not_found if the run does not exist; conflict if a claim
	// with the same code hash exists.
	CreateClaim(ctx context.Context, c Claim) error

	// ConsumeClaim exchanges the claim whose code hashes to codeHash: in one
	// conditional write it marks the claim used and returns it. runID, when
	// not empty, is the run the caller expects. It refuses with a
	// *ClaimError (code unauthorized), writing nothing, when no claim has
	// that hash (ClaimUnknown), runID names another run (ClaimWrongRun), the
	// claim was used (ClaimUsed), now is at or after its ExpiresAt
	// (ClaimExpired), its run is not running (ClaimRunNotRunning) or is at
	// another attempt than the claim's (ClaimWrongAttempt), in that order.
	// Of any number of concurrent calls with one code, at most one succeeds.
	ConsumeClaim(ctx context.Context, codeHash [32]byte, runID string, now time.Time) (Claim, error)

	// RecordSandboxRef stores ref (an ECS task ARN, say) as the sandbox of
	// the run's attempt, for cancel and cleanup to stop it (Run.SandboxRef).
	// Returns invalid for a ref CheckSandboxRef refuses; not_found if the
	// run does not exist; conflict if it is terminal or at another attempt.
	RecordSandboxRef(ctx context.Context, runID string, attempt int, ref string) error
}

// Store is everything the control plane persists outside artifacts.
type Store interface {
	RunStore
	CapabilityStore
	ApprovalStore
	ClaimStore
	CheckpointStore
	ModelCallStore
	DeliveryStore
	SessionStore
	ConnectionStore
}

// ArtifactInfo names one stored artifact and its size in bytes.
type ArtifactInfo struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// ArtifactStore keeps each run's result files (result.json, patch.diff,
// transcript.jsonl).
type ArtifactStore interface {
	// PutArtifact stores content under the run and name, replacing any
	// earlier one. Returns invalid for a bad name; too_large over the cap.
	PutArtifact(ctx context.Context, runID, name string, content []byte) error

	// GetArtifact returns the content. Returns not_found if it does not exist.
	GetArtifact(ctx context.Context, runID, name string) ([]byte, error)

	// ListArtifacts returns the run's artifacts sorted by name (empty when
	// it has none).
	ListArtifacts(ctx context.Context, runID string) ([]ArtifactInfo, error)

	// DeleteArtifact removes the artifact (a checkpoint that a newer one
	// replaced). It is idempotent: deleting what does not exist succeeds.
	// Returns invalid for a bad run id or name.
	DeleteArtifact(ctx context.Context, runID, name string) error
}

// MaxArtifactBytes caps one artifact.
const MaxArtifactBytes = 8 << 20

// ArtifactNames are the artifacts a run produces.
var ArtifactNames = []string{"result.json", "patch.diff", "transcript.jsonl"}

// SourceBundleName is the artifact name a run's git source bundle is kept
// under, beside its other artifacts but never listed or served to callers
// (it is not one of ArtifactNames).
const SourceBundleName = "source.bundle"

// SourceStore keeps what a run starts from that its record cannot hold: a
// git source's bundle (SourceBundleName), up to the repository limit's
// size, streamed rather than held in memory.
type SourceStore interface {
	// PutSource stores the run's bundle, read from r to its end, replacing
	// any earlier one, and returns its size and SHA-256. Returns invalid
	// for a bad run id; too_large, storing nothing, when r holds more than
	// maxBytes.
	PutSource(ctx context.Context, runID string, r io.Reader, maxBytes int64) (SourceBundle, error)

	// OpenSource opens the run's bundle and returns its size. Returns
	// not_found if the run has none.
	OpenSource(ctx context.Context, runID string) (io.ReadCloser, int64, error)
}
