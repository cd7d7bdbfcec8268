package belay

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// Checkpoints and resume (DESIGN.md "Checkpoints and resume"): while it
// works, a run's sandbox saves checkpoints through the internal API, before
// each tool call runs (the call marked pending) and after its result. A
// checkpoint holds the agent's conversation so far and the workspace's
// change since the base. It is stored in the artifact store under a name of
// its own (CheckpointArtifactName, never listed to callers), and the run
// points at the latest one (Run.Checkpoint). When a sandbox is lost, the
// control plane starts a new one for the same run, a new attempt, which
// continues from that checkpoint; the capability, its budget and the run's
// deadline span every attempt.

// MaxCheckpointBytes caps one checkpoint as the sandbox uploads it. On AWS
// the upload goes through API Gateway to the sandboxapi Lambda, whose
// request payload is at most 6 MB; a binary body arrives there base64
// encoded (4/3 as large), so 4 MiB is the most that always fits, with room
// for the event's headers.
const MaxCheckpointBytes = 4 << 20

// DefaultMaxResumes is how many times a run is resumed on a new sandbox,
// at most, unless the operator says otherwise: three attempts in all.
const DefaultMaxResumes = 2

// MaxMaxResumes bounds what an operator may set: more would let a sandbox
// that dies at once be started again and again.
const MaxMaxResumes = 20

// EnvMaxResumes is the variable that sets the most resumes of a run, for
// belay serve and the steps function alike: a whole number from 0 (never
// resume) to MaxMaxResumes.
const EnvMaxResumes = "BELAY_MAX_RESUMES"

// MinResumeTime is the least time a run must have left before its
// deadline for a lost sandbox to be replaced: a sandbox needs a few
// seconds to start and rebuild its workspace before it can do anything.
const MinResumeTime = 5 * time.Second

// CheckpointRef is what the run record keeps of its latest checkpoint: its
// sequence number (increasing over the whole run, across attempts), the
// attempt whose sandbox saved it, the agent's step, the tool call it marks
// pending (the tool's name; empty when none was running), its size, when
// it was stored, and, when the sandbox could not save a checkpoint to
// resume from (too large, say), why: the run is then not resumed.
type CheckpointRef struct {
	Seq         int64     `json:"seq"`
	Attempt     int       `json:"attempt"`
	Step        int       `json:"step"`
	Pending     string    `json:"pending,omitempty"`
	Size        int64     `json:"size"`
	At          time.Time `json:"at"`
	Unresumable string    `json:"unresumable,omitempty"`
}

// Name is the artifact name the checkpoint is stored under.
func (c CheckpointRef) Name() string { return CheckpointArtifactName(c.Attempt, c.Seq) }

// Resumable reports whether a run may resume from c.
func (c CheckpointRef) Resumable() bool { return c.Unresumable == "" }

// MaxPendingToolLen bounds CheckpointRef.Pending, a model-chosen name.
const MaxPendingToolLen = 128

// MaxUnresumableLen bounds CheckpointRef.Unresumable.
const MaxUnresumableLen = 500

// CheckCheckpointRef returns invalid for a ref a store must not keep: a
// sequence number or attempt below 1, a negative step or size, a size over
// MaxCheckpointBytes, no time, or a pending tool or reason over its bound.
func CheckCheckpointRef(c CheckpointRef) error {
	switch {
	case c.Seq < 1:
		return FieldErrorf(CodeInvalid, "checkpoint.seq", "must be at least 1, not %d", c.Seq)
	case c.Attempt < 1:
		return FieldErrorf(CodeInvalid, "checkpoint.attempt", "must be at least 1, not %d", c.Attempt)
	case c.Step < 0:
		return FieldErrorf(CodeInvalid, "checkpoint.step", "must not be negative, not %d", c.Step)
	case c.Size < 0 || c.Size > MaxCheckpointBytes:
		return FieldErrorf(CodeInvalid, "checkpoint.size", "must be 0 to %d bytes, not %d", MaxCheckpointBytes, c.Size)
	case c.At.IsZero():
		return FieldErrorf(CodeInvalid, "checkpoint.at", "is unset")
	case len(c.Pending) > MaxPendingToolLen:
		return FieldErrorf(CodeInvalid, "checkpoint.pending", "must be at most %d bytes", MaxPendingToolLen)
	case len(c.Unresumable) > MaxUnresumableLen:
		return FieldErrorf(CodeInvalid, "checkpoint.unresumable", "must be at most %d bytes", MaxUnresumableLen)
	}
	return nil
}

// checkpointPrefix and checkpointSuffix frame a checkpoint's artifact name.
const (
	checkpointPrefix = "checkpoint-"
	checkpointSuffix = ".json"
)

// CheckpointArtifactName is the artifact name of checkpoint seq of an
// attempt: "checkpoint-<attempt>-<seq>.json". The attempt is part of it so
// that a sandbox of a lost attempt, were it still to upload, could never
// overwrite a checkpoint of the attempt that replaced it. Like staged
// outputs, checkpoints are never listed or served to callers
// (IsPublicArtifact is false for them).
func CheckpointArtifactName(attempt int, seq int64) string {
	return checkpointPrefix + strconv.Itoa(attempt) + "-" + strconv.FormatInt(seq, 10) + checkpointSuffix
}

// IsCheckpointArtifact reports whether name is a checkpoint's artifact name.
func IsCheckpointArtifact(name string) bool {
	n, ok := strings.CutPrefix(name, checkpointPrefix)
	if !ok {
		return false
	}
	n, ok = strings.CutSuffix(n, checkpointSuffix)
	if !ok {
		return false
	}
	a, q, ok := strings.Cut(n, "-")
	return ok && isPositiveDecimal(a) && isPositiveDecimal(q)
}

// isPositiveDecimal reports whether s is a decimal number above zero,
// written without sign or leading zeros.
func isPositiveDecimal(s string) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && n > 0 && strconv.FormatInt(n, 10) == s
}

// LostAttempt is one attempt of a run whose sandbox was lost (killed, out
// of memory, its task stopped, the control plane restarted) before it
// delivered a result, and after which the run was resumed or failed.
type LostAttempt struct {
	Attempt   int       `json:"attempt"`
	StartedAt time.Time `json:"startedAt"`
	LostAt    time.Time `json:"lostAt"`
	Reason    string    `json:"reason"`
}

// AttemptStartedAt is when the run's current attempt started: the run's
// start for the first, the loss of the one before for each resume.
func (r Run) AttemptStartedAt() time.Time {
	if n := len(r.LostAttempts); n > 0 {
		return r.LostAttempts[n-1].LostAt
	}
	return r.StartedAt
}

// Resume is a store's instruction to move a running run on to its next
// attempt, because the sandbox of attempt From was lost: Reason says how.
// Events (sandbox.lost, run.resumed) are appended in the same write.
type Resume struct {
	From   int
	At     time.Time
	Reason string
	Events []EventInput
}

// MaxLostReasonLen bounds Resume.Reason.
const MaxLostReasonLen = 500

// ApplyResume is the one rule both stores apply in ResumeRun: it checks
// that run may resume from attempt r.From and changes it as the resume
// does (the next attempt, the lost one recorded, no sandbox ref, updated
// at r.At). Returns invalid for a malformed resume; conflict when the run
// is not running, a cancel was requested, or it is at another attempt.
func ApplyResume(run *Run, r Resume) error {
	if err := CheckResume(r); err != nil {
		return err
	}
	switch {
	case run.Status != StatusRunning:
		return Errorf(CodeConflict, "run %s is %s; only a running run resumes", run.ID, run.Status)
	case run.CancelRequested:
		return Errorf(CodeConflict, "run %s was asked to cancel; it does not resume", run.ID)
	case run.Attempt != r.From:
		return Errorf(CodeConflict, "run %s is at attempt %d, not %d", run.ID, run.Attempt, r.From)
	}
	run.LostAttempts = append(run.LostAttempts, LostAttempt{
		Attempt: r.From, StartedAt: run.AttemptStartedAt(), LostAt: r.At, Reason: r.Reason,
	})
	run.Attempt = r.From + 1
	run.SandboxRef = ""
	run.UpdatedAt = r.At
	return nil
}

// CheckResume returns invalid for a resume a store must not apply.
func CheckResume(r Resume) error {
	switch {
	case r.From < 1:
		return FieldErrorf(CodeInvalid, "from", "must be at least 1, not %d", r.From)
	case r.At.IsZero():
		return FieldErrorf(CodeInvalid, "at", "is unset")
	case r.Reason == "" || len(r.Reason) > MaxLostReasonLen:
		return FieldErrorf(CodeInvalid, "reason", "must be 1 to %d bytes", MaxLostReasonLen)
	}
	return CheckEvents(r.Events)
}

// CheckpointStore keeps what the control plane knows of a run's
// checkpoints and its attempts.
type CheckpointStore interface {
	// RecordCheckpoint points the run at c, its newest checkpoint, and
	// returns the one it pointed at before (zero when none), which the
	// caller may then delete. Recording the checkpoint the run already
	// points at (same Seq and Attempt) changes nothing and returns a zero
	// previous. Returns invalid for a ref CheckCheckpointRef refuses;
	// not_found if the run does not exist; conflict if it is not running,
	// is at another attempt than c's, or already points at a checkpoint
	// with a higher Seq.
	RecordCheckpoint(ctx context.Context, runID string, c CheckpointRef) (previous CheckpointRef, err error)

	// ResumeRun moves the running run from attempt r.From to the next
	// (see ApplyResume) and appends r.Events, in one atomic write. The
	// capability and the checkpoint pointer are left as they are.
	// Returns invalid for a malformed resume; not_found if the run does
	// not exist; conflict if it is not running, its cancel was requested,
	// or it is not at attempt r.From (another decider resumed it first).
	ResumeRun(ctx context.Context, runID string, r Resume) (Run, error)
}

// CheckpointAllowed is RecordCheckpoint's condition on the run, the same on
// every store: r takes checkpoint c only while it runs, at c's attempt,
// and when c is newer than the one it points at. The conflict it returns
// says which.
func CheckpointAllowed(r Run, c CheckpointRef) error {
	switch {
	case r.Status != StatusRunning:
		return Errorf(CodeConflict, "run %s is %s; it takes no checkpoints", r.ID, r.Status)
	case r.Attempt != c.Attempt:
		return Errorf(CodeConflict, "run %s is at attempt %d, not %d", r.ID, r.Attempt, c.Attempt)
	case r.Checkpoint != nil && r.Checkpoint.Seq >= c.Seq:
		return Errorf(CodeConflict, "run %s has checkpoint %d already; checkpoint %d is not newer", r.ID, r.Checkpoint.Seq, c.Seq)
	}
	return nil
}
