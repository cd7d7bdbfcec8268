package agent_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// TestTurnContext: a session turn's agent starts with the earlier turns'
// conversation between the system prompt and its instruction, lists the
// skills (names and descriptions, not bodies) in the system prompt, offers
// read_skill, and answers it with the body (an unknown name is an error
// result naming the skills); Tools never sees read_skill.
func TestTurnContext(t *testing.T) {
	args := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	// One earlier assistant message (the conversation's) puts the first
	// request at script step 1.
	script := scriptedmodel.Script{Name: "turn", Steps: []scriptedmodel.Step{
		{Content: "unused"},
		{ToolCalls: []scriptedmodel.ToolCall{
			{Name: "read_skill", Arguments: args(map[string]string{"name": "style"})},
			{Name: "read_skill", Arguments: args(map[string]string{"name": "nope"})},
		}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: args(map[string]string{"summary": "done"})}}},
	}}
	conv := []belay.ConversationMessage{{Role: "user", Content: "Fix add first."}, {Role: "assistant", Content: "Fixed add.\n[turn 1 completed; changed: calc.py]"}}
	skills := []belay.Skill{{Name: "style", Description: "how calc.py is written", Body: "SKILL-BODY: one line per function."}}
	r := runScript(t, script, func(c *agent.Config) { c.Conversation, c.Skills = conv, skills })
	if !r.out.Finished {
		t.Fatalf("outcome %+v; want finished", r.out)
	}
	reqs := r.model.Requests()
	first := reqs[0]
	if len(first.Messages) != 4 || first.Messages[1].Content != "Fix add first." || first.Messages[2].Role != "assistant" ||
		first.Messages[3].Content != "Fix add() in calc.py so that tests pass." {
		t.Fatalf("the first request's messages %+v; want system, the conversation, the instruction", first.Messages)
	}
	system := first.Messages[0].Content
	if !strings.Contains(system, "- style: how calc.py is written") || strings.Contains(system, "SKILL-BODY") || !slices.Contains(first.Tools, "read_skill") {
		t.Fatalf("the system prompt and tools do not offer the skill as they should (tools %q):\n%s", first.Tools, system)
	}
	second := reqs[1].Messages
	var results []string
	for _, m := range second {
		if m.Role == "tool" {
			results = append(results, m.Content)
		}
	}
	if len(results) != 2 || results[0] != "SKILL-BODY: one line per function." || !strings.Contains(results[1], `no skill is named "nope"; the skills are: style`) {
		t.Fatalf("read_skill results %q", results)
	}
	if calls := r.tools.Calls(); len(calls) != 0 {
		t.Errorf("Tools saw %v; read_skill is the loop's", calls)
	}

	// Without skills there is no read_skill.
	plain := runScript(t, scriptedmodel.Script{Name: "plain", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: args(map[string]string{"summary": "done"})}}},
	}}, nil)
	if slices.Contains(plain.model.Requests()[0].Tools, "read_skill") {
		t.Error("a run without skills offers read_skill")
	}
}
