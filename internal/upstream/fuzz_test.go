package upstream_test

import (
	"testing"

	"github.com/belay-dev/belay/internal/upstream"
)

// FuzzConversation feeds ParseChatRequest any body and checks what both
// translating providers rely on from Conversation: turns alternate and are
// never empty, a user turn has its tool results first, tool calls appear
// only in assistant turns, and no text part is empty.
func FuzzConversation(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},` +
		`{"role":"assistant","content":"a","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}},` +
		`{"id":"2","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","tool_call_id":"1","content":"r1"},{"role":"user","content":"n"},{"role":"tool","tool_call_id":"2","content":""}]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":""},{"role":"developer","content":[{"type":"text","text":"d"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := upstream.ParseChatRequest(body)
		if err != nil {
			return
		}
		_, turns := upstream.Conversation(req.Messages)
		for i, turn := range turns {
			if len(turn.Parts) == 0 {
				t.Fatalf("turn %d is empty", i)
			}
			if i > 0 && turns[i-1].Role == turn.Role {
				t.Fatalf("turns %d and %d are both %s", i-1, i, turn.Role)
			}
			sawOther := false
			for _, p := range turn.Parts {
				switch {
				case p.ToolResult != nil:
					if turn.Role != upstream.RoleUser || sawOther {
						t.Fatalf("turn %d (%s): a tool result after other parts", i, turn.Role)
					}
				case p.ToolCall != nil:
					if turn.Role != upstream.RoleAssistant {
						t.Fatalf("turn %d: a tool call in a %s turn", i, turn.Role)
					}
					if !upstream.IsJSONObject(p.ToolCall.Arguments) {
						t.Fatalf("turn %d: arguments %q are not an object", i, p.ToolCall.Arguments)
					}
					sawOther = true
				default:
					if p.Text == "" {
						t.Fatalf("turn %d: an empty text part", i)
					}
					sawOther = true
				}
			}
		}
	})
}
