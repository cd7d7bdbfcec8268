package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ChatRequest is a chat-completions request as the translating providers
// read it: what can be said to another provider, in a neutral shape.
// ParseChatRequest builds it from the proxy's canonical body.
//
// What it leaves out: seed, frequency_penalty and presence_penalty (no
// equivalent in the Messages or Converse APIs), stream and stream_options
// (the proxy never streams), n (the proxy allows only 1), a message's name.
type ChatRequest struct {
	Model    string
	Messages []ChatMessage
	Tools    []ChatTool
	// ToolChoice is "" (not set), "auto", "none", "required" or
	// "function" (then ToolChoiceName names it).
	ToolChoice     string
	ToolChoiceName string
	// ParallelToolCalls is parallel_tool_calls, nil when not set.
	ParallelToolCalls *bool
	// MaxTokens is the smaller of max_tokens and max_completion_tokens
	// that is set (the proxy always sets one).
	MaxTokens   int64
	Temperature *float64
	TopP        *float64
	Stop        []string
	User        string
}

// The roles of a ChatMessage.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// ChatMessage is one message: system (developer messages too), user,
// assistant (text and tool calls) or tool (one tool call's result).
type ChatMessage struct {
	Role string
	// Content is the message's text, its parts joined.
	Content    string
	ToolCalls  []ChatToolCall
	ToolCallID string
}

// ChatToolCall is one function call of an assistant message. Arguments is
// a JSON object.
type ChatToolCall struct {
	ID        string
	Name      string
	Arguments json.RawMessage
}

// ChatTool is one function the model may call; Parameters is its JSON
// Schema, an object schema.
type ChatTool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// wire shapes of the request, read loosely: the proxy already checked the
// top-level keys.
type wireRequest struct {
	Model               string            `json:"model"`
	Messages            []json.RawMessage `json:"messages"`
	Tools               []wireTool        `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls   *bool             `json:"parallel_tool_calls"`
	MaxTokens           *int64            `json:"max_tokens"`
	MaxCompletionTokens *int64            `json:"max_completion_tokens"`
	Temperature         *float64          `json:"temperature"`
	TopP                *float64          `json:"top_p"`
	Stop                json.RawMessage   `json:"stop"`
	User                *string           `json:"user"`
	ResponseFormat      json.RawMessage   `json:"response_format"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type wireMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	ToolCallID   *string         `json:"tool_call_id"`
	ToolCalls    []wireToolCall  `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// ParseChatRequest reads the proxy's canonical chat-completions body. A
// request another provider cannot be told (an image part, a custom tool, a
// JSON response format, tool arguments that are not a JSON object) is an
// ErrInvalid naming the field.
func ParseChatRequest(body []byte) (ChatRequest, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return ChatRequest{}, Invalid("", "the request is not a chat-completions object: %s", typeProblem(err))
	}
	req := ChatRequest{Model: w.Model, ParallelToolCalls: w.ParallelToolCalls, Temperature: w.Temperature, TopP: w.TopP}
	for _, n := range []*int64{w.MaxTokens, w.MaxCompletionTokens} {
		if n != nil && (req.MaxTokens == 0 || *n < req.MaxTokens) {
			req.MaxTokens = *n
		}
	}
	if w.User != nil {
		req.User = *w.User
	}
	if len(w.Messages) == 0 {
		return ChatRequest{}, Invalid("messages", "must be a non-empty array")
	}
	for i, raw := range w.Messages {
		m, err := parseMessage(raw, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return ChatRequest{}, err
		}
		req.Messages = append(req.Messages, m)
	}
	for i, t := range w.Tools {
		field := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return ChatRequest{}, Invalid(field+".type", "only function tools can be sent to this provider")
		}
		if t.Function.Name == "" {
			return ChatRequest{}, Invalid(field+".function.name", "is required")
		}
		params := t.Function.Parameters
		if len(params) == 0 || isNullJSON(params) {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		} else if !IsJSONObject(params) {
			return ChatRequest{}, Invalid(field+".function.parameters", "must be a JSON Schema object")
		}
		req.Tools = append(req.Tools, ChatTool{Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
	}
	if err := req.parseToolChoice(w.ToolChoice); err != nil {
		return ChatRequest{}, err
	}
	if len(req.Tools) == 0 && (req.ToolChoice == "required" || req.ToolChoice == "function") {
		return ChatRequest{}, Invalid("tool_choice", "asks for a tool call but the request offers no tools")
	}
	stop, err := parseStop(w.Stop)
	if err != nil {
		return ChatRequest{}, err
	}
	req.Stop = stop
	if len(w.ResponseFormat) > 0 && !isNullJSON(w.ResponseFormat) {
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(w.ResponseFormat, &rf) != nil || rf.Type != "text" {
			return ChatRequest{}, Invalid("response_format", "only the text response format can be sent to this provider")
		}
	}
	return req, nil
}

func parseMessage(raw json.RawMessage, field string) (ChatMessage, error) {
	var w wireMessage
	if err := json.Unmarshal(raw, &w); err != nil {
		return ChatMessage{}, Invalid(field, "is not a message object: %s", typeProblem(err))
	}
	m := ChatMessage{}
	switch w.Role {
	case "system", "developer":
		m.Role = RoleSystem
	case RoleUser, RoleAssistant, RoleTool:
		m.Role = w.Role
	default:
		return ChatMessage{}, Invalid(field+".role", "must be system, developer, user, assistant or tool")
	}
	text, err := contentText(w.Content, field+".content")
	if err != nil {
		return ChatMessage{}, err
	}
	m.Content = text
	if len(w.FunctionCall) > 0 && !isNullJSON(w.FunctionCall) {
		return ChatMessage{}, Invalid(field+".function_call", "is the legacy form; send tool_calls")
	}
	if len(w.ToolCalls) > 0 && m.Role != RoleAssistant {
		return ChatMessage{}, Invalid(field+".tool_calls", "only an assistant message has tool calls")
	}
	for j, tc := range w.ToolCalls {
		f := fmt.Sprintf("%s.tool_calls[%d]", field, j)
		if tc.Type != "" && tc.Type != "function" {
			return ChatMessage{}, Invalid(f+".type", "only function tool calls can be sent to this provider")
		}
		if tc.ID == "" || tc.Function.Name == "" {
			return ChatMessage{}, Invalid(f, "needs an id and a function name")
		}
		args := json.RawMessage(strings.TrimSpace(tc.Function.Arguments))
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		if !IsJSONObject(args) {
			return ChatMessage{}, Invalid(f+".function.arguments", "must be a JSON object to be sent to this provider")
		}
		var compact bytes.Buffer
		_ = json.Compact(&compact, args)
		m.ToolCalls = append(m.ToolCalls, ChatToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: compact.Bytes()})
	}
	if m.Role == RoleTool {
		if w.ToolCallID == nil || *w.ToolCallID == "" {
			return ChatMessage{}, Invalid(field+".tool_call_id", "is required on a tool message")
		}
		m.ToolCallID = *w.ToolCallID
	}
	return m, nil
}

// contentText flattens a message's content: a string, null, or an array
// of text (or, from an assistant, refusal) parts.
func contentText(raw json.RawMessage, field string) (string, error) {
	if len(raw) == 0 || isNullJSON(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", Invalid(field, "must be a string or an array of text parts")
	}
	var b strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "text":
			b.WriteString(p.Text)
		case "refusal":
			b.WriteString(p.Refusal)
		default:
			return "", Invalid(fmt.Sprintf("%s[%d].type", field, i), "only text parts can be sent to this provider")
		}
	}
	return b.String(), nil
}

func (req *ChatRequest) parseToolChoice(raw json.RawMessage) error {
	if len(raw) == 0 || isNullJSON(raw) {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			req.ToolChoice = s
			return nil
		}
		return Invalid("tool_choice", "must be auto, none, required or a function")
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Type != "function" || obj.Function.Name == "" {
		return Invalid("tool_choice", "must be auto, none, required or a function")
	}
	req.ToolChoice, req.ToolChoiceName = "function", obj.Function.Name
	return nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || isNullJSON(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, Invalid("stop", "must be a string or an array of strings")
	}
	return list, nil
}

func isNullJSON(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// typeProblem names a decode error without quoting the input.
func typeProblem(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return fmt.Sprintf("field %q has the wrong type", te.Field)
	}
	return "wrong JSON shape"
}

// The finish reasons of a chat.completion choice.
const (
	FinishStop          = "stop"
	FinishLength        = "length"
	FinishToolCalls     = "tool_calls"
	FinishContentFilter = "content_filter"
)

// ChatCompletion is a provider's answer in the neutral shape, written to
// the sandbox as an OpenAI chat.completion object by JSON.
type ChatCompletion struct {
	ID      string
	Model   string
	Created int64
	// Content is the assistant's text, "" for none (sent as null).
	Content      string
	ToolCalls    []ChatToolCall
	FinishReason string
	// PromptTokens counts every input token the provider billed (cached
	// reads and writes included); CompletionTokens the output tokens.
	PromptTokens     int64
	CompletionTokens int64
}

// JSON renders c as a chat.completion object, as the OpenAI SDK reads it.
func (c ChatCompletion) JSON() ([]byte, error) {
	type function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type toolCall struct {
		ID       string   `json:"id"`
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	type message struct {
		Role      string     `json:"role"`
		Content   *string    `json:"content"`
		Refusal   *string    `json:"refusal"`
		ToolCalls []toolCall `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int             `json:"index"`
		Message      message         `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	}
	type usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	}
	type completion struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		Usage   usage    `json:"usage"`
	}
	msg := message{Role: "assistant"}
	if c.Content != "" {
		msg.Content = &c.Content
	}
	for _, tc := range c.ToolCalls {
		args := string(tc.Arguments)
		if args == "" {
			args = "{}"
		}
		msg.ToolCalls = append(msg.ToolCalls, toolCall{ID: tc.ID, Type: "function", Function: function{Name: tc.Name, Arguments: args}})
	}
	return json.Marshal(completion{
		ID:      c.ID,
		Object:  "chat.completion",
		Created: c.Created,
		Model:   c.Model,
		Choices: []choice{{Index: 0, Message: msg, Logprobs: json.RawMessage("null"), FinishReason: c.FinishReason}},
		Usage: usage{PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens,
			TotalTokens: c.PromptTokens + c.CompletionTokens},
	})
}

// Answer renders c and checks it against the call's limit.
func (c ChatCompletion) Answer(status int, limit int64) ([]byte, error) {
	out, err := c.JSON()
	if err != nil {
		return nil, Malformed(status, fmt.Errorf("encode the chat completion: %w", err))
	}
	if int64(len(out)) > limit {
		return nil, TooLarge(status, limit)
	}
	return out, nil
}

// Turn is a run of consecutive messages that a provider with strictly
// alternating user and assistant turns sends as one message: the
// assistant's text and tool calls, or the user's text and tool results.
type Turn struct {
	// Role is RoleUser or RoleAssistant.
	Role  string
	Parts []Part
}

// Part is one piece of a Turn: text, a tool call (assistant) or a tool
// result (user).
type Part struct {
	Text       string
	ToolCall   *ChatToolCall
	ToolResult *ToolResult
}

// ToolResult is the result of one tool call, answered in a user turn.
type ToolResult struct {
	ToolCallID string
	Content    string
}

// Conversation splits the messages into the system text (every system
// and developer message, in order) and alternating turns: tool messages
// become tool results of the user's turn, consecutive messages of one
// role are merged (tool results first in a user turn, as both translating
// providers require), and empty text is left out. A turn with nothing in it
// is dropped.
func Conversation(msgs []ChatMessage) (system []string, turns []Turn) {
	for _, m := range msgs {
		role := RoleUser
		var parts []Part
		switch m.Role {
		case RoleSystem:
			if m.Content != "" {
				system = append(system, m.Content)
			}
			continue
		case RoleAssistant:
			role = RoleAssistant
			if m.Content != "" {
				parts = append(parts, Part{Text: m.Content})
			}
			for i := range m.ToolCalls {
				parts = append(parts, Part{ToolCall: &m.ToolCalls[i]})
			}
		case RoleTool:
			parts = append(parts, Part{ToolResult: &ToolResult{ToolCallID: m.ToolCallID, Content: m.Content}})
		default:
			if m.Content != "" {
				parts = append(parts, Part{Text: m.Content})
			}
		}
		if len(parts) == 0 {
			continue
		}
		if n := len(turns); n > 0 && turns[n-1].Role == role {
			turns[n-1].Parts = mergeParts(turns[n-1].Parts, parts)
			continue
		}
		turns = append(turns, Turn{Role: role, Parts: parts})
	}
	return system, turns
}

// mergeParts appends more to parts, keeping tool results ahead of text.
func mergeParts(parts, more []Part) []Part {
	out := make([]Part, 0, len(parts)+len(more))
	all := slices.Concat(parts, more)
	for _, p := range all {
		if p.ToolResult != nil {
			out = append(out, p)
		}
	}
	for _, p := range all {
		if p.ToolResult == nil {
			out = append(out, p)
		}
	}
	return out
}
