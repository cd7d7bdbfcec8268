package belay

import (
	"encoding/json"
	"slices"
	"time"
)

// ApprovalPolicy says how a run's risky tool calls (today: shell) are decided.
type ApprovalPolicy string

// The approval policies. DenyAll is the default.
const (
	PolicyDenyAll   ApprovalPolicy = "deny_all"
	PolicyAllowList ApprovalPolicy = "allow_list"
	PolicyAllowAll  ApprovalPolicy = "allow_all"
	PolicyAsk       ApprovalPolicy = "ask"
)

// Valid reports whether p is one of the known policies.
func (p ApprovalPolicy) Valid() bool {
	switch p {
	case PolicyDenyAll, PolicyAllowList, PolicyAllowAll, PolicyAsk:
		return true
	}
	return false
}

// Decision is the answer to an approval request.
type Decision string

// The decisions a person (or a policy, or a timeout) can give.
const (
	DecisionAllowOnce    Decision = "allow_once"
	DecisionAllowSession Decision = "allow_session"
	DecisionDeny         Decision = "deny"
	DecisionCancel       Decision = "cancel"
)

// Valid reports whether d is one of the known decisions.
func (d Decision) Valid() bool {
	switch d {
	case DecisionAllowOnce, DecisionAllowSession, DecisionDeny, DecisionCancel:
		return true
	}
	return false
}

// Allows reports whether the decision lets the tool call run.
func (d Decision) Allows() bool {
	return d == DecisionAllowOnce || d == DecisionAllowSession
}

// ApprovalStatus is pending until a decision is recorded, then decided.
type ApprovalStatus string

// The approval statuses.
const (
	ApprovalPending ApprovalStatus = "pending"
	ApprovalDecided ApprovalStatus = "decided"
)

// Approval is one request to run a risky tool call, and its decision.
// DecidedBy says who decided: "user", "policy" or "timeout".
type Approval struct {
	ID          string          `json:"approvalId"`
	RunID       string          `json:"runId"`
	Tool        string          `json:"tool"`
	Arguments   json.RawMessage `json:"arguments,omitempty"`
	Status      ApprovalStatus  `json:"status"`
	Decision    Decision        `json:"decision,omitempty"`
	Reason      string          `json:"reason,omitempty"`
	DecidedBy   string          `json:"decidedBy,omitempty"`
	RequestedAt time.Time       `json:"requestedAt"`
	ExpiresAt   time.Time       `json:"expiresAt"`
	DecidedAt   time.Time       `json:"decidedAt,omitzero"`
}

// PolicyDecision is what a run's approval configuration says about a tool
// call before any person is asked: a decision, or ok=false for "ask".
func (c ApprovalConfig) PolicyDecision(tool string) (d Decision, ok bool) {
	switch c.Policy {
	case PolicyAllowAll:
		return DecisionAllowOnce, true
	case PolicyAllowList:
		if slices.Contains(c.Allow, tool) {
			return DecisionAllowOnce, true
		}
		return DecisionDeny, true
	case PolicyAsk:
		if slices.Contains(c.Allow, tool) {
			return DecisionAllowOnce, true
		}
		return "", false
	default:
		return DecisionDeny, true
	}
}
