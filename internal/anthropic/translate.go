package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/belay-dev/belay/internal/upstream"
)

// Request translates a chat-completions request into a Messages API
// request. The rules:
//
//   - system and developer messages become the top-level system blocks, in
//     order (their place among the turns is not kept: the Messages API has
//     none);
//   - user and assistant messages become turns; consecutive messages of one
//     role are merged, as the API requires alternating turns;
//   - an assistant's tool calls become tool_use blocks with the same ids and
//     the arguments as the input object; each tool message becomes a
//     tool_result block of the next user turn (several tool messages, one
//     turn: parallel tool calls answered together, results first);
//   - functions become tools (parameters → input_schema, which must be an
//     object schema); tool_choice auto, none, required (→ any) and a named
//     function (→ tool) map one to one; parallel_tool_calls false sets
//     disable_parallel_tool_use;
//   - max tokens and stop (→ stop_sequences) map as they are; user becomes
//     metadata.user_id; temperature and top_p are not sent: the Messages
//     API (SDK v2) has no sampling parameters any more.
//
// Empty text is left out (the API refuses empty text blocks), and so is a
// message left with nothing.
func Request(req upstream.ChatRequest) (sdk.MessageNewParams, error) {
	p := sdk.MessageNewParams{Model: sdk.Model(req.Model), MaxTokens: req.MaxTokens}
	system, turns := upstream.Conversation(req.Messages)
	for _, s := range system {
		p.System = append(p.System, sdk.TextBlockParam{Text: s})
	}
	for _, t := range turns {
		blocks := make([]sdk.ContentBlockParamUnion, 0, len(t.Parts))
		for _, part := range t.Parts {
			switch {
			case part.ToolResult != nil:
				b := sdk.ToolResultBlockParam{ToolUseID: part.ToolResult.ToolCallID}
				if part.ToolResult.Content != "" {
					b.Content = []sdk.ToolResultBlockParamContentUnion{{OfText: &sdk.TextBlockParam{Text: part.ToolResult.Content}}}
				}
				blocks = append(blocks, sdk.ContentBlockParamUnion{OfToolResult: &b})
			case part.ToolCall != nil:
				blocks = append(blocks, sdk.ContentBlockParamUnion{OfToolUse: &sdk.ToolUseBlockParam{
					ID: part.ToolCall.ID, Name: part.ToolCall.Name, Input: part.ToolCall.Arguments,
				}})
			default:
				blocks = append(blocks, sdk.NewTextBlock(part.Text))
			}
		}
		if t.Role == upstream.RoleAssistant {
			p.Messages = append(p.Messages, sdk.NewAssistantMessage(blocks...))
		} else {
			p.Messages = append(p.Messages, sdk.NewUserMessage(blocks...))
		}
	}
	for i, tool := range req.Tools {
		schema, err := inputSchema(tool.Parameters, fmt.Sprintf("tools[%d].function.parameters", i))
		if err != nil {
			return sdk.MessageNewParams{}, err
		}
		tp := sdk.ToolParam{Name: tool.Name, InputSchema: schema}
		if tool.Description != "" {
			tp.Description = sdk.String(tool.Description)
		}
		p.Tools = append(p.Tools, sdk.ToolUnionParam{OfTool: &tp})
	}
	if len(req.Tools) > 0 {
		p.ToolChoice = toolChoice(req)
	}
	p.StopSequences = req.Stop
	if req.User != "" {
		p.Metadata = sdk.MetadataParam{UserID: sdk.String(req.User)}
	}
	return p, nil
}

// inputSchema turns a function's JSON Schema into an input_schema: its
// properties and required list, every other keyword kept as it is.
func inputSchema(raw json.RawMessage, field string) (sdk.ToolInputSchemaParam, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return sdk.ToolInputSchemaParam{}, upstream.Invalid(field, "must be a JSON Schema object")
	}
	if t, ok := m["type"]; ok && t != "object" {
		return sdk.ToolInputSchemaParam{}, upstream.Invalid(field+".type", "must be \"object\": Anthropic takes an object as a tool's input")
	}
	// A schema without properties still needs its object: the SDK leaves
	// out an input_schema that is all zero, and the API requires one.
	props := m["properties"]
	if props == nil {
		props = map[string]any{}
	}
	s := sdk.ToolInputSchemaParam{Properties: props}
	if req, ok := m["required"].([]any); ok {
		for _, r := range req {
			name, ok := r.(string)
			if !ok {
				return sdk.ToolInputSchemaParam{}, upstream.Invalid(field+".required", "must be an array of property names")
			}
			s.Required = append(s.Required, name)
		}
	}
	for k, v := range m {
		switch k {
		case "type", "properties", "required":
			continue
		}
		if s.ExtraFields == nil {
			s.ExtraFields = map[string]any{}
		}
		s.ExtraFields[k] = v
	}
	return s, nil
}

// toolChoice maps tool_choice and parallel_tool_calls; with neither set it
// leaves the API's default (auto, parallel allowed).
func toolChoice(req upstream.ChatRequest) sdk.ToolChoiceUnionParam {
	var noParallel param.Opt[bool]
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
		noParallel = sdk.Bool(true)
	}
	switch req.ToolChoice {
	case "none":
		return sdk.ToolChoiceUnionParam{OfNone: &sdk.ToolChoiceNoneParam{}}
	case "required":
		return sdk.ToolChoiceUnionParam{OfAny: &sdk.ToolChoiceAnyParam{DisableParallelToolUse: noParallel}}
	case "function":
		return sdk.ToolChoiceUnionParam{OfTool: &sdk.ToolChoiceToolParam{Name: req.ToolChoiceName, DisableParallelToolUse: noParallel}}
	case "auto":
		return sdk.ToolChoiceUnionParam{OfAuto: &sdk.ToolChoiceAutoParam{DisableParallelToolUse: noParallel}}
	}
	if noParallel.Valid() {
		return sdk.ToolChoiceUnionParam{OfAuto: &sdk.ToolChoiceAutoParam{DisableParallelToolUse: noParallel}}
	}
	return sdk.ToolChoiceUnionParam{}
}

// FinishReason maps a Messages API stop reason to a chat-completions
// finish reason: end_turn, stop_sequence and pause_turn → stop; tool_use →
// tool_calls; max_tokens and model_context_window_exceeded → length;
// refusal → content_filter. An unknown reason is stop.
func FinishReason(r sdk.StopReason) string {
	switch r {
	case sdk.StopReasonToolUse:
		return upstream.FinishToolCalls
	case sdk.StopReasonMaxTokens, sdk.StopReasonModelContextWindowExceeded:
		return upstream.FinishLength
	case sdk.StopReasonRefusal:
		return upstream.FinishContentFilter
	}
	return upstream.FinishStop
}

// Completion translates a Messages API answer back: its text blocks
// joined as the content, its tool_use blocks as tool calls (same ids, the
// input object as the arguments string), the stop reason as the finish
// reason, and its usage (input tokens, cache writes and reads counted as
// prompt tokens). Thinking and other block types are left out: the proxy
// never asks for them. model is the run's, used when the answer names none.
func Completion(msg *sdk.Message, model string, now time.Time) (upstream.ChatCompletion, error) {
	c := upstream.ChatCompletion{ID: msg.ID, Model: string(msg.Model), Created: now.Unix(),
		FinishReason: FinishReason(msg.StopReason)}
	if c.Model == "" {
		c.Model = model
	}
	var text strings.Builder
	for i, b := range msg.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			args := bytes.TrimSpace(b.Input)
			if len(args) == 0 {
				args = []byte("{}")
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, args); err != nil || compact.Bytes()[0] != '{' {
				return upstream.ChatCompletion{}, fmt.Errorf("content[%d]: tool_use input is not a JSON object", i)
			}
			if b.ID == "" || b.Name == "" {
				return upstream.ChatCompletion{}, fmt.Errorf("content[%d]: tool_use without an id or a name", i)
			}
			c.ToolCalls = append(c.ToolCalls, upstream.ChatToolCall{ID: b.ID, Name: b.Name, Arguments: compact.Bytes()})
		}
	}
	c.Content = text.String()
	u := msg.Usage
	c.PromptTokens = max(u.InputTokens, 0) + max(u.CacheCreationInputTokens, 0) + max(u.CacheReadInputTokens, 0)
	c.CompletionTokens = max(u.OutputTokens, 0)
	return c, nil
}
