package anthropic_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/upstream"
)

var created = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

// sameJSON reports whether two JSON texts hold the same value.
func sameJSON(tb testing.TB, got []byte, want string) bool {
	tb.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		tb.Fatalf("got is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		tb.Fatalf("want is not JSON: %v\n%s", err, want)
	}
	return reflect.DeepEqual(g, w)
}

// TestRequestTranslation is the table of chat-completions requests and the
// Messages API request each becomes (as the SDK sends it: the params'
// JSON).
func TestRequestTranslation(t *testing.T) {
	tests := []struct {
		name string
		chat string
		want string
	}{
		{"text",
			`{"model":"claude-x","messages":[{"role":"system","content":"You are an agent."},{"role":"user","content":"Fix it."}],"max_completion_tokens":4096}`,
			`{"model":"claude-x","max_tokens":4096,"system":[{"type":"text","text":"You are an agent."}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"Fix it."}]}]}`},
		{"multi-turn, text parts, developer message",
			`{"model":"claude-x","messages":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"there."}]},
			  {"role":"assistant","content":"Hi."},{"role":"system","content":"More rules."},{"role":"user","content":"Again."}],"max_tokens":100}`,
			`{"model":"claude-x","max_tokens":100,"system":[{"type":"text","text":"Rules."},{"type":"text","text":"More rules."}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"Hello, there."}]},
			              {"role":"assistant","content":[{"type":"text","text":"Hi."}]},
			              {"role":"user","content":[{"type":"text","text":"Again."}]}]}`},
		{"parallel tool calls and their results",
			`{"model":"claude-x","max_completion_tokens":4096,"messages":[{"role":"user","content":"Read both."},
			  {"role":"assistant","content":"Reading.","refusal":null,"tool_calls":[
			    {"id":"toolu_01","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a.py\"}"}},
			    {"id":"toolu_02","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b.py\",\"n\":12345678901234567890}"}}]},
			  {"role":"tool","tool_call_id":"toolu_01","content":"A"},
			  {"role":"tool","tool_call_id":"toolu_02","content":[{"type":"text","text":"B"}]}]}`,
			`{"model":"claude-x","max_tokens":4096,"messages":[
			  {"role":"user","content":[{"type":"text","text":"Read both."}]},
			  {"role":"assistant","content":[{"type":"text","text":"Reading."},
			    {"type":"tool_use","id":"toolu_01","name":"read_file","input":{"path":"a.py"}},
			    {"type":"tool_use","id":"toolu_02","name":"read_file","input":{"path":"b.py","n":12345678901234567890}}]},
			  {"role":"user","content":[
			    {"type":"tool_result","tool_use_id":"toolu_01","content":[{"type":"text","text":"A"}]},
			    {"type":"tool_result","tool_use_id":"toolu_02","content":[{"type":"text","text":"B"}]}]}]}`},
		{"a tool result then a user message: one turn, results first; empty text left out",
			`{"model":"claude-x","max_tokens":50,"messages":[{"role":"user","content":"Go."},
			  {"role":"assistant","content":"","tool_calls":[{"id":"toolu_9","type":"function","function":{"name":"finish","arguments":""}}]},
			  {"role":"tool","tool_call_id":"toolu_9","content":""},{"role":"user","content":"Call a tool."},{"role":"user","content":""}]}`,
			`{"model":"claude-x","max_tokens":50,"messages":[
			  {"role":"user","content":[{"type":"text","text":"Go."}]},
			  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_9","name":"finish","input":{}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9"},{"type":"text","text":"Call a tool."}]}]}`},
		{"tools, parallel calls off",
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":false,
			  "tools":[{"type":"function","function":{"name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}}},
			           {"type":"function","function":{"name":"finish"}}]}`,
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tool_choice":{"type":"auto","disable_parallel_tool_use":true},
			  "tools":[{"name":"read_file","description":"Read a file.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}},
			           {"name":"finish","input_schema":{"type":"object","properties":{}}}]}`},
		{"tool_choice required",
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tool_choice":"required",
			  "tools":[{"type":"function","function":{"name":"finish","parameters":{"type":"object"}}}]}`,
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tool_choice":{"type":"any"},"tools":[{"name":"finish","input_schema":{"type":"object","properties":{}}}]}`},
		{"tool_choice a function, tool_choice none",
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"finish"}},"parallel_tool_calls":false,
			  "tools":[{"type":"function","function":{"name":"finish","parameters":{"type":"object"}}}]}`,
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tool_choice":{"type":"tool","name":"finish","disable_parallel_tool_use":true},"tools":[{"name":"finish","input_schema":{"type":"object","properties":{}}}]}`},
		{"tool_choice none",
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
			  "tools":[{"type":"function","function":{"name":"finish","parameters":{"type":"object"}}}]}`,
			`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tool_choice":{"type":"none"},"tools":[{"name":"finish","input_schema":{"type":"object","properties":{}}}]}`},
		{"stop, user, the smaller token cap; sampling and penalties dropped",
			`{"model":"claude-x","max_tokens":300,"max_completion_tokens":200,"messages":[{"role":"user","content":"x"}],"stop":"END","user":"run_1",
			  "temperature":1.7,"top_p":0.5,"seed":7,"frequency_penalty":1,"presence_penalty":1,"response_format":{"type":"text"},"n":1,"stream":false}`,
			`{"model":"claude-x","max_tokens":200,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "stop_sequences":["END"],"metadata":{"user_id":"run_1"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, err := upstream.ParseChatRequest([]byte(tt.chat))
			if err != nil {
				t.Fatalf("ParseChatRequest: %v", err)
			}
			params, err := anthropic.Request(chat)
			if err != nil {
				t.Fatalf("Request: %v", err)
			}
			got, err := json.Marshal(params)
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, got, tt.want) {
				t.Errorf("Messages request\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestRequestRefusals lists what cannot be said to the Messages API; each
// is an ErrInvalid naming the field.
func TestRequestRefusals(t *testing.T) {
	user := `{"role":"user","content":"x"}`
	tests := []struct{ name, chat, field string }{
		{"image part", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x"}}]}]}`, "messages[0].content[0].type"},
		{"custom tool", `{"model":"m","max_tokens":1,"messages":[` + user + `],"tools":[{"type":"custom","custom":{"name":"x"}}]}`, "tools[0].type"},
		{"JSON response format", `{"model":"m","max_tokens":1,"messages":[` + user + `],"response_format":{"type":"json_object"}}`, "response_format"},
		{"arguments not an object", `{"model":"m","max_tokens":1,"messages":[` + user + `,{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`, "messages[1].tool_calls[0].function.arguments"},
		{"legacy function_call", `{"model":"m","max_tokens":1,"messages":[` + user + `,{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`, "messages[1].function_call"},
		{"tool message without id", `{"model":"m","max_tokens":1,"messages":[` + user + `,{"role":"tool","content":"r"}]}`, "messages[1].tool_call_id"},
		{"unknown role", `{"model":"m","max_tokens":1,"messages":[{"role":"function","content":"r"}]}`, "messages[0].role"},
		{"tool_choice without tools", `{"model":"m","max_tokens":1,"messages":[` + user + `],"tool_choice":"required"}`, "tool_choice"},
		{"schema not an object", `{"model":"m","max_tokens":1,"messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}]}`, "tools[0].function.parameters.type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, err := upstream.ParseChatRequest([]byte(tt.chat))
			if err == nil {
				_, err = anthropic.Request(chat)
			}
			ue, ok := err.(*upstream.Error)
			if !ok || ue.Kind != upstream.ErrInvalid || ue.Field != tt.field {
				t.Fatalf("err = %#v, want ErrInvalid on %s", err, tt.field)
			}
		})
	}
}

// TestCompletionTranslation is the table of Messages API answers and the
// chat.completion each becomes (what the sandbox reads).
func TestCompletionTranslation(t *testing.T) {
	usage := `"usage":{"input_tokens":11,"output_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`
	chatUsage := `"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}`
	head := `"id":"msg_1","object":"chat.completion","created":1930367167,"model":"claude-x",`
	tests := []struct {
		name   string
		answer string
		want   string
	}{
		{"text, end_turn",
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Done.","refusal":null},"logprobs":null,"finish_reason":"stop"}],` + chatUsage + `}`},
		{"parallel tool calls, ids kept, text blocks joined",
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Reading "},{"type":"text","text":"both."},
			  {"type":"tool_use","id":"toolu_A","name":"read_file","input":{"path":"a.py"}},
			  {"type":"tool_use","id":"toolu_B","name":"read_file","input":{ "path" : "b.py", "n": 12345678901234567890 }}],"stop_reason":"tool_use",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Reading both.","refusal":null,"tool_calls":[
			   {"id":"toolu_A","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.py\"}"}},
			   {"id":"toolu_B","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"b.py\",\"n\":12345678901234567890}"}}]},
			   "logprobs":null,"finish_reason":"tool_calls"}],` + chatUsage + `}`},
		{"tool call without text, empty input; thinking left out",
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"tool_use","id":"toolu_C","name":"list_files","input":{}}],"stop_reason":"tool_use",` + usage + `}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[
			   {"id":"toolu_C","type":"function","function":{"name":"list_files","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],` + chatUsage + `}`},
		{"max_tokens → length; cached input counted",
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Trunc"}],"stop_reason":"max_tokens",
			  "usage":{"input_tokens":5,"output_tokens":7,"cache_creation_input_tokens":4,"cache_read_input_tokens":2}}`,
			`{` + head + `"choices":[{"index":0,"message":{"role":"assistant","content":"Trunc","refusal":null},"logprobs":null,"finish_reason":"length"}],` + chatUsage + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var msg sdk.Message
			if err := json.Unmarshal([]byte(tt.answer), &msg); err != nil {
				t.Fatal(err)
			}
			c, err := anthropic.Completion(&msg, "claude-x", created)
			if err != nil {
				t.Fatalf("Completion: %v", err)
			}
			got, err := c.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, got, tt.want) {
				t.Errorf("chat completion\n got %s\nwant %s", got, tt.want)
			}
		})
	}
	t.Run("tool_use input not an object", func(t *testing.T) {
		var msg sdk.Message
		_ = json.Unmarshal([]byte(`{"id":"m","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}],"stop_reason":"tool_use"}`), &msg)
		if _, err := anthropic.Completion(&msg, "m", created); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestFinishReasons(t *testing.T) {
	for reason, want := range map[sdk.StopReason]string{
		sdk.StopReasonEndTurn:                    "stop",
		sdk.StopReasonStopSequence:               "stop",
		sdk.StopReasonPauseTurn:                  "stop",
		sdk.StopReasonToolUse:                    "tool_calls",
		sdk.StopReasonMaxTokens:                  "length",
		sdk.StopReasonModelContextWindowExceeded: "length",
		sdk.StopReasonRefusal:                    "content_filter",
		"a_reason_from_the_future":               "stop",
	} {
		if got := anthropic.FinishReason(reason); got != want {
			t.Errorf("FinishReason(%q) = %q, want %q", reason, got, want)
		}
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"":                                      anthropic.DefaultBaseURL,
		"https://api.anthropic.com":             "https://api.anthropic.com",
		"https://api.anthropic.com/":            "https://api.anthropic.com",
		"https://api.anthropic.com/v1/messages": "https://api.anthropic.com",
		"https://gw.example/anthropic/":         "https://gw.example/anthropic",
	} {
		if got := anthropic.BaseURL(in); got != want {
			t.Errorf("BaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}
