package belay

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// The claim exchange (DESIGN.md "Claim exchange"): a sandbox started with no
// secret of its own (a Fargate task, the OCI launcher's container) gets a
// single-use, short-lived claim code as its only per-run input, and trades
// it once, through POST /internal/v1/claim, for its run's spec, the three
// audience tokens and where to upload its outputs. Only the code's SHA-256
// is stored, so a copy of the table holds nothing a sandbox could present.
const (
	// ClaimCodeBytes is the entropy of a claim code: 256 bits.
	ClaimCodeBytes = 32
	// ClaimTTL is how long a claim code may wait to be exchanged.
	ClaimTTL = 5 * time.Minute
	// MaxSandboxRefLen bounds what identifies a run's sandbox to the
	// platform that runs it (an ECS task ARN is at most about 200 bytes).
	MaxSandboxRefLen = 512
)

// claimEncoding is unpadded base64url in strict mode: a code has exactly
// one spelling, 43 characters.
var claimEncoding = base64.RawURLEncoding.Strict()

// Claim is a stored claim code: the run and attempt it admits, the SHA-256
// of the code (never the code) and when it stops being accepted.
type Claim struct {
	RunID     string
	Attempt   int
	CodeHash  [sha256.Size]byte
	ExpiresAt time.Time
}

// ClaimCode is a claim code on its way from the orchestrator to the sandbox
// (SandboxSpec.Claim, then BELAY_CLAIM). Its String, Format, LogValue and
// MarshalJSON methods redact it, so a spec printed, logged or encoded by
// mistake leaks no code; Reveal gives the code to the one place that
// passes it on.
type ClaimCode string

const redactedClaim = "[redacted claim code]"

// Reveal returns the code itself, for the launcher that hands it to the
// sandbox. Never log what it returns.
func (c ClaimCode) Reveal() string { return string(c) }

// String redacts the code.
func (ClaimCode) String() string { return redactedClaim }

// Format redacts the code under every fmt verb, including %#v and %q.
func (ClaimCode) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redactedClaim) }

// LogValue redacts the code in slog output.
func (ClaimCode) LogValue() slog.Value { return slog.StringValue(redactedClaim) }

// MarshalJSON redacts the code: it never travels inside a JSON document.
func (ClaimCode) MarshalJSON() ([]byte, error) { return []byte(`"` + redactedClaim + `"`), nil }

// NewClaim draws a claim code for the run's attempt from entropy and
// returns it with the Claim to store: its hash, expiring ClaimTTL after now.
// It fails only when entropy does.
func NewClaim(runID string, attempt int, now time.Time, entropy io.Reader) (ClaimCode, Claim, error) {
	var raw [ClaimCodeBytes]byte
	if _, err := io.ReadFull(entropy, raw[:]); err != nil {
		return "", Claim{}, fmt.Errorf("new claim code for run %s: %w", runID, err)
	}
	return ClaimCode(claimEncoding.EncodeToString(raw[:])), Claim{
		RunID:     runID,
		Attempt:   attempt,
		CodeHash:  sha256.Sum256(raw[:]),
		ExpiresAt: now.Add(ClaimTTL),
	}, nil
}

// HashClaimCode returns the hash a claim code is stored under, and false
// for anything that is not a claim code (wrong length or alphabet).
func HashClaimCode(code string) ([sha256.Size]byte, bool) {
	if len(code) != claimEncoding.EncodedLen(ClaimCodeBytes) {
		return [sha256.Size]byte{}, false
	}
	raw, err := claimEncoding.DecodeString(code)
	if err != nil || len(raw) != ClaimCodeBytes {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256(raw), true
}

// CheckClaim returns invalid for a claim a store must not keep: without a
// run id, an attempt of at least 1, an expiry or a code hash.
func CheckClaim(c Claim) error {
	switch {
	case c.RunID == "":
		return FieldErrorf(CodeInvalid, "runId", "is empty")
	case c.Attempt < 1:
		return FieldErrorf(CodeInvalid, "attempt", "must be at least 1, not %d", c.Attempt)
	case c.ExpiresAt.IsZero():
		return FieldErrorf(CodeInvalid, "expiresAt", "is unset")
	case c.CodeHash == [sha256.Size]byte{}:
		return FieldErrorf(CodeInvalid, "codeHash", "is unset")
	}
	return nil
}

// CheckSandboxRef returns invalid for a sandbox reference that is empty,
// longer than MaxSandboxRefLen or not printable ASCII.
func CheckSandboxRef(ref string) error {
	if ref == "" || len(ref) > MaxSandboxRefLen {
		return FieldErrorf(CodeInvalid, "sandboxRef", "must be 1 to %d characters", MaxSandboxRefLen)
	}
	for i := 0; i < len(ref); i++ {
		if ref[i] < 0x21 || ref[i] > 0x7e {
			return FieldErrorf(CodeInvalid, "sandboxRef", "may hold only printable ASCII without spaces")
		}
	}
	return nil
}

// ClaimRefusal says why a claim code was refused. It is for logs and
// metrics only: the caller gets one answer whatever the reason.
type ClaimRefusal string

// The reasons a claim is refused.
const (
	// ClaimMalformed: not a claim code at all.
	ClaimMalformed ClaimRefusal = "malformed"
	// ClaimUnknown: no claim has this code.
	ClaimUnknown ClaimRefusal = "unknown"
	// ClaimUsed: the code was exchanged before.
	ClaimUsed ClaimRefusal = "used"
	// ClaimExpired: the code's time is over.
	ClaimExpired ClaimRefusal = "expired"
	// ClaimWrongRun: the caller named another run than the code's.
	ClaimWrongRun ClaimRefusal = "wrong_run"
	// ClaimWrongAttempt: the run has moved on to another attempt.
	ClaimWrongAttempt ClaimRefusal = "wrong_attempt"
	// ClaimRunNotRunning: the run is not running (queued, or ended).
	ClaimRunNotRunning ClaimRefusal = "run_not_running"
	// ClaimCapabilityInactive: the run's capability is revoked, missing or
	// expired, so there is nothing left to hand out.
	ClaimCapabilityInactive ClaimRefusal = "capability_inactive"
)

// claimRefusedMessage is the single answer a caller gets for any refused
// claim. It never names the reason or quotes the code.
const claimRefusedMessage = "invalid, used or expired claim code"

// ClaimError is a refused claim. Its Reason tells the log why; it unwraps
// to a *Error with code unauthorized and one fixed message, so every
// refusal looks the same to the caller.
type ClaimError struct {
	Reason ClaimRefusal
}

// Error names the reason, for logs. Callers see ErrorMessage instead.
func (e *ClaimError) Error() string { return "claim refused: " + string(e.Reason) }

// Unwrap gives ErrorCode and ErrorMessage the single external answer.
func (e *ClaimError) Unwrap() error {
	return &Error{Code: CodeUnauthorized, Message: claimRefusedMessage}
}

// RefuseClaim returns the *ClaimError for reason.
func RefuseClaim(reason ClaimRefusal) error { return &ClaimError{Reason: reason} }

// ClaimRefusalOf returns the reason of a refused claim in err's chain, and
// false when err is not a claim refusal.
func ClaimRefusalOf(err error) (ClaimRefusal, bool) {
	var ce *ClaimError
	if errors.As(err, &ce) {
		return ce.Reason, true
	}
	return "", false
}
