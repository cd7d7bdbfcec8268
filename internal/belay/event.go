package belay

import (
	"encoding/json"
	"time"
)

// The event types of a run's log.
const (
	EventRunQueued         = "run.queued"
	EventRunStarted        = "run.started"
	EventSandboxReady      = "sandbox.ready"
	EventModelRequest      = "model.request"
	EventModelResponse     = "model.response"
	EventToolCall          = "tool.call"
	EventToolResult        = "tool.result"
	EventApprovalRequested = "approval.requested"
	EventApprovalDecided   = "approval.decided"
	EventCheckFinished     = "check.finished"
	EventBudgetExhausted   = "budget.exhausted"
	EventCancelRequested   = "run.cancel_requested"
	EventRunCompleted      = "run.completed"
	EventRunFailed         = "run.failed"
	EventRunCancelled      = "run.cancelled"
	EventAgentMessage      = "agent.message"
)

// SandboxEventTypes are the types a sandbox may append through the internal
// events route. Everything else is written by the control plane itself, so a
// compromised sandbox cannot fake a terminal state or a decision.
var SandboxEventTypes = []string{
	EventSandboxReady, EventToolCall, EventToolResult, EventCheckFinished, EventAgentMessage,
}

// TerminalEventType returns the event type that records a run reaching s.
func TerminalEventType(s RunStatus) string {
	switch s {
	case StatusCompleted:
		return EventRunCompleted
	case StatusFailed:
		return EventRunFailed
	case StatusCancelled:
		return EventRunCancelled
	}
	return ""
}

// IsTerminalEvent reports whether an event type ends a run's log.
func IsTerminalEvent(typ string) bool {
	return typ == EventRunCompleted || typ == EventRunFailed || typ == EventRunCancelled
}

// Event is one entry of a run's log. Seq is gapless and starts at 1.
type Event struct {
	Seq  int64           `json:"seq"`
	Time time.Time       `json:"time"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// EventInput is an event to append; the store assigns Seq.
type EventInput struct {
	Time time.Time       `json:"time"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// EventPage answers a read of a run's log. Missed is true when the reader
// asked for events older than the bounded buffer keeps: events after
// `after` and before OldestSeq are gone. LastSeq is the newest sequence
// number written; Terminal says the log has ended.
type EventPage struct {
	Events    []Event
	Missed    bool
	OldestSeq int64
	LastSeq   int64
	Terminal  bool
}

// DefaultEventBufferSize is how many events a run keeps by default.
const DefaultEventBufferSize = 2000
