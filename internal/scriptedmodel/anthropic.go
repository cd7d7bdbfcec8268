package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// anthropicFormat is Anthropic's Messages API (POST /v1/messages). The
// server checks a request as the API does, so a translation that the API
// would refuse fails here too: the anthropic-version header and a
// credential (X-Api-Key or Authorization) are required; model, max_tokens
// and non-empty messages too; the first message is the user's; text blocks
// are not empty; every tool_use of an assistant turn is answered by a
// tool_result in the next user turn, results first, and every tool_result
// answers a tool_use of the turn before; ids are unique. Replies carry
// tool_use ids "toolu_scripted_<step>_<i>".
var anthropicFormat = format{name: FormatAnthropic, parse: parseAnthropic, render: renderAnthropic, writeError: writeAnthropicError}

// anthropicIDPattern is what the API accepts as a tool_use id and a tool
// name.
var (
	anthropicIDPattern   = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	anthropicNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)
)

// httpError is a refusal with a status other than 400.
type httpError struct {
	status int
	code   string
	msg    string
}

func (e *httpError) Error() string { return e.msg }

type anthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens *int64             `json:"max_tokens"`
	Messages  []anthropicMessage `json:"messages"`
	System    json.RawMessage    `json:"system"`
	Tools     []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

func parseAnthropic(r *http.Request, body []byte) (parsed, error) {
	if r.Header.Get("Anthropic-Version") == "" {
		return parsed{}, errors.New("anthropic-version: header is required")
	}
	if r.Header.Get("X-Api-Key") == "" && r.Header.Get("Authorization") == "" {
		return parsed{}, &httpError{status: http.StatusUnauthorized, code: "authentication_error", msg: "x-api-key header is required"}
	}
	var req anthropicRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return parsed{}, errors.New("the body is not a Messages request")
	}
	p := parsed{model: req.Model}
	if req.MaxTokens != nil {
		p.maxTokens = *req.MaxTokens
	}
	for _, t := range req.Tools {
		p.tools = append(p.tools, t.Name)
	}
	switch {
	case req.Model == "":
		return p, errors.New("model: field required")
	case req.MaxTokens == nil || *req.MaxTokens < 1:
		return p, errors.New("max_tokens: field required, at least 1")
	case len(req.Messages) == 0:
		return p, errors.New("messages: at least one message is required")
	case req.Stream:
		return p, errors.New("the scripted model does not stream")
	}
	for i, t := range req.Tools {
		if t.Type != "" && t.Type != "custom" {
			return p, fmt.Errorf("tools.%d.type: only client tools are scripted", i)
		}
		if !anthropicNamePattern.MatchString(t.Name) {
			return p, fmt.Errorf("tools.%d.name: must match %s", i, anthropicNamePattern)
		}
		var schema struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(t.InputSchema, &schema) != nil || schema.Type != "object" {
			return p, fmt.Errorf("tools.%d.input_schema.type: must be \"object\"", i)
		}
	}
	system, err := anthropicSystem(req.System)
	if err != nil {
		return p, err
	}
	var msgs []Message
	if system != "" {
		msgs = append(msgs, Message{Role: "system", Content: system})
	}
	seen := map[string]bool{}
	var prevToolUses []string
	for i, m := range req.Messages {
		blocks, err := anthropicBlocks(m.Content, i)
		if err != nil {
			return p, err
		}
		if i == 0 && m.Role != "user" {
			return p, errors.New("messages.0.role: the first message must use the \"user\" role")
		}
		var toolUses []string
		switch m.Role {
		case "user":
			out, answered, err := anthropicUserTurn(blocks, i, prevToolUses)
			if err != nil {
				return p, err
			}
			if missing := without(prevToolUses, answered); len(missing) > 0 {
				return p, fmt.Errorf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s", i-1, strings.Join(missing, ", "))
			}
			msgs = append(msgs, out...)
		case "assistant":
			if len(prevToolUses) > 0 {
				return p, fmt.Errorf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s", i-1, strings.Join(prevToolUses, ", "))
			}
			msg := Message{Role: "assistant"}
			for j, b := range blocks {
				switch b.Type {
				case "text":
					msg.Content += *b.Text
				case "tool_use":
					if !anthropicIDPattern.MatchString(b.ID) || b.Name == "" || !isObjectJSON(b.Input) {
						return p, fmt.Errorf("messages.%d.content.%d: a tool_use needs an id, a name and an input object", i, j)
					}
					if seen[b.ID] {
						return p, fmt.Errorf("messages.%d.content.%d: `tool_use` ids must be unique", i, j)
					}
					seen[b.ID] = true
					toolUses = append(toolUses, b.ID)
					msg.ToolCalls = append(msg.ToolCalls, MessageToolCall{ID: b.ID, Name: b.Name, Arguments: compactJSON(b.Input)})
				default:
					return p, fmt.Errorf("messages.%d.content.%d.type: %q is not scripted in an assistant turn", i, j, b.Type)
				}
			}
			msgs = append(msgs, msg)
		default:
			return p, fmt.Errorf("messages.%d.role: must be \"user\" or \"assistant\"", i)
		}
		prevToolUses = toolUses
	}
	p.messages = msgs
	return p, nil
}

// anthropicUserTurn reads a user turn: its tool results (first, each
// answering a tool_use of the turn before) and its text.
func anthropicUserTurn(blocks []anthropicBlock, i int, prevToolUses []string) (out []Message, answered []string, err error) {
	var text strings.Builder
	sawText := false
	for j, b := range blocks {
		switch b.Type {
		case "tool_result":
			if sawText {
				return nil, nil, fmt.Errorf("messages.%d.content.%d: tool_result blocks must come first in the user turn", i, j)
			}
			if !slices.Contains(prevToolUses, b.ToolUseID) {
				return nil, nil, fmt.Errorf("messages.%d.content.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. "+
					"Each `tool_result` block must have a corresponding `tool_use` block in the previous message", i, j, b.ToolUseID)
			}
			content, err := anthropicResultText(b.Content, i, j)
			if err != nil {
				return nil, nil, err
			}
			answered = append(answered, b.ToolUseID)
			out = append(out, Message{Role: "tool", ToolCallID: b.ToolUseID, Content: content})
		case "text":
			sawText = true
			text.WriteString(*b.Text)
		default:
			return nil, nil, fmt.Errorf("messages.%d.content.%d.type: %q is not scripted in a user turn", i, j, b.Type)
		}
	}
	if sawText {
		out = append(out, Message{Role: "user", Content: text.String()})
	}
	return out, answered, nil
}

// anthropicBlocks reads a message's content: a non-empty string or a
// non-empty array of blocks, whose text blocks are not empty.
func anthropicBlocks(raw json.RawMessage, i int) ([]anthropicBlock, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, fmt.Errorf("messages.%d: content must not be empty", i)
		}
		return []anthropicBlock{{Type: "text", Text: &s}}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil || len(blocks) == 0 {
		return nil, fmt.Errorf("messages.%d: content must be a string or a non-empty array of blocks", i)
	}
	for j, b := range blocks {
		if b.Type == "text" && (b.Text == nil || *b.Text == "") {
			return nil, fmt.Errorf("messages.%d.content.%d: text content blocks must be non-empty", i, j)
		}
	}
	return blocks, nil
}

// anthropicResultText flattens a tool_result's content: absent, a string,
// or text blocks.
func anthropicResultText(raw json.RawMessage, i, j int) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fmt.Errorf("messages.%d.content.%d.content: must be a string or text blocks", i, j)
	}
	var b strings.Builder
	for k, tb := range blocks {
		if tb.Type != "text" || tb.Text == nil || *tb.Text == "" {
			return "", fmt.Errorf("messages.%d.content.%d.content.%d: must be a non-empty text block", i, j, k)
		}
		b.WriteString(*tb.Text)
	}
	return b.String(), nil
}

// anthropicSystem flattens the system prompt: a string or text blocks.
func anthropicSystem(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("system: must be a string or an array of text blocks")
	}
	var parts []string
	for k, b := range blocks {
		if b.Type != "text" || b.Text == nil || *b.Text == "" {
			return "", fmt.Errorf("system.%d: must be a non-empty text block", k)
		}
		parts = append(parts, *b.Text)
	}
	return strings.Join(parts, "\n"), nil
}

// renderAnthropic renders step as a Messages API answer.
func renderAnthropic(_ *Server, rec *Request, body []byte, step Step) ([]byte, error) {
	args, err := stepArgs(step, rec.Step)
	if err != nil {
		return nil, err
	}
	content := []map[string]any{}
	if step.Content != "" {
		content = append(content, map[string]any{"type": "text", "text": step.Content})
	}
	for i, tc := range step.ToolCalls {
		content = append(content, map[string]any{
			"type": "tool_use", "id": fmt.Sprintf("toolu_scripted_%d_%d", rec.Step, i),
			"name": tc.Name, "input": json.RawMessage(args[i]),
		})
	}
	stop := "end_turn"
	if len(step.ToolCalls) > 0 {
		stop = "tool_use"
	}
	return json.Marshal(map[string]any{
		"id": "msg_scripted_" + shortHash(body), "type": "message", "role": "assistant", "model": rec.Model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": rec.PromptTokens, "output_tokens": rec.CompletionTokens,
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
	})
}

// writeAnthropicError answers the Messages API's error shape; code is the
// error type, by status when empty.
func writeAnthropicError(w http.ResponseWriter, status int, code, message string) {
	if code == "" {
		code = anthropicErrorType(status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_scripted")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type":       "error",
		"error":      map[string]any{"type": code, "message": message},
		"request_id": "req_scripted",
	})
}

func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

func isObjectJSON(raw json.RawMessage) bool {
	var m map[string]any
	return json.Unmarshal(raw, &m) == nil && m != nil
}

func compactJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw)
	}
	return buf.String()
}

// without returns the entries of want that are not in got.
func without(want, got []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			out = append(out, w)
		}
	}
	return out
}
