package scriptedmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// openaiFormat is OpenAI's chat completions, what the agent speaks.
var openaiFormat = format{name: FormatOpenAI, parse: parseOpenAI, render: renderOpenAI, writeError: writeError}

// parseOpenAI reads a chat-completions request; it must name a model and
// carry messages, and must not ask to stream.
func parseOpenAI(_ *http.Request, body []byte) (parsed, error) {
	var req wireRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || req.Messages == nil {
		return parsed{}, fmt.Errorf("body must be a chat-completions request with model and messages")
	}
	p := parsed{model: req.Model, maxTokens: req.maxTokens(), tools: req.toolNames(), messages: req.messages()}
	if req.Stream {
		return p, fmt.Errorf("the scripted model does not stream")
	}
	return p, nil
}

// renderOpenAI renders step as an OpenAI chat.completion object with the
// usage noted in rec.
func renderOpenAI(s *Server, rec *Request, body []byte, step Step) ([]byte, error) {
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
		Index        int     `json:"index"`
		Message      message `json:"message"`
		Logprobs     *string `json:"logprobs"`
		FinishReason string  `json:"finish_reason"`
	}
	type usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	}
	type completion struct {
		ID                string   `json:"id"`
		Object            string   `json:"object"`
		Created           int64    `json:"created"`
		Model             string   `json:"model"`
		SystemFingerprint string   `json:"system_fingerprint"`
		Choices           []choice `json:"choices"`
		Usage             usage    `json:"usage"`
	}

	msg := message{Role: "assistant"}
	if step.Content != "" {
		msg.Content = &step.Content
	}
	args, err := stepArgs(step, rec.Step)
	if err != nil {
		return nil, err
	}
	for i, tc := range step.ToolCalls {
		msg.ToolCalls = append(msg.ToolCalls, toolCall{
			ID:       fmt.Sprintf("call_%d_%d", rec.Step, i),
			Type:     "function",
			Function: function{Name: tc.Name, Arguments: args[i]},
		})
	}
	finish := "stop"
	if len(msg.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	prompt, compl := rec.PromptTokens, rec.CompletionTokens
	return json.Marshal(completion{
		ID:                "chatcmpl-scripted-" + shortHash(body),
		Object:            "chat.completion",
		Created:           s.now().Unix(),
		Model:             rec.Model,
		SystemFingerprint: "belay-scripted-model",
		Choices:           []choice{{Index: 0, Message: msg, FinishReason: finish}},
		Usage:             usage{PromptTokens: prompt, CompletionTokens: compl, TotalTokens: prompt + compl},
	})
}

// writeError answers an OpenAI-style error body; code defaults by status.
func writeError(w http.ResponseWriter, status int, code, message string) {
	if code == "" {
		code = openaiErrorCode(status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": message,
		"type":    "scripted_model_error",
		"param":   nil,
		"code":    code,
	}})
}

// wireRequest is the part of a chat-completions request the server reads;
// other keys are ignored, as a permissive provider would.
type wireRequest struct {
	Model               string        `json:"model"`
	Messages            []wireMessage `json:"messages"`
	MaxTokens           int64         `json:"max_tokens"`
	MaxCompletionTokens int64         `json:"max_completion_tokens"`
	Stream              bool          `json:"stream"`
	Tools               []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

type wireMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

func (r wireRequest) maxTokens() int64 {
	if r.MaxTokens != 0 {
		return r.MaxTokens
	}
	return r.MaxCompletionTokens
}

func (r wireRequest) toolNames() []string {
	var names []string
	for _, t := range r.Tools {
		names = append(names, t.Function.Name)
	}
	return names
}

func (r wireRequest) messages() []Message {
	out := make([]Message, 0, len(r.Messages))
	for _, m := range r.Messages {
		msg := Message{Role: m.Role, Content: flattenContent(m.Content), ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, MessageToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		out = append(out, msg)
	}
	return out
}

// flattenContent turns a message's content (a string, an array of parts, or
// null) into its text.
func flattenContent(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func openaiErrorCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request"
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	}
	return "scripted_error"
}
