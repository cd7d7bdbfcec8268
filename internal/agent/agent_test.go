package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// canary is the model token in every test. It must reach the model server
// as the bearer and nowhere else.
const canary = "bt1.CANARY-model-token-7f3a9c.c2lnbmF0dXJl"

const testModel = "gpt-test-model"

// recordingTools is a test double of the agent's own Tools port: it records
// each call and answers from a table. The real tools are tested in
// internal/sandbox.
type recordingTools struct {
	mu      sync.Mutex
	calls   []toolCall
	answers map[string]func(args map[string]any) (string, bool)
}

type toolCall struct {
	Name string
	Args string
}

func newTools() *recordingTools {
	return &recordingTools{answers: map[string]func(map[string]any) (string, bool){
		"read_file": func(a map[string]any) (string, bool) {
			return fmt.Sprintf("contents of %v: def add(a, b): return a - b", a["path"]), false
		},
		"edit_file": func(a map[string]any) (string, bool) {
			if a["path"] != "calc.py" {
				return fmt.Sprintf("%v is outside the allowed paths", a["path"]), true
			}
			return "edited calc.py", false
		},
		"list_files": func(map[string]any) (string, bool) { return "calc.py\ntests/test_calc.py", false },
	}}
}

func (t *recordingTools) Definitions() []agent.ToolDef {
	path := map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}}
	return []agent.ToolDef{
		{Name: "read_file", Description: "Read a file.", Parameters: path},
		{Name: "edit_file", Description: "Replace old with new in a file."},
		{Name: "list_files", Description: "List files under a path.", Parameters: path},
	}
}

func (t *recordingTools) Call(_ context.Context, name string, args json.RawMessage) (string, bool) {
	t.mu.Lock()
	t.calls = append(t.calls, toolCall{Name: name, Args: string(args)})
	answer := t.answers[name]
	t.mu.Unlock()
	if answer == nil {
		return "unknown tool " + name, true
	}
	var a map[string]any
	if err := json.Unmarshal(args, &a); err != nil {
		return "bad arguments", true
	}
	return answer(a)
}

func (t *recordingTools) Calls() []toolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]toolCall(nil), t.calls...)
}

type event struct {
	Type string
	Data map[string]any
	Raw  string
}

type recordingSink struct {
	mu     sync.Mutex
	events []event
}

func (s *recordingSink) Emit(typ string, data any) {
	b, err := json.Marshal(data)
	if err != nil {
		panic(fmt.Sprintf("event %s data does not encode: %v", typ, err))
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	s.mu.Lock()
	s.events = append(s.events, event{Type: typ, Data: m, Raw: string(b)})
	s.mu.Unlock()
}

func (s *recordingSink) Events() []event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]event(nil), s.events...)
}

// run is one agent run against a scripted model over loopback HTTP, and
// everything it left behind.
type run struct {
	out        agent.Outcome
	model      *scriptedmodel.Server
	tools      *recordingTools
	sink       *recordingSink
	transcript *bytes.Buffer
	logs       *bytes.Buffer
}

// loadScript loads one of the scripted model's test scripts.
func loadScript(tb testing.TB, name string) scriptedmodel.Script {
	tb.Helper()
	s, err := scriptedmodel.LoadScript(filepath.Join("..", "scriptedmodel", "testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func baseConfig(tb testing.TB, baseURL string) (agent.Config, *run) {
	tb.Helper()
	r := &run{tools: newTools(), sink: &recordingSink{}, transcript: &bytes.Buffer{}, logs: &bytes.Buffer{}}
	logger := slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("run_id", "run-test")
	return agent.Config{
		BaseURL:     baseURL,
		Token:       canary,
		Model:       testModel,
		Instruction: "Fix add() in calc.py so that tests pass.",
		MaxSteps:    10,
		Tools:       r.tools,
		Events:      r.sink,
		Transcript:  r.transcript,
		Logger:      logger,
	}, r
}

func runScript(tb testing.TB, script scriptedmodel.Script, configure func(*agent.Config), opts ...scriptedmodel.Option) *run {
	tb.Helper()
	model := scriptedmodel.New(script, opts...)
	hs := httptest.NewServer(model)
	tb.Cleanup(hs.Close)
	cfg, r := baseConfig(tb, hs.URL+"/internal/v1")
	r.model = model
	if configure != nil {
		configure(&cfg)
	}
	out, err := agent.Run(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("Run: %v", err)
	}
	r.out = out
	return r
}

type transcriptLine struct {
	Role       string `json:"role"`
	Step       int    `json:"step"`
	Content    string `json:"content"`
	ToolCallID string `json:"toolCallId"`
	Name       string `json:"name"`
	IsError    bool   `json:"isError"`
	ToolCalls  []struct {
		ID, Name, Arguments string
	} `json:"toolCalls"`
	Outcome *agent.Outcome `json:"outcome"`
}

func transcriptLines(tb testing.TB, b *bytes.Buffer) []transcriptLine {
	tb.Helper()
	var lines []transcriptLine
	sc := bufio.NewScanner(bytes.NewReader(b.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l transcriptLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			tb.Fatalf("transcript line is not JSON: %v: %s", err, sc.Bytes())
		}
		lines = append(lines, l)
	}
	return lines
}

func roles(lines []transcriptLine) string {
	var rs []string
	for _, l := range lines {
		rs = append(rs, l.Role)
	}
	return strings.Join(rs, ",")
}

func eventTypes(evs []event) string {
	var ts []string
	for _, e := range evs {
		ts = append(ts, e.Type+":"+fmt.Sprint(e.Data["name"]))
	}
	return strings.Join(ts, ",")
}

func TestThreeStepScriptFinishes(t *testing.T) {
	r := runScript(t, loadScript(t, "three-steps.json"), nil)

	want := agent.Outcome{Finished: true, Summary: "Fixed add() in calc.py to add.", Steps: 3, Reason: agent.ReasonFinished}
	if r.out.Finished != want.Finished || r.out.Summary != want.Summary || r.out.Steps != want.Steps || r.out.Reason != want.Reason {
		t.Errorf("outcome = %+v, want %+v", r.out, want)
	}
	calls := r.tools.Calls()
	if fmt.Sprint(calls) != `[{read_file {"path":"calc.py"}} {edit_file {"path":"calc.py","old":"return a - b","new":"return a + b"}}]` {
		t.Errorf("tool calls = %v", calls)
	}

	// What reached the model: three requests, each with the bearer, the
	// model and the tools; the tool results flowed back.
	reqs := r.model.Requests()
	if len(reqs) != 3 {
		t.Fatalf("model saw %d requests, want 3", len(reqs))
	}
	var prompt, completion int64
	for i, req := range reqs {
		if req.Path != "/internal/v1/chat/completions" || req.Authorization != "Bearer "+canary || req.Model != testModel {
			t.Errorf("request %d: path %q, authorization %q, model %q", i, req.Path, req.Authorization, req.Model)
		}
		if strings.Join(req.Tools, ",") != "read_file,edit_file,list_files,finish" {
			t.Errorf("request %d offered tools %v", i, req.Tools)
		}
		if req.Step != i {
			t.Errorf("request %d answered step %d", i, req.Step)
		}
		prompt += req.PromptTokens
		completion += req.CompletionTokens
	}
	if m := reqs[0].Messages; len(m) != 2 || m[0].Role != "system" || !strings.Contains(m[0].Content, "call finish") || m[1].Content != "Fix add() in calc.py so that tests pass." {
		t.Errorf("first request messages = %+v", m)
	}
	toolMsg := func(req scriptedmodel.Request, id string) string {
		for _, m := range req.Messages {
			if m.Role == "tool" && m.ToolCallID == id {
				return m.Content
			}
		}
		return "<none>"
	}
	if got := toolMsg(reqs[1], "call_0_0"); got != "contents of calc.py: def add(a, b): return a - b" {
		t.Errorf("second request carried read_file result %q", got)
	}
	if got := toolMsg(reqs[2], "call_1_0"); got != "edited calc.py" {
		t.Errorf("third request carried edit_file result %q", got)
	}

	wantUsage := belay.BundleUsage{ModelRequests: 3, PromptTokens: prompt, CompletionTokens: completion}
	if r.out.Usage != wantUsage || prompt == 0 {
		t.Errorf("usage = %+v, want %+v (summed from the model's answers)", r.out.Usage, wantUsage)
	}

	if got := eventTypes(r.sink.Events()); got != "tool.call:read_file,tool.result:read_file,agent.message:<nil>,tool.call:edit_file,tool.result:edit_file,agent.message:<nil>,tool.call:finish,tool.result:finish" {
		t.Errorf("events = %s", got)
	}
	lines := transcriptLines(t, r.transcript)
	if got := roles(lines); got != "system,user,assistant,tool,assistant,tool,assistant,tool,outcome" {
		t.Errorf("transcript roles = %s", got)
	}
	if last := lines[len(lines)-1].Outcome; last == nil || *last != r.out {
		t.Errorf("transcript outcome = %+v, want %+v", last, r.out)
	}
	if l := lines[4]; l.Content != "The subtraction should be an addition." || len(l.ToolCalls) != 1 || l.ToolCalls[0].Name != "edit_file" {
		t.Errorf("second assistant line = %+v", l)
	}
	if !strings.Contains(r.logs.String(), "run_id=run-test") {
		t.Error("log lines do not carry run_id")
	}
}

func TestMaxStepsStopsAtExactlyMaxSteps(t *testing.T) {
	script := scriptedmodel.Script{Name: "endless"}
	for range 30 {
		script.Steps = append(script.Steps, scriptedmodel.Step{ToolCalls: []scriptedmodel.ToolCall{
			{Name: "list_files", Arguments: json.RawMessage(`{"path":"."}`)},
		}})
	}
	for _, maxSteps := range []int{1, 2, 7} {
		t.Run(fmt.Sprint(maxSteps), func(t *testing.T) {
			r := runScript(t, script, func(c *agent.Config) { c.MaxSteps = maxSteps })
			if r.out.Reason != agent.ReasonMaxSteps || r.out.Finished || r.out.Steps != maxSteps {
				t.Errorf("outcome = %+v, want max_steps after %d steps", r.out, maxSteps)
			}
			if r.model.Calls() != maxSteps || r.out.Usage.ModelRequests != maxSteps {
				t.Errorf("model calls = %d (counted %d), want %d", r.model.Calls(), r.out.Usage.ModelRequests, maxSteps)
			}
			if len(r.tools.Calls()) != maxSteps {
				t.Errorf("tool calls = %d, want %d", len(r.tools.Calls()), maxSteps)
			}
		})
	}
}

func TestModelFailures(t *testing.T) {
	readStep := scriptedmodel.Step{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: json.RawMessage(`{"path":"calc.py"}`)}}}
	tests := []struct {
		name       string
		steps      []scriptedmodel.Step
		wantReason string
		wantSteps  int
		wantCalls  int
		wantError  string
	}{
		{"budget exhausted", []scriptedmodel.Step{{Status: 429, ErrorCode: "model_request_budget_exhausted"}},
			agent.ReasonBudgetExhausted, 1, 1, "429"},
		{"budget exhausted after a step", []scriptedmodel.Step{readStep, {Status: 429, ErrorCode: "model_request_budget_exhausted"}},
			agent.ReasonBudgetExhausted, 2, 2, "429"},
		{"other 429 is not the budget", []scriptedmodel.Step{{Status: 429, ErrorCode: "rate_limit_exceeded"}},
			agent.ReasonModelError, 1, 1, "rate_limit_exceeded"},
		{"inactive run token", []scriptedmodel.Step{{Status: 401, ErrorCode: "inactive_run_token"}},
			agent.ReasonRunInactive, 1, 1, "401"},
		{"upstream 500 is not retried", []scriptedmodel.Step{{Status: 500}},
			agent.ReasonModelError, 1, 1, "500"},
		{"upstream 502", []scriptedmodel.Step{readStep, {Status: 502, ErrorCode: "upstream_error"}},
			agent.ReasonModelError, 2, 2, "upstream_error"},
		{"malformed JSON", []scriptedmodel.Step{{Raw: `{"id": "chatcmpl-1", "choices": [`}},
			agent.ReasonModelError, 1, 1, "json"},
		{"no choices", []scriptedmodel.Step{{Raw: `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[]}`}},
			agent.ReasonModelError, 1, 1, "no choices"},
		{"not JSON at all", []scriptedmodel.Step{{Raw: `<html>bad gateway</html>`, Status: 502}},
			agent.ReasonModelError, 1, 1, "502"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runScript(t, scriptedmodel.Script{Name: tt.name, Steps: tt.steps}, nil)
			if r.out.Reason != tt.wantReason || r.out.Steps != tt.wantSteps || r.out.Finished {
				t.Errorf("outcome = %+v, want %s after %d steps", r.out, tt.wantReason, tt.wantSteps)
			}
			if r.model.Calls() != tt.wantCalls || r.out.Usage.ModelRequests != tt.wantCalls {
				t.Errorf("model calls = %d (counted %d), want %d: a refused call must not be retried", r.model.Calls(), r.out.Usage.ModelRequests, tt.wantCalls)
			}
			lines := transcriptLines(t, r.transcript)
			errLine := lines[len(lines)-2]
			if errLine.Role != "error" || !strings.Contains(errLine.Content, tt.wantError) {
				t.Errorf("transcript error line = %+v, want it to mention %q", errLine, tt.wantError)
			}
			if lines[len(lines)-1].Outcome.Reason != tt.wantReason {
				t.Errorf("transcript outcome = %+v", lines[len(lines)-1].Outcome)
			}
		})
	}
}

// TestTokenAppearsOnlyAsTheBearer runs a script whose model and tools both
// echo the token (as if it had leaked to them): the model server must see
// it as the bearer only, and the transcript, events and logs never.
func TestTokenAppearsOnlyAsTheBearer(t *testing.T) {
	args, _ := json.Marshal(map[string]string{"path": canary})
	summary, _ := json.Marshal(map[string]string{"summary": "done; token was " + canary})
	script := scriptedmodel.Script{Name: "leaky", Steps: []scriptedmodel.Step{
		{Content: "I found " + canary, ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: args}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: summary}}},
	}}
	r := runScript(t, script, nil)
	if r.out.Reason != agent.ReasonFinished {
		t.Fatalf("outcome = %+v", r.out)
	}
	for i, req := range r.model.Requests() {
		if req.Authorization != "Bearer "+canary {
			t.Errorf("request %d authorization = %q, want the token as bearer", i, req.Authorization)
		}
		for _, m := range req.Messages {
			if m.Role == "tool" && strings.Contains(m.Content, canary) {
				t.Errorf("request %d: a tool result carried the token back to the model", i)
			}
		}
	}
	if calls := r.tools.Calls(); len(calls) != 1 || !strings.Contains(calls[0].Args, canary) {
		t.Fatalf("tool calls = %v; the test needs the tool to see the token to echo it", calls)
	}
	if strings.Contains(r.out.Summary, canary) || !strings.Contains(r.out.Summary, "[redacted]") {
		t.Errorf("summary = %q", r.out.Summary)
	}
	for _, e := range r.sink.Events() {
		if strings.Contains(e.Raw, canary) {
			t.Errorf("event %s carries the token: %s", e.Type, e.Raw)
		}
	}
	if strings.Contains(r.transcript.String(), canary) {
		t.Error("the transcript carries the token")
	}
	if !strings.Contains(r.transcript.String(), "[redacted]") {
		t.Error("the transcript shows no redaction, so the test did not exercise it")
	}
	if strings.Contains(r.logs.String(), canary) {
		t.Error("the logs carry the token")
	}
}

func TestNudgedOnceToFinish(t *testing.T) {
	tests := []struct {
		name        string
		steps       []scriptedmodel.Step
		wantSummary string
		wantReason  string
		wantSteps   int
	}{
		{"finish after the nudge", []scriptedmodel.Step{
			{Content: "I believe calc.py is fine."},
			{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: json.RawMessage(`{"summary":"No change needed."}`)}}},
		}, "No change needed.", agent.ReasonFinished, 2},
		{"text again after the nudge is the final answer", []scriptedmodel.Step{
			{Content: "I believe calc.py is fine."},
			{Content: "Really, nothing to change."},
		}, "Really, nothing to change.", agent.ReasonFinished, 2},
		{"empty again after the nudge", []scriptedmodel.Step{{}, {}}, "", agent.ReasonModelError, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runScript(t, scriptedmodel.Script{Name: "chatty", Steps: tt.steps}, nil)
			if r.out.Summary != tt.wantSummary || r.out.Reason != tt.wantReason || r.out.Steps != tt.wantSteps {
				t.Errorf("outcome = %+v, want %q, %s, %d steps", r.out, tt.wantSummary, tt.wantReason, tt.wantSteps)
			}
			reqs := r.model.Requests()
			if len(reqs) != 2 {
				t.Fatalf("model calls = %d, want 2", len(reqs))
			}
			last := reqs[1].Messages[len(reqs[1].Messages)-1]
			if last.Role != "user" || !strings.Contains(last.Content, "call finish") {
				t.Errorf("second request ends with %+v, want the nudge", last)
			}
		})
	}
}

func TestBadToolCallsAreResultsTheModelReads(t *testing.T) {
	// A raw reply carries what the script format cannot: arguments that are
	// not JSON.
	badArgs := `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls",` +
		`"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_bad","type":"function","function":{"name":"read_file","arguments":"{path: calc.py"}}]}}],` +
		`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	script := scriptedmodel.Script{Name: "clumsy", Steps: []scriptedmodel.Step{
		{Raw: badArgs},
		{ToolCalls: []scriptedmodel.ToolCall{
			{Name: "edit_file", Arguments: json.RawMessage(`{"path":"setup.py","old":"a","new":"b"}`)},
			{Name: "delete_everything"},
			{Name: "finish", Arguments: json.RawMessage(`{"note":"no summary"}`)},
		}},
		{ToolCalls: []scriptedmodel.ToolCall{
			{Name: "finish", Arguments: json.RawMessage(`{"summary":"Gave up on setup.py."}`)},
			{Name: "read_file", Arguments: json.RawMessage(`{"path":"after-finish.py"}`)},
		}},
	}}
	r := runScript(t, script, nil)
	if !r.out.Finished || r.out.Summary != "Gave up on setup.py." || r.out.Steps != 3 {
		t.Fatalf("outcome = %+v", r.out)
	}
	if got := fmt.Sprint(r.tools.Calls()); got != `[{edit_file {"path":"setup.py","old":"a","new":"b"}} {delete_everything {}}]` {
		t.Errorf("tool calls = %s (bad JSON, finish and calls after finish must not reach Tools)", got)
	}
	reqs := r.model.Requests()
	results := map[string]string{}
	for _, m := range reqs[2].Messages {
		if m.Role == "tool" {
			results[m.ToolCallID] = m.Content
		}
	}
	for id, want := range map[string]string{
		"call_bad": "error: the arguments are not valid JSON",
		"call_1_0": "error: setup.py is outside the allowed paths",
		"call_1_1": "error: unknown tool delete_everything",
		"call_1_2": `error: finish needs {"summary"`,
	} {
		if !strings.HasPrefix(results[id], want) {
			t.Errorf("result of %s = %q, want it to start with %q", id, results[id], want)
		}
	}
	var resultEvents []string
	for _, e := range r.sink.Events() {
		if e.Type == belay.EventToolResult {
			resultEvents = append(resultEvents, fmt.Sprintf("%v:%v", e.Data["name"], e.Data["isError"]))
		}
	}
	if got := strings.Join(resultEvents, ","); got != "read_file:true,edit_file:true,delete_everything:true,finish:true,finish:false" {
		t.Errorf("tool.result events = %s", got)
	}
	if !strings.Contains(r.transcript.String(), "not run: finish was called first") {
		t.Error("the transcript does not show the call skipped after finish")
	}
}

func TestEventsAreBounded(t *testing.T) {
	big := strings.Repeat("é", 5000) // 10,000 bytes, two per rune
	args, _ := json.Marshal(map[string]string{"path": "calc.py", "old": "a", "new": big})
	script := scriptedmodel.Script{Name: "big", Steps: []scriptedmodel.Step{
		{Content: big, ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: args}, {Name: "read_file", Arguments: json.RawMessage(`{"path":"huge.txt"}`)}}},
	}}
	huge := strings.Repeat("x", 100<<10)
	r := runScript(t, script, func(c *agent.Config) {
		c.MaxSteps = 2
		tools := newTools()
		tools.answers["read_file"] = func(map[string]any) (string, bool) { return huge, false }
		c.Tools = tools
	})
	for _, e := range r.sink.Events() {
		for _, field := range []string{"arguments", "result", "text"} {
			s, ok := e.Data[field].(string)
			if !ok {
				continue
			}
			if len(s) > agent.MaxEventTextBytes {
				t.Errorf("%s.%s is %d bytes, over %d", e.Type, field, len(s), agent.MaxEventTextBytes)
			}
			if !utf8.ValidString(s) {
				t.Errorf("%s.%s was cut mid-rune", e.Type, field)
			}
		}
	}
	var sawBigResult bool
	for _, e := range r.sink.Events() {
		if e.Type == belay.EventToolResult && e.Data["name"] == "read_file" {
			sawBigResult = true
			if e.Data["resultBytes"] != float64(100<<10) || e.Data["resultTruncated"] != true {
				t.Errorf("read_file result event = %.200s", e.Raw)
			}
		}
		if e.Type == belay.EventToolCall && e.Data["name"] == "edit_file" &&
			(e.Data["argumentsTruncated"] != true || !strings.HasPrefix(string(args), e.Data["arguments"].(string))) {
			t.Errorf("edit_file call event = %.200s, want a truncated prefix of the arguments", e.Raw)
		}
		if e.Type == belay.EventAgentMessage && (e.Data["truncated"] != true || !strings.HasPrefix(big, e.Data["text"].(string))) {
			t.Errorf("agent.message event = %.200s, want a truncated prefix of the text", e.Raw)
		}
	}
	if !sawBigResult {
		t.Fatal("no read_file result event")
	}
	// The model gets up to MaxToolResultBytes of the result and a note.
	for _, m := range r.model.Requests()[1].Messages {
		if m.ToolCallID == "call_0_1" {
			if len(m.Content) > agent.MaxToolResultBytes+100 || !strings.Contains(m.Content, "[truncated: 65536 of 102400 bytes shown]") {
				t.Errorf("model saw a %d-byte result ending %q", len(m.Content), m.Content[len(m.Content)-60:])
			}
		}
	}
}

// TestLongSummaryFitsTheBundle gives a summary far over the result
// bundle's cap: the outcome keeps its start and says it was cut, all within
// belay.MaxSummaryBytes, so the note is not lost when the sandbox applies
// the bundle's cap.
func TestLongSummaryFitsTheBundle(t *testing.T) {
	long := strings.Repeat("é", belay.MaxSummaryBytes) // twice the cap, two bytes a rune
	finishArgs, err := json.Marshal(map[string]string{"summary": long})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		steps []scriptedmodel.Step
	}{
		{"finish", []scriptedmodel.Step{{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: finishArgs}}}}},
		{"text after the nudge", []scriptedmodel.Step{{Content: "thinking"}, {Content: long}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runScript(t, scriptedmodel.Script{Name: "long-summary", Steps: tt.steps}, nil)
			got := r.out.Summary
			if r.out.Reason != agent.ReasonFinished || len(got) > belay.MaxSummaryBytes {
				t.Fatalf("outcome %s with a %d-byte summary; want finished within %d bytes", r.out.Reason, len(got), belay.MaxSummaryBytes)
			}
			body, note, ok := strings.Cut(got, "\n[truncated: ")
			if !ok || !strings.HasSuffix(note, fmt.Sprintf(" of %d bytes shown]", len(long))) {
				t.Errorf("summary ends %q; want the truncation note", got[max(0, len(got)-80):])
			}
			if !strings.HasPrefix(long, body) || len(body) < belay.MaxSummaryBytes/2 || !utf8.ValidString(body) {
				t.Errorf("summary keeps %d bytes (valid UTF-8 %v); want most of the cap, a prefix of what the model said", len(body), utf8.ValidString(body))
			}
		})
	}
}

func TestCancelStopsTheLoopMidCall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	script := scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "list_files", Arguments: json.RawMessage(`{"path":"."}`)}}},
		{DelayMs: 3_600_000, Content: "never sent"},
	}}
	model := scriptedmodel.New(script, scriptedmodel.WithRequestHook(func(req scriptedmodel.Request) {
		if req.Step == 1 {
			cancel() // the second call is in flight, the model "thinking" for an hour
		}
	}))
	hs := httptest.NewServer(model)
	defer hs.Close()
	cfg, r := baseConfig(t, hs.URL+"/internal/v1")
	out, err := agent.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if out.Reason != agent.ReasonCancelled || out.Steps != 2 || out.Finished {
		t.Errorf("outcome = %+v, want cancelled at step 2", out)
	}
	if model.Calls() != 2 {
		t.Errorf("model calls = %d, want 2", model.Calls())
	}
	if lines := transcriptLines(t, r.transcript); lines[len(lines)-1].Outcome.Reason != agent.ReasonCancelled {
		t.Errorf("transcript ends with %+v", lines[len(lines)-1])
	}
}

func TestCancelledBeforeTheFirstCall(t *testing.T) {
	model := scriptedmodel.New(loadScript(t, "three-steps.json"))
	hs := httptest.NewServer(model)
	defer hs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg, _ := baseConfig(t, hs.URL+"/internal/v1")
	out, err := agent.Run(ctx, cfg)
	if err != nil || out.Reason != agent.ReasonCancelled || out.Steps != 0 || model.Calls() != 0 {
		t.Errorf("Run = %+v, %v; model calls %d", out, err, model.Calls())
	}
}

// dropListener closes the first drop connections it accepts before any
// byte is read, as a proxy restarting would.
type dropListener struct {
	net.Listener
	mu   sync.Mutex
	drop int
}

func (l *dropListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		drop := l.drop > 0
		if drop {
			l.drop--
		}
		l.mu.Unlock()
		if !drop {
			return c, nil
		}
		c.Close()
	}
}

func TestConnectionFailureIsRetriedOnce(t *testing.T) {
	tests := []struct {
		name       string
		drop       int
		wantReason string
		wantTries  int
		wantCalls  int
	}{
		{"one dropped connection", 1, agent.ReasonFinished, 4, 3},
		{"two dropped connections", 2, agent.ReasonModelError, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			model := scriptedmodel.New(loadScript(t, "three-steps.json"))
			hs := httptest.NewUnstartedServer(model)
			hs.Listener = &dropListener{Listener: hs.Listener, drop: tt.drop}
			hs.Start()
			defer hs.Close()
			cfg, _ := baseConfig(t, hs.URL+"/internal/v1")
			out, err := agent.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if out.Reason != tt.wantReason || out.Usage.ModelRequests != tt.wantTries || model.Calls() != tt.wantCalls {
				t.Errorf("outcome %+v, model calls %d; want %s after %d tries, %d reaching the model", out, model.Calls(), tt.wantReason, tt.wantTries, tt.wantCalls)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*agent.Config)
		wantField string
	}{
		{"no base URL", func(c *agent.Config) { c.BaseURL = "" }, "BaseURL"},
		{"base URL not http", func(c *agent.Config) { c.BaseURL = "unix:///tmp/api.sock" }, "BaseURL"},
		{"no model", func(c *agent.Config) { c.Model = "" }, "Model"},
		{"no instruction", func(c *agent.Config) { c.Instruction = "" }, "Instruction"},
		{"zero steps", func(c *agent.Config) { c.MaxSteps = 0 }, "MaxSteps"},
		{"no tools", func(c *agent.Config) { c.Tools = nil }, "Tools"},
	}
	model := scriptedmodel.New(loadScript(t, "three-steps.json"))
	hs := httptest.NewServer(model)
	defer hs.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _ := baseConfig(t, hs.URL+"/internal/v1")
			tt.mutate(&cfg)
			_, err := agent.Run(context.Background(), cfg)
			if belay.ErrorCode(err) != belay.CodeInvalid || !strings.HasPrefix(err.Error(), tt.wantField+":") {
				t.Errorf("err = %v, want invalid %s", err, tt.wantField)
			}
		})
	}
	if model.Calls() != 0 {
		t.Errorf("a bad config reached the model %d times", model.Calls())
	}
}

// sandboxTools offers the sandbox's full tool list, finish included, to
// check what the system prompt tells the model about them.
type sandboxTools struct{ *recordingTools }

func (sandboxTools) Definitions() []agent.ToolDef {
	return []agent.ToolDef{
		{Name: "read_file", Description: "Read a file."},
		{Name: "run_check", Description: "Run one of the run's checks."},
		{Name: "shell", Description: "Run a shell command, after approval."},
		{Name: "finish", Description: "the sandbox's own finish text"},
	}
}

func TestSystemPromptExplainsToolsAndRules(t *testing.T) {
	r := runScript(t, loadScript(t, "three-steps.json"), func(c *agent.Config) {
		c.Tools = sandboxTools{newTools()}
		c.MaxSteps = 5
	})
	req := r.model.Requests()[0]
	if strings.Join(req.Tools, ",") != "read_file,run_check,shell,finish" {
		t.Errorf("offered tools %v, want finish once", req.Tools)
	}
	system := req.Messages[0].Content
	for _, want := range []string{
		"- read_file: Read a file.",
		"- run_check: Run one of the run's checks.",
		"outside the allowed paths",
		"shell needs approval",
		"run_check runs one of the run's checks",
		"at most 5 model turns",
		"call finish with a short summary",
	} {
		if !strings.Contains(system, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, system)
		}
	}
	if strings.Contains(system, "the sandbox's own finish text") {
		t.Error("the loop's finish definition should replace the one from Tools")
	}
}

// BenchmarkThreeStepRun measures one whole three-step run over loopback
// HTTP: the loop's own cost plus the SDK's encoding and the scripted
// server's answers.
func BenchmarkThreeStepRun(b *testing.B) {
	model := scriptedmodel.New(loadScript(b, "three-steps.json"))
	hs := httptest.NewServer(model)
	defer hs.Close()
	for b.Loop() {
		cfg, _ := baseConfig(b, hs.URL+"/internal/v1")
		out, err := agent.Run(context.Background(), cfg)
		if err != nil || out.Reason != agent.ReasonFinished {
			b.Fatalf("Run = %+v, %v", out, err)
		}
	}
}
