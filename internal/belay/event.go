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
// Source says who wrote it: the control plane (SourceControl) or the
// run's sandbox through the internal events route (SourceSandbox), whose
// word is only the sandbox's.
type Event struct {
	Seq    int64           `json:"seq"`
	Time   time.Time       `json:"time"`
	Type   string          `json:"type"`
	Source string          `json:"source"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// The sources of events.
const (
	// SourceControl marks what the control plane wrote itself: states,
	// model calls it proxied, approvals, the final checks it validated.
	SourceControl = "control"
	// SourceSandbox marks what a sandbox appended: its own account of its
	// steps, never trusted for the run's outcome.
	SourceSandbox = "sandbox"
)

// SandboxEventLimits caps what one run's sandbox may append to its log,
// over the whole run: MaxEvents events and MaxBytes bytes (EventBytes of
// each). The caps keep a sandbox from flooding the log, and with
// MaxEvents below the event buffer (DefaultEventBufferSize) from pushing
// the control plane's own events out of it.
type SandboxEventLimits struct {
	MaxEvents int
	MaxBytes  int64
}

// Defaults of SandboxEventLimits: far above what an honest run sends (a
// 20-step run appends about a hundred events), and half the default event
// buffer, so the control plane's events always stay in it.
const (
	DefaultMaxSandboxEvents     = 1000
	DefaultMaxSandboxEventBytes = 4 << 20
)

// DefaultSandboxEventLimits returns the default caps.
func DefaultSandboxEventLimits() SandboxEventLimits {
	return SandboxEventLimits{MaxEvents: DefaultMaxSandboxEvents, MaxBytes: DefaultMaxSandboxEventBytes}
}

// EventBytes is what one event counts against SandboxEventLimits.MaxBytes:
// its type and its data.
func EventBytes(e EventInput) int64 { return int64(len(e.Type) + len(e.Data)) }

// CheckSandboxEventLimits returns too_large, naming the cap, when a run
// that has appended usedEvents sandbox events of usedBytes bytes may not
// append events as well. Stores call it inside the write that appends.
func CheckSandboxEventLimits(l SandboxEventLimits, usedEvents int, usedBytes int64, events []EventInput) error {
	var size int64
	for _, e := range events {
		size += EventBytes(e)
	}
	switch {
	case usedEvents+len(events) > l.MaxEvents:
		return Errorf(CodeTooLarge, "the run's sandbox may append at most %d events (the sandbox-event cap); it has appended %d, and this batch holds %d", l.MaxEvents, usedEvents, len(events))
	case usedBytes+size > l.MaxBytes:
		return Errorf(CodeTooLarge, "the run's sandbox may append at most %d bytes of events (the sandbox-event byte cap); it has appended %d, and this batch holds %d", l.MaxBytes, usedBytes, size)
	}
	return nil
}

// Valid reports whether both caps are positive.
func (l SandboxEventLimits) Valid() bool { return l.MaxEvents > 0 && l.MaxBytes > 0 }

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
