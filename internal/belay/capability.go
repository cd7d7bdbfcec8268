package belay

import "time"

// CapabilityState is a capability's life: active while the run may call the
// model, revoked afterwards for good.
type CapabilityState string

// The capability states.
const (
	CapabilityActive  CapabilityState = "active"
	CapabilityRevoked CapabilityState = "revoked"
)

// Capability is a run's short-lived model-call budget. It holds only model,
// expiry and counts: never keys, prompts, artifacts or raw tokens.
type Capability struct {
	RunID        string
	Model        string
	State        CapabilityState
	ExpiresAt    time.Time
	MaxRequests  int
	UsedRequests int
}

// ConsumeOutcome classifies one attempt to spend a model request.
type ConsumeOutcome string

// The consume outcomes. Inactive covers a missing, revoked or other-model
// capability.
const (
	ConsumeOK        ConsumeOutcome = "ok"
	ConsumeInactive  ConsumeOutcome = "inactive"
	ConsumeExpired   ConsumeOutcome = "expired"
	ConsumeExhausted ConsumeOutcome = "exhausted"
)

// ConsumeResult is the outcome of a consume and the requests left after it.
type ConsumeResult struct {
	Outcome   ConsumeOutcome
	Remaining int
}
