// Package scriptedmodel is a scripted, deterministic stand-in for a model
// provider. It is not a model: it answers each request with the next step
// of a script, so tests and the offline demo run the real agent loop, the
// real SDKs and the real model proxy over real HTTP without a provider, a
// key or a network.
//
// It speaks three wire formats, chosen by the request's path: OpenAI chat
// completions (…/chat/completions), Anthropic's Messages API (/v1/messages)
// and Bedrock's Converse API (/model/{modelId}/converse), so one script
// drives the proxy through each of its providers. For the last two it
// checks each request as the real API does (turn order, tool_use answered
// by tool_result, no blank text, and with WithSigV4 Bedrock's SigV4
// signature) and answers in the API's own shapes, errors included.
//
// # Script format
//
// A script is JSON:
//
//	{
//	  "name": "fix-calc",
//	  "steps": [
//	    {"toolCalls": [{"name": "read_file", "arguments": {"path": "calc.py"}}]},
//	    {"toolCalls": [{"name": "edit_file", "arguments": {"path": "calc.py", "old": "a - b", "new": "a + b"}}]},
//	    {"content": "The test passes now.", "toolCalls": [{"name": "finish", "arguments": {"summary": "Fixed add."}}]}
//	  ]
//	}
//
// A step is one assistant reply. Its fields:
//
//   - content: the assistant's text (sent as null when empty).
//   - toolCalls: function calls, each a tool name and a JSON object of
//     arguments; the reply carries them with ids "call_<step>_<i>", type
//     "function" and the arguments encoded as a JSON string, as OpenAI does
//     (Anthropic: tool_use blocks "toolu_scripted_<step>_<i>"; Bedrock:
//     toolUse blocks "tooluse_scripted_<step>_<i>").
//   - delayMs: wait this long before answering (the wait ends early when the
//     client goes away), to test timeouts and cancellation.
//   - status: answer this HTTP status (400–599) with an OpenAI-style error
//     body instead of a completion; errorCode sets the body's "code" (for
//     example "model_request_budget_exhausted"). Because such an answer adds
//     no assistant message, a client that asks again gets the same error.
//   - raw: answer this text verbatim as the response body (with status, or
//     200), to script a malformed upstream answer.
//
// # Statelessness
//
// The server keeps no conversation state: the step it answers is the number
// of assistant messages (turns) already in the request's messages. Runs therefore
// share one server safely, and a repeated request gets the same answer. Past
// the last step it answers a single "finish" call, so a loop always ends.
//
// Replies are valid "chat.completion" objects (id "chatcmpl-scripted-…",
// model = the requested model, finish_reason "tool_calls" or "stop") with a
// usage block computed from byte lengths (about four bytes a token), so the
// same request always reports the same usage. Every request is recorded
// (Requests, Calls, Authorization) so a test can assert what reached the
// "provider".
package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Script is a scripted model session: the assistant replies, in order.
type Script struct {
	Name  string `json:"name"`
	Steps []Step `json:"steps"`
}

// Step is one scripted assistant reply, or a scripted failure. See the
// package comment for what each field does.
type Step struct {
	Content   string     `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"toolCalls,omitempty"`
	DelayMs   int        `json:"delayMs,omitempty"`
	Status    int        `json:"status,omitempty"`
	ErrorCode string     `json:"errorCode,omitempty"`
	Raw       string     `json:"raw,omitempty"`
}

// ToolCall is one scripted function call. Arguments is a JSON object; empty
// means {}.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// LoadScript reads and validates a script file, so a typo in a demo script
// fails at start-up rather than as a puzzling run.
func LoadScript(path string) (Script, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Script{}, fmt.Errorf("load script: %w", err)
	}
	s, err := ParseScript(data)
	if err != nil {
		return Script{}, fmt.Errorf("load script %s: %w", path, err)
	}
	return s, nil
}

// ParseScript decodes and validates a script. Unknown keys are refused:
// "tool_calls" (the wire name) in place of "toolCalls" would otherwise
// silently script an empty reply.
func ParseScript(data []byte) (Script, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Script
	if err := dec.Decode(&s); err != nil {
		return Script{}, fmt.Errorf("decode script: %w", err)
	}
	if dec.More() {
		return Script{}, fmt.Errorf("decode script: trailing data after the script object")
	}
	if err := s.Validate(); err != nil {
		return Script{}, err
	}
	return s, nil
}

// Validate reports the first step a server could not answer as scripted.
func (s Script) Validate() error {
	for i, st := range s.Steps {
		if st.DelayMs < 0 {
			return fmt.Errorf("steps[%d].delayMs: must not be negative", i)
		}
		switch {
		case st.Raw == "" && st.Status != 0 && (st.Status < 400 || st.Status > 599):
			return fmt.Errorf("steps[%d].status: %d is not an error status (400–599)", i, st.Status)
		case st.Raw != "" && st.Status != 0 && (st.Status < 200 || st.Status > 599):
			return fmt.Errorf("steps[%d].status: %d is not an HTTP status (200–599)", i, st.Status)
		}
		if st.ErrorCode != "" && st.Status == 0 {
			return fmt.Errorf("steps[%d].errorCode: needs a status", i)
		}
		if (st.Status != 0 || st.Raw != "") && (st.Content != "" || len(st.ToolCalls) > 0) {
			return fmt.Errorf("steps[%d]: a status or raw step has no content or toolCalls", i)
		}
		for j, tc := range st.ToolCalls {
			if tc.Name == "" {
				return fmt.Errorf("steps[%d].toolCalls[%d].name: required", i, j)
			}
			if len(tc.Arguments) == 0 {
				continue
			}
			var obj map[string]any
			if err := json.Unmarshal(tc.Arguments, &obj); err != nil || obj == nil {
				return fmt.Errorf("steps[%d].toolCalls[%d].arguments: must be a JSON object", i, j)
			}
		}
	}
	return nil
}
