package agent_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// stateLog records every checkpoint a loop hands out, each state through
// JSON as a checkpoint keeps it.
type stateLog struct {
	mu     sync.Mutex
	states []agent.State
}

func (s *stateLog) record(_ context.Context, st agent.State) {
	b, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	back, err := agent.DecodeState(b)
	if err != nil {
		panic(err)
	}
	s.mu.Lock()
	s.states = append(s.states, back)
	s.mu.Unlock()
}

func (s *stateLog) all() []agent.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]agent.State(nil), s.states...)
}

func call(name string, args string) scriptedmodel.ToolCall {
	return scriptedmodel.ToolCall{Name: name, Arguments: json.RawMessage(args)}
}

// resumeScript asks for three calls in one answer, then one, then finish.
var resumeScript = scriptedmodel.Script{Name: "resume", Steps: []scriptedmodel.Step{
	{ToolCalls: []scriptedmodel.ToolCall{
		call("read_file", `{"path":"calc.py"}`), call("edit_file", `{"path":"calc.py","old":"-","new":"+"}`), call("list_files", `{"path":"."}`),
	}},
	{ToolCalls: []scriptedmodel.ToolCall{call("read_file", `{"path":"tests/test_calc.py"}`)}},
	{ToolCalls: []scriptedmodel.ToolCall{call("finish", `{"summary":"done"}`)}},
}}

// TestCheckpoints: the loop hands out its state before each tool call
// runs (the call pending), after its result, and at its end, each one the
// conversation exactly as far as it went.
func TestCheckpoints(t *testing.T) {
	log := &stateLog{}
	r := runScript(t, resumeScript, func(c *agent.Config) { c.Checkpoint = log.record })
	if !r.out.Finished || r.out.Steps != 3 {
		t.Fatalf("outcome %+v, want finished in 3 steps", r.out)
	}
	states := log.all()
	type mark struct {
		pending string
		msgs    int
		steps   int
		ended   bool
	}
	want := []mark{
		{"read_file", 3, 1, false}, {"", 4, 1, false},
		{"edit_file", 4, 1, false}, {"", 5, 1, false},
		{"list_files", 5, 1, false}, {"", 6, 1, false},
		{"read_file", 7, 2, false}, {"", 8, 2, false},
		{"", 10, 3, true},
	}
	if len(states) != len(want) {
		t.Fatalf("%d checkpoints, want %d", len(states), len(want))
	}
	for i, s := range states {
		got := mark{msgs: len(s.Messages), steps: s.Steps, ended: s.Outcome != nil}
		if s.Pending != nil {
			got.pending = s.Pending.Name
			if s.Pending.Step != s.Steps || s.Pending.ID == "" || s.Pending.Since.IsZero() {
				t.Errorf("checkpoint %d: pending %+v at step %d", i, s.Pending, s.Steps)
			}
		}
		if got != want[i] {
			t.Errorf("checkpoint %d = %+v, want %+v", i, got, want[i])
		}
	}
	last := states[len(states)-1]
	if last.Outcome.Reason != agent.ReasonFinished || last.Outcome.Summary != "done" {
		t.Errorf("final checkpoint outcome %+v", last.Outcome)
	}
	if strings.Contains(mustJSON(t, states), canary) {
		t.Error("a checkpoint holds the model token")
	}
}

// TestResumeInterruptsThePendingCall resumes a loop from the checkpoint
// taken while its second call (edit_file) was running, as the sandbox of
// the next attempt does: the model's next request carries the call as
// interrupted and the third call of the same answer as not run, neither
// reaches the tools again, and the loop goes on to finish within its
// steps, counting the ones before.
func TestResumeInterruptsThePendingCall(t *testing.T) {
	log := &stateLog{}
	runScript(t, resumeScript, func(c *agent.Config) { c.Checkpoint = log.record })
	var pending agent.State
	for _, s := range log.all() {
		if s.Pending != nil && s.Pending.Name == "edit_file" {
			pending = s
		}
	}
	if pending.Pending == nil {
		t.Fatal("no checkpoint with edit_file pending")
	}

	const reason = "the sandbox was lost (sandbox killed) while this call ran"
	after := &stateLog{}
	r := runScript(t, resumeScript, func(c *agent.Config) {
		c.Resume, c.InterruptedReason, c.Checkpoint = &pending, reason, after.record
	})
	if !r.out.Finished || r.out.Steps != 3 || r.out.Summary != "done" {
		t.Fatalf("resumed outcome %+v, want finished at step 3", r.out)
	}
	if calls := r.tools.Calls(); len(calls) != 1 || calls[0].Name != "read_file" || !strings.Contains(calls[0].Args, "tests/test_calc.py") {
		t.Fatalf("the resumed loop ran %+v; want only step 2's read_file", calls)
	}
	reqs := r.model.Requests()
	if len(reqs) != 2 || reqs[0].Step != 1 {
		t.Fatalf("the resumed loop made %d model calls (first at step %d); want 2, from step 1", len(reqs), reqs[0].Step)
	}
	msgs := reqs[0].Messages
	tail := msgs[len(msgs)-3:]
	var got agent.Interrupted
	if tail[1].Role != "tool" || json.Unmarshal([]byte(tail[1].Content), &got) != nil || !got.Interrupted || got.Reason != reason {
		t.Fatalf("the model's next request answers edit_file with %+v; want {interrupted: true, reason: %q}", tail[1], reason)
	}
	if tail[0].Role != "tool" || !strings.Contains(tail[0].Content, "contents of calc.py") {
		t.Errorf("read_file's result before the interruption: %+v", tail[0])
	}
	if tail[2].Role != "tool" || !strings.HasPrefix(tail[2].Content, "error: not run:") {
		t.Errorf("list_files after the interruption: %+v; want not run", tail[2])
	}
	ids := []string{tail[0].ToolCallID, tail[1].ToolCallID, tail[2].ToolCallID}
	if ids[0] != "call_0_0" || ids[1] != "call_0_1" || ids[2] != "call_0_2" {
		t.Errorf("tool results answer %v; want call_0_0..2 in order", ids)
	}
	var interrupted []event
	for _, e := range r.sink.Events() {
		if e.Type == belay.EventToolResult && e.Data["interrupted"] == true {
			interrupted = append(interrupted, e)
		}
		if e.Type == belay.EventToolCall && e.Data["name"] != "read_file" && e.Data["name"] != "finish" {
			t.Errorf("the resumed loop emitted tool.call for %v", e.Data["name"])
		}
	}
	if len(interrupted) != 1 || interrupted[0].Data["name"] != "edit_file" || interrupted[0].Data["isError"] != true {
		t.Errorf("interrupted tool.result events %+v; want one, for edit_file", interrupted)
	}
	lines := transcriptLines(t, r.transcript)
	if lines[0].Role != "note" || !strings.Contains(lines[0].Content, "resumed") || lines[1].Role != "system" {
		t.Errorf("the resumed transcript starts %s; want a note, then the restored conversation", roles(lines[:3]))
	}
	if got := after.all(); len(got) == 0 || got[0].Pending == nil || got[0].Pending.Name != "read_file" || len(got[0].Messages) != len(msgs)+1 {
		t.Errorf("the resumed loop's first checkpoint %+v; want the restored conversation, its answers and step 2's call pending", got[0].Pending)
	}
}

// TestResumeAfterTheEnd: a state taken when the loop had ended (the
// sandbox was then lost in its final checks) ends a resumed loop at once,
// with no model call.
func TestResumeAfterTheEnd(t *testing.T) {
	log := &stateLog{}
	runScript(t, resumeScript, func(c *agent.Config) { c.Checkpoint = log.record })
	states := log.all()
	end := states[len(states)-1]
	r := runScript(t, resumeScript, func(c *agent.Config) { c.Resume = &end })
	if r.model.Calls() != 0 || len(r.tools.Calls()) != 0 {
		t.Fatalf("a loop resumed after its end made %d model calls and %d tool calls", r.model.Calls(), len(r.tools.Calls()))
	}
	if !r.out.Finished || r.out.Summary != "done" || r.out.Steps != 3 {
		t.Fatalf("outcome %+v, want the ended loop's", r.out)
	}
}

// TestCancelledLoopKeepsItsPendingCheckpoint: a loop stopped from outside
// during a call saves neither the call's result nor an end: the last
// checkpoint keeps the call pending, so a resume answers it interrupted.
func TestCancelledLoopKeepsItsPendingCheckpoint(t *testing.T) {
	log := &stateLog{}
	model := scriptedmodel.New(resumeScript)
	hs := httptest.NewServer(model)
	t.Cleanup(hs.Close)
	cfg, r := baseConfig(t, hs.URL+"/internal/v1")
	ctx, cancel := context.WithCancel(context.Background())
	r.tools.answers["read_file"] = func(map[string]any) (string, bool) {
		cancel() // the sandbox is told to stop while the call runs
		return "exit code -1: terminated", true
	}
	cfg.Checkpoint = log.record
	out, err := agent.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	states := log.all()
	if out.Reason != agent.ReasonCancelled || len(states) != 1 || states[0].Pending == nil || states[0].Pending.Name != "read_file" {
		t.Fatalf("cancelled loop: %s, checkpoints %+v; want one, read_file pending", out.Reason, states)
	}
}

func TestResumeRefusesABadState(t *testing.T) {
	for name, s := range map[string]agent.State{
		"empty":      {},
		"no system":  {Messages: []agent.Message{{Role: "user", Content: "x"}, {Role: "user", Content: "y"}}},
		"bad role":   {Messages: []agent.Message{{Role: "system"}, {Role: "user"}, {Role: "wizard"}}},
		"stray tool": {Messages: []agent.Message{{Role: "system"}, {Role: "user"}, {Role: "tool", ToolCallID: "x"}}},
		"no call id": {Messages: []agent.Message{{Role: "system"}, {Role: "user"}, {Role: "assistant", ToolCalls: []agent.ToolCall{{Name: "x"}}}}},
		"negative":   {Messages: []agent.Message{{Role: "system"}, {Role: "user"}}, Steps: -1},
		"answer twice": {Messages: []agent.Message{{Role: "system"}, {Role: "user"}, {Role: "assistant", ToolCalls: []agent.ToolCall{{ID: "a", Name: "x"}}},
			{Role: "tool", ToolCallID: "a"}, {Role: "tool", ToolCallID: "a"}}},
	} {
		cfg, _ := baseConfig(t, "http://127.0.0.1:1/internal/v1")
		cfg.Resume = &s
		if _, err := agent.Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: Run resumed from a state it cannot continue", name)
		}
	}
}

func mustJSON(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
