package upstream_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/belay-dev/belay/internal/upstream"
)

func TestParseChatRequest(t *testing.T) {
	no := false
	temp := 0.2
	body := `{"model":"m","max_tokens":900,"max_completion_tokens":800,"temperature":0.2,"stop":["a","b"],"user":"u",
	  "parallel_tool_calls":false,"tool_choice":{"type":"function","function":{"name":"read_file"}},
	  "tools":[{"type":"function","function":{"name":"read_file","description":"Read.","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},
	           {"type":"function","function":{"name":"finish"}}],
	  "messages":[{"role":"developer","content":"D"},{"role":"user","content":[{"type":"text","text":"U1"},{"type":"text","text":"U2"}]},
	    {"role":"assistant","content":[{"type":"refusal","refusal":"R"}],"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":" { \"path\" : \"a\" } "}}]},
	    {"role":"tool","tool_call_id":"c1","content":"T"}]}`
	got, err := upstream.ParseChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := upstream.ChatRequest{
		Model: "m", MaxTokens: 800, Temperature: &temp, Stop: []string{"a", "b"}, User: "u",
		ParallelToolCalls: &no, ToolChoice: "function", ToolChoiceName: "read_file",
		Tools: []upstream.ChatTool{
			{Name: "read_file", Description: "Read.", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
			{Name: "finish", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
		},
		Messages: []upstream.ChatMessage{
			{Role: "system", Content: "D"},
			{Role: "user", Content: "U1U2"},
			{Role: "assistant", Content: "R", ToolCalls: []upstream.ChatToolCall{{ID: "c1", Name: "read_file", Arguments: json.RawMessage(`{"path":"a"}`)}}},
			{Role: "tool", ToolCallID: "c1", Content: "T"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed\n %+v\nwant\n %+v", got, want)
	}
}

func TestParseChatRequestRefuses(t *testing.T) {
	u := `{"role":"user","content":"x"}`
	tests := []struct{ name, body, field string }{
		{"not an object", `[1]`, ""},
		{"no messages", `{"model":"m","messages":[]}`, "messages"},
		{"audio part", `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`, "messages[0].content[0].type"},
		{"content a number", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"tool calls on a user message", `{"messages":[{"role":"user","content":"x","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].tool_calls"},
		{"tool call without id", `{"messages":[` + u + `,{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[1].tool_calls[0]"},
		{"arguments not JSON", `{"messages":[` + u + `,{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{oops"}}]}]}`, "messages[1].tool_calls[0].function.arguments"},
		{"tool without a name", `{"messages":[` + u + `],"tools":[{"type":"function","function":{}}]}`, "tools[0].function.name"},
		{"parameters not an object", `{"messages":[` + u + `],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]}`, "tools[0].function.parameters"},
		{"tool_choice unknown", `{"messages":[` + u + `],"tool_choice":"sometimes"}`, "tool_choice"},
		{"named tool_choice without tools", `{"messages":[` + u + `],"tool_choice":{"type":"function","function":{"name":"f"}}}`, "tool_choice"},
		{"stop a number", `{"messages":[` + u + `],"stop":3}`, "stop"},
		{"json_schema format", `{"messages":[` + u + `],"response_format":{"type":"json_schema","json_schema":{}}}`, "response_format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := upstream.ParseChatRequest([]byte(tt.body))
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != upstream.ErrInvalid || ue.Field != tt.field {
				t.Fatalf("err = %#v, want ErrInvalid on %q", err, tt.field)
			}
		})
	}
}

// TestConversation is the table of the turn rules both translating
// providers rely on.
func TestConversation(t *testing.T) {
	call := func(id string) upstream.ChatToolCall {
		return upstream.ChatToolCall{ID: id, Name: "f", Arguments: json.RawMessage(`{}`)}
	}
	tests := []struct {
		name       string
		msgs       []upstream.ChatMessage
		wantSystem []string
		wantTurns  []upstream.Turn
	}{
		{"system anywhere is gathered; roles alternate",
			[]upstream.ChatMessage{{Role: "system", Content: "S1"}, {Role: "user", Content: "U"}, {Role: "system", Content: "S2"},
				{Role: "assistant", Content: "A"}, {Role: "system", Content: ""}},
			[]string{"S1", "S2"},
			[]upstream.Turn{{Role: "user", Parts: []upstream.Part{{Text: "U"}}}, {Role: "assistant", Parts: []upstream.Part{{Text: "A"}}}}},
		{"parallel calls, their results in one user turn, a nudge after them",
			[]upstream.ChatMessage{{Role: "user", Content: "U"},
				{Role: "assistant", Content: "A", ToolCalls: []upstream.ChatToolCall{call("a"), call("b")}},
				{Role: "tool", ToolCallID: "a", Content: "RA"}, {Role: "user", Content: "N"}, {Role: "tool", ToolCallID: "b", Content: "RB"}},
			nil,
			[]upstream.Turn{
				{Role: "user", Parts: []upstream.Part{{Text: "U"}}},
				{Role: "assistant", Parts: []upstream.Part{{Text: "A"}, {ToolCall: &upstream.ChatToolCall{ID: "a", Name: "f", Arguments: json.RawMessage(`{}`)}},
					{ToolCall: &upstream.ChatToolCall{ID: "b", Name: "f", Arguments: json.RawMessage(`{}`)}}}},
				{Role: "user", Parts: []upstream.Part{{ToolResult: &upstream.ToolResult{ToolCallID: "a", Content: "RA"}},
					{ToolResult: &upstream.ToolResult{ToolCallID: "b", Content: "RB"}}, {Text: "N"}}},
			}},
		{"empty messages dropped, neighbours merged",
			[]upstream.ChatMessage{{Role: "user", Content: "U1"}, {Role: "assistant", Content: ""}, {Role: "user", Content: "U2"}},
			nil,
			[]upstream.Turn{{Role: "user", Parts: []upstream.Part{{Text: "U1"}, {Text: "U2"}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			system, turns := upstream.Conversation(tt.msgs)
			if !reflect.DeepEqual(system, tt.wantSystem) {
				t.Errorf("system %q, want %q", system, tt.wantSystem)
			}
			if !reflect.DeepEqual(turns, tt.wantTurns) {
				gj, _ := json.Marshal(turns)
				wj, _ := json.Marshal(tt.wantTurns)
				t.Errorf("turns\n %s\nwant\n %s", gj, wj)
			}
		})
	}
}

// TestChatCompletionReadsAsTheAgentReadsIt decodes the rendered answer
// with the official OpenAI SDK, as the agent does, and turns it back into
// the next request's assistant message.
func TestChatCompletionReadsAsTheAgentReadsIt(t *testing.T) {
	c := upstream.ChatCompletion{ID: "msg_1", Model: "claude-x", Created: 42, Content: "Reading.",
		ToolCalls: []upstream.ChatToolCall{
			{ID: "toolu_1", Name: "read_file", Arguments: json.RawMessage(`{"path":"a"}`)},
			{ID: "toolu_2", Name: "list_files"},
		},
		FinishReason: upstream.FinishToolCalls, PromptTokens: 10, CompletionTokens: 3}
	raw, err := c.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got openai.ChatCompletion
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	msg := got.Choices[0].Message
	if got.ID != "msg_1" || got.Model != "claude-x" || got.Choices[0].FinishReason != "tool_calls" || msg.Content != "Reading." ||
		len(msg.ToolCalls) != 2 || msg.ToolCalls[0].ID != "toolu_1" || msg.ToolCalls[0].Function.Arguments != `{"path":"a"}` ||
		msg.ToolCalls[1].Function.Arguments != "{}" || got.Usage.PromptTokens != 10 || got.Usage.CompletionTokens != 3 || got.Usage.TotalTokens != 13 {
		t.Errorf("decoded %+v", got)
	}
	// The agent sends the message back as it came; it parses again.
	back, _ := json.Marshal(map[string]any{"model": "claude-x", "max_tokens": 5,
		"messages": []any{map[string]any{"role": "user", "content": "x"}, msg.ToParam()}})
	req, err := upstream.ParseChatRequest(back)
	if err != nil {
		t.Fatalf("the answer's message does not parse as the next request's: %v", err)
	}
	if m := req.Messages[1]; m.Role != "assistant" || len(m.ToolCalls) != 2 || m.ToolCalls[1].ID != "toolu_2" {
		t.Errorf("round trip %+v", m)
	}
	if _, err := c.Answer(200, int64(len(raw))-1); err == nil {
		t.Error("Answer accepted an answer over the limit")
	}
}
