package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/belay-dev/belay/internal/belay"
)

// State is the loop's state as a checkpoint keeps it (DESIGN.md
// "Checkpoints and resume"): the conversation so far, exactly as the model
// gets it, the steps taken, the nudge, the usage, the tool call running
// when it was taken, and, once the loop has ended for a reason of its own,
// its outcome. A loop started with a State (Config.Resume) continues from
// it.
type State struct {
	Messages []Message         `json:"messages"`
	Steps    int               `json:"steps"`
	Nudged   bool              `json:"nudged,omitempty"`
	Usage    belay.BundleUsage `json:"usage"`
	// Pending is the tool call that had started and not yet answered.
	Pending *PendingCall `json:"pending,omitempty"`
	// Outcome is how the loop ended; a resumed loop ends at once with it.
	Outcome *Outcome `json:"outcome,omitempty"`
}

// Message is one message of the conversation.
type Message struct {
	Role       string     `json:"role"` // system, user, assistant or tool
	Content    string     `json:"content,omitempty"`
	Refusal    string     `json:"refusal,omitempty"`
	ToolCalls  []ToolCall `json:"toolCalls,omitempty"`
	ToolCallID string     `json:"toolCallId,omitempty"`
}

// ToolCall is one call of an assistant message. Type is "function" or
// "custom" (whose input is Arguments).
type ToolCall struct {
	ID        string `json:"id"`
	Type      string `json:"type,omitempty"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// PendingCall is the tool call a state was taken during.
type PendingCall struct {
	ID    string    `json:"id"`
	Name  string    `json:"name"`
	Step  int       `json:"step"`
	Since time.Time `json:"since"`
}

// Interrupted is the result a tool call that was running when its sandbox
// was lost comes back to the model as, on the new sandbox: it is never run
// again.
type Interrupted struct {
	Interrupted bool   `json:"interrupted"`
	Reason      string `json:"reason"`
}

// notRunResult is the result of a call of the same answer that had not
// started when the sandbox was lost.
const notRunResult = "not run: the sandbox was lost before this call started (an earlier call of the same answer was interrupted); call it again if it is still needed"

// CheckpointFunc receives the loop's state at each checkpoint: before a
// tool call runs (Pending set), after its result (Pending nil) and when the
// loop ends for a reason of its own (Outcome set). It is called on the
// loop's goroutine, which waits for it: a call must not run before the
// state that marks it pending is saved. It must not keep s.Messages.
type CheckpointFunc func(ctx context.Context, s State)

// CheckResume returns invalid for a state the loop cannot continue from:
// no conversation, a first message that is not the system prompt, an
// unknown role, a tool message that answers no call of the assistant
// message before it, or negative counts.
func CheckResume(s State) error {
	if len(s.Messages) < 2 || s.Messages[0].Role != "system" {
		return belay.FieldErrorf(belay.CodeInvalid, "messages", "must start with the system prompt and the instruction")
	}
	if s.Steps < 0 || s.Usage.ModelRequests < 0 {
		return belay.FieldErrorf(belay.CodeInvalid, "steps", "must not be negative")
	}
	var open map[string]bool
	for i, m := range s.Messages {
		switch m.Role {
		case "system", "user":
			open = nil
		case "assistant":
			open = map[string]bool{}
			for _, tc := range m.ToolCalls {
				if tc.ID == "" {
					return belay.FieldErrorf(belay.CodeInvalid, fmt.Sprintf("messages[%d].toolCalls", i), "a call has no id")
				}
				open[tc.ID] = true
			}
		case "tool":
			if !open[m.ToolCallID] {
				return belay.FieldErrorf(belay.CodeInvalid, fmt.Sprintf("messages[%d].toolCallId", i), "answers no open call of the assistant message before it")
			}
			delete(open, m.ToolCallID)
		default:
			return belay.FieldErrorf(belay.CodeInvalid, fmt.Sprintf("messages[%d].role", i), "unknown role %q", m.Role)
		}
	}
	return nil
}

// DecodeState decodes and checks a checkpoint's agent state.
func DecodeState(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("decode agent state: %w", err)
	}
	if err := CheckResume(s); err != nil {
		return State{}, fmt.Errorf("agent state: %w", err)
	}
	return s, nil
}

// param is m as the chat-completions API takes it. An assistant message is
// built as the SDK's ToParam builds one from an answer, so a resumed
// conversation is sent exactly as the original was.
func (m Message) param() openai.ChatCompletionMessageParamUnion {
	switch m.Role {
	case "system":
		return openai.SystemMessage(m.Content)
	case "user":
		return openai.UserMessage(m.Content)
	case "tool":
		return openai.ToolMessage(m.Content, m.ToolCallID)
	}
	var p openai.ChatCompletionAssistantMessageParam
	if m.Content != "" {
		p.Content.OfString = openai.String(m.Content)
	}
	if m.Refusal != "" {
		p.Refusal = openai.String(m.Refusal)
	}
	for _, tc := range m.ToolCalls {
		var u openai.ChatCompletionMessageToolCallUnionParam
		if tc.Type == "custom" {
			u.OfCustom = &openai.ChatCompletionMessageCustomToolCallParam{ID: tc.ID,
				Custom: openai.ChatCompletionMessageCustomToolCallCustomParam{Input: tc.Arguments, Name: tc.Name}}
		} else {
			u.OfFunction = &openai.ChatCompletionMessageFunctionToolCallParam{ID: tc.ID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Arguments: tc.Arguments, Name: tc.Name}}
		}
		p.ToolCalls = append(p.ToolCalls, u)
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: &p}
}

// assistantMessage keeps what the conversation needs of an answer.
func assistantMessage(msg openai.ChatCompletionMessage) Message {
	m := Message{Role: "assistant", Content: msg.Content, Refusal: msg.Refusal}
	for _, tc := range msg.ToolCalls {
		switch v := tc.AsAny().(type) {
		case openai.ChatCompletionMessageFunctionToolCall:
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: v.ID, Type: "function", Name: v.Function.Name, Arguments: v.Function.Arguments})
		case openai.ChatCompletionMessageCustomToolCall:
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: v.ID, Type: "custom", Name: v.Custom.Name, Arguments: v.Custom.Input})
		}
	}
	return m
}

// params is the conversation as the chat-completions API takes it.
func (l *loop) params() []openai.ChatCompletionMessageParamUnion {
	out := make([]openai.ChatCompletionMessageParamUnion, len(l.conv))
	for i, m := range l.conv {
		out[i] = m.param()
	}
	return out
}

// state is the loop's state now, the conversation copied.
func (l *loop) state(pending *PendingCall, outcome *Outcome) State {
	return State{
		Messages: append([]Message(nil), l.conv...),
		Steps:    l.out.Steps, Nudged: l.nudged, Usage: l.out.Usage,
		Pending: pending, Outcome: outcome,
	}
}

// checkpoint hands the state to Config.Checkpoint, if set.
func (l *loop) checkpoint(ctx context.Context, pending *PendingCall, outcome *Outcome) {
	if l.cfg.Checkpoint != nil {
		l.cfg.Checkpoint(ctx, l.state(pending, outcome))
	}
}

// resume restores the loop from s and answers the calls of its last
// answer that have no result: the one that was running with an
// Interrupted result (reason says why), the others as not run. It returns
// the outcome to end with at once, when s holds one.
func (l *loop) resume(s State, reason string) *Outcome {
	l.conv = append([]Message(nil), s.Messages...)
	l.out.Steps, l.out.Usage, l.nudged = s.Steps, s.Usage, s.Nudged
	l.tr.write(line{Role: "note", Content: fmt.Sprintf(
		"resumed on a new sandbox from a checkpoint at step %d; the %d messages below are the conversation it restored", s.Steps, len(s.Messages))})
	for _, m := range l.conv {
		ln := line{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			ln.ToolCalls = append(ln.ToolCalls, lineToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
		}
		l.tr.write(ln)
	}
	if s.Outcome != nil {
		out := *s.Outcome
		l.out = out
		return &out
	}
	last := -1
	for i := len(l.conv) - 1; i >= 0; i-- {
		if l.conv[i].Role == "assistant" {
			last = i
			break
		}
	}
	if last < 0 {
		return nil
	}
	answered := map[string]bool{}
	for _, m := range l.conv[last+1:] {
		if m.Role == "tool" {
			answered[m.ToolCallID] = true
		}
	}
	step := s.Steps
	for _, tc := range l.conv[last].ToolCalls {
		if answered[tc.ID] {
			continue
		}
		if s.Pending != nil && tc.ID == s.Pending.ID {
			b, _ := json.Marshal(Interrupted{Interrupted: true, Reason: reason})
			l.conv = append(l.conv, Message{Role: "tool", Content: string(b), ToolCallID: tc.ID})
			l.tr.write(line{Role: "tool", Step: s.Pending.Step, ToolCallID: tc.ID, Name: l.redact(tc.Name), IsError: true, Content: string(b)})
			short, cut := truncate(string(b), MaxEventTextBytes)
			l.events.Emit(belay.EventToolResult, resultEvent{Step: s.Pending.Step, CallID: shortID(tc.ID), Name: shortID(l.redact(tc.Name)),
				IsError: true, Interrupted: true, Result: short, ResultBytes: len(b), ResultTruncated: cut})
			l.log.Info("tool call interrupted by the loss of its sandbox", "step", s.Pending.Step, "tool", shortID(tc.Name))
			continue
		}
		content := "error: " + notRunResult
		l.conv = append(l.conv, Message{Role: "tool", Content: content, ToolCallID: tc.ID})
		l.tr.write(line{Role: "tool", Step: step, ToolCallID: tc.ID, Name: l.redact(tc.Name), IsError: true, Content: notRunResult})
	}
	return nil
}

// errNoResume is returned for a Config whose Resume state is unusable.
var errNoResume = errors.New("the checkpoint's agent state cannot be resumed from")
