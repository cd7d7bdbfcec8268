package belay

import (
	"encoding/json"
	"fmt"
	"time"
)

// The rules in this file are what every Store adapter applies to what it is
// asked to keep, and the events a store writes on its own. They live here,
// once, so that the embedded adapter and the AWS adapter refuse the same
// input with the same codes and write the same log.

// MaxAppendEvents is the most events one AppendEvents call may carry on
// every adapter: a DynamoDB transaction holds at most 100 items, and an
// idempotent batch needs two of them besides its events (the run's state
// and the batch's record). Adapters return too_large beyond it.
const MaxAppendEvents = 98

// PrepareNewRun returns run as CreateRun keeps it: queued, with only what
// creation knows (ID, Request, RequestHash, CreatedAt, UpdatedAt, which
// defaults to CreatedAt, and Usage) and none of what a run learns later.
// Returns invalid for a run without an id or creation time, or in a state
// other than queued.
func PrepareNewRun(run Run) (Run, error) {
	switch {
	case run.ID == "":
		return Run{}, FieldErrorf(CodeInvalid, "runId", "is empty")
	case run.Status != "" && run.Status != StatusQueued:
		return Run{}, FieldErrorf(CodeInvalid, "status", "a new run is queued, not %s", run.Status)
	case run.CreatedAt.IsZero():
		return Run{}, FieldErrorf(CodeInvalid, "createdAt", "is unset")
	}
	stored := Run{
		ID: run.ID, Status: StatusQueued, Request: run.Request, RequestHash: run.RequestHash,
		CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt, Usage: run.Usage,
	}
	if stored.UpdatedAt.IsZero() {
		stored.UpdatedAt = stored.CreatedAt
	}
	return stored, nil
}

// RunQueuedEvent is the run.queued event CreateRun appends as a run's first:
// what a reader of the log needs to know about the run without fetching it.
func RunQueuedEvent(run Run) EventInput {
	// Only strings and ints: marshalling cannot fail.
	data, _ := json.Marshal(struct {
		RunID       string `json:"runId"`
		Model       string `json:"model"`
		MaxRequests int    `json:"maxRequests"`
	}{run.ID, run.Request.Model, run.Usage.MaxRequests})
	return EventInput{Time: run.CreatedAt, Type: EventRunQueued, Data: data}
}

// CheckEvents returns invalid for an event a store must not keep: one
// without a type, or with data that is not JSON (every reader of the log
// decodes it).
func CheckEvents(events []EventInput) error {
	for i, e := range events {
		field := fmt.Sprintf("events[%d]", i)
		if e.Type == "" {
			return FieldErrorf(CodeInvalid, field+".type", "is empty")
		}
		if len(e.Data) > 0 && !json.Valid(e.Data) {
			return FieldErrorf(CodeInvalid, field+".data", "is not valid JSON")
		}
	}
	return nil
}

// TimedEvents returns t.Events with each unset Time set to t.At: an event
// a transition causes happens when the transition does, unless its writer
// says otherwise.
func (t Transition) TimedEvents() []EventInput {
	events := make([]EventInput, len(t.Events))
	for i, e := range t.Events {
		if e.Time.IsZero() {
			e.Time = t.At
		}
		events[i] = e
	}
	return events
}

// CheckCapability returns invalid for a capability that could never be
// spent: without a run id, model or expiry, or with a budget below one
// request.
func CheckCapability(c Capability) error {
	switch {
	case c.RunID == "":
		return FieldErrorf(CodeInvalid, "runId", "is empty")
	case c.Model == "":
		return FieldErrorf(CodeInvalid, "model", "is empty")
	case c.ExpiresAt.IsZero():
		return FieldErrorf(CodeInvalid, "expiresAt", "is unset")
	case c.MaxRequests < 1:
		return FieldErrorf(CodeInvalid, "maxRequests", "must be at least 1, not %d", c.MaxRequests)
	}
	return nil
}

// CheckApproval returns invalid for an approval a store cannot keep
// consistently: without an id, run id or tool, with arguments that are not
// JSON, neither pending nor decided, pending with a decision, or decided
// without a known one.
func CheckApproval(a Approval) error {
	switch {
	case a.ID == "":
		return FieldErrorf(CodeInvalid, "approvalId", "is empty")
	case a.RunID == "":
		return FieldErrorf(CodeInvalid, "runId", "is empty")
	case a.Tool == "":
		return FieldErrorf(CodeInvalid, "tool", "is empty")
	case len(a.Arguments) > 0 && !json.Valid(a.Arguments):
		return FieldErrorf(CodeInvalid, "arguments", "is not valid JSON")
	case a.Status == ApprovalPending && a.Decision != "":
		return FieldErrorf(CodeInvalid, "decision", "is set on a pending approval")
	case a.Status == ApprovalDecided && !a.Decision.Valid():
		return FieldErrorf(CodeInvalid, "decision", "unknown decision %q", a.Decision)
	case a.Status != ApprovalPending && a.Status != ApprovalDecided:
		return FieldErrorf(CodeInvalid, "status", "unknown approval status %q", a.Status)
	}
	return nil
}

// ApprovalRequestedEvent is the approval.requested event of a: what a
// client following the log needs to show the question and answer it.
// It fails only for arguments that are not JSON (see CheckApproval).
func ApprovalRequestedEvent(a Approval) (EventInput, error) {
	data, err := json.Marshal(struct {
		ApprovalID string          `json:"approvalId"`
		Tool       string          `json:"tool"`
		Arguments  json.RawMessage `json:"arguments,omitempty"`
		ExpiresAt  time.Time       `json:"expiresAt,omitzero"`
	}{a.ID, a.Tool, a.Arguments, a.ExpiresAt.UTC()})
	if err != nil {
		return EventInput{}, fmt.Errorf("encode approval.requested of %s: %w", a.ID, err)
	}
	return EventInput{Time: a.RequestedAt, Type: EventApprovalRequested, Data: data}, nil
}

// ApprovalDecidedEvent is the approval.decided event of a decided a.
func ApprovalDecidedEvent(a Approval) EventInput {
	// Only strings: marshalling cannot fail.
	data, _ := json.Marshal(struct {
		ApprovalID string   `json:"approvalId"`
		Decision   Decision `json:"decision"`
		Reason     string   `json:"reason,omitempty"`
		DecidedBy  string   `json:"decidedBy,omitempty"`
	}{a.ID, a.Decision, a.Reason, a.DecidedBy})
	return EventInput{Time: a.DecidedAt, Type: EventApprovalDecided, Data: data}
}
