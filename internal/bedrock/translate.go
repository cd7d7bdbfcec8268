package bedrock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/document"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"
	smithydocument "github.com/aws/smithy-go/document"

	"github.com/belay-dev/belay/internal/upstream"
)

// EmptyToolResult stands in for a tool result with no text: Converse
// refuses a blank text block.
const EmptyToolResult = "(empty)"

// Request translates a chat-completions request into a Converse request.
// The rules:
//
//   - the model is the modelId (a model id, an inference profile id or an
//     ARN: whatever the operator configured as the run's model);
//   - system and developer messages become the system blocks, in order
//     (their place among the turns is not kept);
//   - user and assistant messages become turns; consecutive messages of one
//     role are merged, as Converse requires alternating turns;
//   - an assistant's tool calls become toolUse blocks with the same ids and
//     the arguments as the input document; each tool message becomes a
//     toolResult block (text content) of the next user turn, several
//     together for parallel calls, results first; a blank result is sent
//     as EmptyToolResult;
//   - functions become toolSpecs (parameters → inputSchema.json);
//     tool_choice auto, required (→ any) and a named function (→ tool) map
//     one to one; tool_choice none cannot be said (Converse has no "none")
//     and is refused; parallel_tool_calls has no equivalent and is dropped;
//   - max tokens, temperature (capped at 1), top_p and stop (→
//     stopSequences) go into inferenceConfig; user is dropped.
//
// Empty text is left out (Converse refuses blank text blocks), and so is a
// message left with nothing.
func Request(req upstream.ChatRequest) (*bedrockruntime.ConverseInput, error) {
	in := &bedrockruntime.ConverseInput{ModelId: aws.String(req.Model)}
	system, turns := upstream.Conversation(req.Messages)
	for _, s := range system {
		in.System = append(in.System, &types.SystemContentBlockMemberText{Value: s})
	}
	for i, t := range turns {
		msg := types.Message{Role: types.ConversationRoleUser}
		if t.Role == upstream.RoleAssistant {
			msg.Role = types.ConversationRoleAssistant
		}
		for j, part := range t.Parts {
			switch {
			case part.ToolResult != nil:
				text := part.ToolResult.Content
				if strings.TrimSpace(text) == "" {
					text = EmptyToolResult
				}
				msg.Content = append(msg.Content, &types.ContentBlockMemberToolResult{Value: types.ToolResultBlock{
					ToolUseId: aws.String(part.ToolResult.ToolCallID),
					Content:   []types.ToolResultContentBlock{&types.ToolResultContentBlockMemberText{Value: text}},
				}})
			case part.ToolCall != nil:
				input, err := jsonDocument(part.ToolCall.Arguments)
				if err != nil {
					return nil, upstream.Invalid(fmt.Sprintf("turn %d part %d", i, j), "tool call arguments must be a JSON object")
				}
				msg.Content = append(msg.Content, &types.ContentBlockMemberToolUse{Value: types.ToolUseBlock{
					ToolUseId: aws.String(part.ToolCall.ID), Name: aws.String(part.ToolCall.Name), Input: input,
				}})
			default:
				if strings.TrimSpace(part.Text) == "" {
					continue
				}
				msg.Content = append(msg.Content, &types.ContentBlockMemberText{Value: part.Text})
			}
		}
		if len(msg.Content) > 0 {
			in.Messages = append(in.Messages, msg)
		}
	}
	if len(req.Tools) > 0 {
		tc := &types.ToolConfiguration{}
		for i, tool := range req.Tools {
			schema, err := jsonDocument(tool.Parameters)
			if err != nil {
				return nil, upstream.Invalid(fmt.Sprintf("tools[%d].function.parameters", i), "must be a JSON Schema object")
			}
			spec := types.ToolSpecification{Name: aws.String(tool.Name), InputSchema: &types.ToolInputSchemaMemberJson{Value: schema}}
			if tool.Description != "" {
				spec.Description = aws.String(tool.Description)
			}
			tc.Tools = append(tc.Tools, &types.ToolMemberToolSpec{Value: spec})
		}
		switch req.ToolChoice {
		case "none":
			return nil, upstream.Invalid("tool_choice", "none cannot be sent to Bedrock's Converse API; leave tool_choice unset or use auto")
		case "required":
			tc.ToolChoice = &types.ToolChoiceMemberAny{Value: types.AnyToolChoice{}}
		case "function":
			tc.ToolChoice = &types.ToolChoiceMemberTool{Value: types.SpecificToolChoice{Name: aws.String(req.ToolChoiceName)}}
		case "auto":
			tc.ToolChoice = &types.ToolChoiceMemberAuto{Value: types.AutoToolChoice{}}
		}
		in.ToolConfig = tc
	}
	ic := &types.InferenceConfiguration{StopSequences: req.Stop}
	if req.MaxTokens > 0 {
		ic.MaxTokens = aws.Int32(int32(min(req.MaxTokens, 1<<31-1)))
	}
	if req.Temperature != nil {
		ic.Temperature = aws.Float32(float32(min(max(*req.Temperature, 0), 1)))
	}
	if req.TopP != nil {
		ic.TopP = aws.Float32(float32(*req.TopP))
	}
	in.InferenceConfig = ic
	return in, nil
}

// jsonDocument turns a JSON object into a Converse document, keeping its
// numbers exact.
func jsonDocument(raw json.RawMessage) (document.Interface, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil || v == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	return document.NewLazyDocument(exactNumbers(v)), nil
}

// exactNumbers replaces json.Number (which the document encoder would
// send as a string) by smithy's document.Number.
func exactNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = exactNumbers(e)
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = exactNumbers(e)
		}
		return t
	case json.Number:
		return smithydocument.Number(t)
	}
	return v
}

// FinishReason maps a Converse stop reason to a chat-completions finish
// reason: end_turn and stop_sequence → stop; tool_use → tool_calls;
// max_tokens and model_context_window_exceeded → length;
// guardrail_intervened and content_filtered → content_filter; anything
// else (malformed_model_output, malformed_tool_use, a new reason) → stop.
func FinishReason(r types.StopReason) string {
	switch r {
	case types.StopReasonToolUse:
		return upstream.FinishToolCalls
	case types.StopReasonMaxTokens, types.StopReasonModelContextWindowExceeded:
		return upstream.FinishLength
	case types.StopReasonGuardrailIntervened, types.StopReasonContentFiltered:
		return upstream.FinishContentFilter
	}
	return upstream.FinishStop
}

// Completion translates a Converse answer back: its text blocks joined as
// the content, its toolUse blocks as tool calls (same ids, the input
// document as the arguments string), the stop reason as the finish reason,
// and its usage (input tokens, cache reads and writes counted as prompt
// tokens). Reasoning and other block types are left out. id is the
// answer's id (Bedrock's request id); model the run's.
func Completion(out *bedrockruntime.ConverseOutput, id, model string, now time.Time) (upstream.ChatCompletion, error) {
	c := upstream.ChatCompletion{ID: id, Model: model, Created: now.Unix(), FinishReason: FinishReason(out.StopReason)}
	msg, ok := out.Output.(*types.ConverseOutputMemberMessage)
	if !ok {
		return upstream.ChatCompletion{}, fmt.Errorf("the answer has no output message (%T)", out.Output)
	}
	var text strings.Builder
	for i, b := range msg.Value.Content {
		switch b := b.(type) {
		case *types.ContentBlockMemberText:
			text.WriteString(b.Value)
		case *types.ContentBlockMemberToolUse:
			args := []byte("{}")
			if b.Value.Input != nil {
				raw, err := b.Value.Input.MarshalSmithyDocument()
				if err != nil {
					return upstream.ChatCompletion{}, fmt.Errorf("content[%d]: toolUse input: %w", i, err)
				}
				args = raw
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, args); err != nil || !upstream.IsJSONObject(compact.Bytes()) {
				return upstream.ChatCompletion{}, fmt.Errorf("content[%d]: toolUse input is not a JSON object", i)
			}
			if aws.ToString(b.Value.ToolUseId) == "" || aws.ToString(b.Value.Name) == "" {
				return upstream.ChatCompletion{}, fmt.Errorf("content[%d]: toolUse without an id or a name", i)
			}
			c.ToolCalls = append(c.ToolCalls, upstream.ChatToolCall{ID: *b.Value.ToolUseId, Name: *b.Value.Name, Arguments: compact.Bytes()})
		}
	}
	c.Content = text.String()
	if u := out.Usage; u != nil {
		c.PromptTokens = int64(max(aws.ToInt32(u.InputTokens), 0)) + int64(max(aws.ToInt32(u.CacheReadInputTokens), 0)) +
			int64(max(aws.ToInt32(u.CacheWriteInputTokens), 0))
		c.CompletionTokens = int64(max(aws.ToInt32(u.OutputTokens), 0))
	}
	return c, nil
}
