package scriptedmodel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/belay-dev/belay/internal/scriptedmodel"
)

var fixedNow = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func loadScript(tb testing.TB, name string) scriptedmodel.Script {
	tb.Helper()
	s, err := scriptedmodel.LoadScript(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func startServer(tb testing.TB, script scriptedmodel.Script, opts ...scriptedmodel.Option) (*scriptedmodel.Server, *httptest.Server) {
	tb.Helper()
	srv := scriptedmodel.New(script, append([]scriptedmodel.Option{scriptedmodel.WithClock(func() time.Time { return fixedNow })}, opts...)...)
	hs := httptest.NewServer(srv)
	tb.Cleanup(hs.Close)
	return srv, hs
}

// conversation builds a request body whose messages hold n assistant turns,
// each followed by its tool result.
func conversation(tb testing.TB, model string, n int) []byte {
	tb.Helper()
	msgs := []map[string]any{
		{"role": "system", "content": "You are a scripted test."},
		{"role": "user", "content": "Fix calc.py."},
	}
	for i := range n {
		id := fmt.Sprintf("call_%d_0", i)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": id, "type": "function", "function": map[string]any{"name": "read_file", "arguments": `{"path":"calc.py"}`},
			}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": "def add(a, b): return a - b"},
		)
	}
	body, err := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 512})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(tb testing.TB, url string, body []byte, header map[string]string) reply {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return reply{status: res.StatusCode, header: res.Header, body: b}
}

func decodeCompletion(tb testing.TB, body []byte) openai.ChatCompletion {
	tb.Helper()
	var c openai.ChatCompletion
	if err := json.Unmarshal(body, &c); err != nil {
		tb.Fatalf("reply does not decode as openai.ChatCompletion: %v\n%s", err, body)
	}
	return c
}

func TestStepIsAssistantMessageCount(t *testing.T) {
	_, hs := startServer(t, loadScript(t, "three-steps.json"))
	tests := []struct {
		assistants   int
		wantTool     string
		wantContent  string
		wantArgument string
	}{
		{0, "read_file", "", `{"path":"calc.py"}`},
		{1, "edit_file", "The subtraction should be an addition.", `{"path":"calc.py","old":"return a - b","new":"return a + b"}`},
		{2, "finish", "Done.", `{"summary":"Fixed add() in calc.py to add."}`},
		{3, "finish", "", `{"summary":"The scripted session \"three-steps\" has no more steps."}`},
		{7, "finish", "", `{"summary":"The scripted session \"three-steps\" has no more steps."}`},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("assistants=%d", tt.assistants), func(t *testing.T) {
			r := post(t, hs.URL+"/v1/chat/completions", conversation(t, "gpt-test", tt.assistants), nil)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			c := decodeCompletion(t, r.body)
			msg := c.Choices[0].Message
			if msg.Content != tt.wantContent {
				t.Errorf("content = %q, want %q", msg.Content, tt.wantContent)
			}
			if len(msg.ToolCalls) != 1 {
				t.Fatalf("tool calls = %d, want 1", len(msg.ToolCalls))
			}
			tc := msg.ToolCalls[0]
			if want := fmt.Sprintf("call_%d_0", tt.assistants); tc.ID != want {
				t.Errorf("tool call id = %q, want %q", tc.ID, want)
			}
			if tc.Function.Name != tt.wantTool || tc.Function.Arguments != tt.wantArgument {
				t.Errorf("tool call = %s(%s), want %s(%s)", tc.Function.Name, tc.Function.Arguments, tt.wantTool, tt.wantArgument)
			}
			if c.Choices[0].FinishReason != "tool_calls" {
				t.Errorf("finish_reason = %q, want tool_calls", c.Choices[0].FinishReason)
			}
		})
	}
}

// TestReplyThroughOpenAISDK reads the reply with the official SDK's client,
// the way the agent does, and checks every field the agent relies on.
func TestReplyThroughOpenAISDK(t *testing.T) {
	script := scriptedmodel.Script{Name: "sdk", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{
			{Name: "list_files", Arguments: json.RawMessage(`{"path": "."}`)},
			{Name: "search", Arguments: json.RawMessage(`{"pattern": "def add", "path": "."}`)},
		}},
		{Content: "All done, no tools needed."},
	}}
	srv, hs := startServer(t, script)
	client := openai.NewChatCompletionService(
		option.WithBaseURL(hs.URL+"/internal/v1"),
		option.WithAPIKey("sdk-test-key"),
		option.WithMaxRetries(0),
	)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-test-model",
		MaxTokens: openai.Int(1024),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		Tools: []openai.ChatCompletionToolUnionParam{
			openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "list_files"}),
			openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "search"}),
		},
	}
	c, err := client.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.ID, "chatcmpl-scripted-") || c.Object != "chat.completion" || c.Model != "gpt-test-model" {
		t.Errorf("id, object, model = %q, %q, %q", c.ID, c.Object, c.Model)
	}
	if c.Created != fixedNow.Unix() {
		t.Errorf("created = %d, want %d", c.Created, fixedNow.Unix())
	}
	if len(c.Choices) != 1 {
		t.Fatalf("choices = %d, want 1", len(c.Choices))
	}
	got := c.Choices[0].Message
	if got.JSON.Content.Valid() {
		t.Errorf("content = %q, want null beside tool calls", got.Content)
	}
	if len(got.ToolCalls) != 2 {
		t.Fatalf("tool calls = %d, want 2", len(got.ToolCalls))
	}
	for i, want := range []struct{ id, name, args string }{
		{"call_0_0", "list_files", `{"path":"."}`},
		{"call_0_1", "search", `{"pattern":"def add","path":"."}`},
	} {
		tc := got.ToolCalls[i]
		fn := tc.AsFunction()
		if tc.ID != want.id || tc.Type != "function" || fn.Function.Name != want.name || fn.Function.Arguments != want.args {
			t.Errorf("tool call %d = %s %s %s(%s), want %s function %s(%s)", i, tc.ID, tc.Type, fn.Function.Name, fn.Function.Arguments, want.id, want.name, want.args)
		}
	}
	if !c.Usage.JSON.PromptTokens.Valid() || c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens || c.Usage.CompletionTokens < 1 {
		t.Errorf("usage = %+v", c.Usage)
	}

	// The second step: text only, so finish_reason stop.
	params.Messages = append(params.Messages, got.ToParam(),
		openai.ToolMessage("calc.py", "call_0_0"), openai.ToolMessage("calc.py:1", "call_0_1"))
	c, err = client.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Choices[0].Message.Content != "All done, no tools needed." || len(c.Choices[0].Message.ToolCalls) != 0 || c.Choices[0].FinishReason != "stop" {
		t.Errorf("second reply = %q, %d tool calls, finish %q", c.Choices[0].Message.Content, len(c.Choices[0].Message.ToolCalls), c.Choices[0].FinishReason)
	}

	reqs := srv.Requests()
	if len(reqs) != 2 || srv.Calls() != 2 {
		t.Fatalf("recorded %d requests, Calls() = %d, want 2", len(reqs), srv.Calls())
	}
	first, second := reqs[0], reqs[1]
	if first.Path != "/internal/v1/chat/completions" || first.Authorization != "Bearer sdk-test-key" || srv.Authorization() != "Bearer sdk-test-key" {
		t.Errorf("path %q, authorization %q / %q", first.Path, first.Authorization, srv.Authorization())
	}
	if first.Model != "gpt-test-model" || first.MaxTokens != 1024 || strings.Join(first.Tools, ",") != "list_files,search" {
		t.Errorf("model %q, max tokens %d, tools %v", first.Model, first.MaxTokens, first.Tools)
	}
	if second.Step != 1 || len(second.Messages) != 4 {
		t.Fatalf("second request: step %d, %d messages", second.Step, len(second.Messages))
	}
	if m := second.Messages[3]; m.Role != "tool" || m.ToolCallID != "call_0_1" || m.Content != "calc.py:1" {
		t.Errorf("tool message recorded as %+v", m)
	}
	if m := second.Messages[1]; m.Role != "assistant" || len(m.ToolCalls) != 2 || m.ToolCalls[1].Name != "search" {
		t.Errorf("assistant message recorded as %+v", m)
	}
}

func TestUsageIsDeterministic(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "three-steps.json"))
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`)
	a := post(t, hs.URL+"/chat/completions", body, nil)
	b := post(t, hs.URL+"/chat/completions", body, nil)
	if a.status != http.StatusOK || !bytes.Equal(a.body, b.body) {
		t.Fatalf("two equal requests answered differently:\n%s\n%s", a.body, b.body)
	}
	u := decodeCompletion(t, a.body).Usage
	// Prompt: "user" + "abcdefgh" = 12 bytes = 3 tokens. Completion:
	// "read_file" + `{"path":"calc.py"}` = 9 + 18 bytes = 7 tokens.
	if u.PromptTokens != 3 || u.CompletionTokens != 7 || u.TotalTokens != 10 {
		t.Errorf("usage = %d + %d = %d, want 3 + 7 = 10", u.PromptTokens, u.CompletionTokens, u.TotalTokens)
	}
	if r := srv.Requests()[0]; r.PromptTokens != 3 || r.CompletionTokens != 7 {
		t.Errorf("recorded usage %d + %d, want 3 + 7", r.PromptTokens, r.CompletionTokens)
	}
	longer := post(t, hs.URL+"/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"abcdefgh abcdefgh"}]}`), nil)
	if decodeCompletion(t, longer.body).Usage.PromptTokens <= u.PromptTokens {
		t.Error("a longer prompt did not count more prompt tokens")
	}
}

func TestConcurrentRunsShareOneServer(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "three-steps.json"))
	const n = 24
	wantTool := []string{"read_file", "edit_file", "finish", "finish"}
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = conversation(t, fmt.Sprintf("model-%d", i), i%len(wantTool))
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			step := i % len(wantTool)
			body := bodies[i]
			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", fmt.Sprintf("Bearer run-%d", i))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer res.Body.Close()
			var c openai.ChatCompletion
			if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
				return
			}
			if got := c.Choices[0].Message.ToolCalls[0].Function.Name; got != wantTool[step] || c.Model != fmt.Sprintf("model-%d", i) {
				errs <- fmt.Errorf("request %d (step %d): got %s for %s, want %s", i, step, got, c.Model, wantTool[step])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if srv.Calls() != n {
		t.Errorf("Calls() = %d, want %d", srv.Calls(), n)
	}
	seen := map[string]bool{}
	for _, r := range srv.Requests() {
		seen[r.Authorization] = true
		var i int
		if _, err := fmt.Sscanf(r.Model, "model-%d", &i); err != nil || r.Step != i%len(wantTool) || r.Authorization != fmt.Sprintf("Bearer run-%d", i) {
			t.Errorf("record mixed up: model %q, step %d, authorization %q", r.Model, r.Step, r.Authorization)
		}
	}
	if len(seen) != n {
		t.Errorf("recorded %d distinct authorizations, want %d", len(seen), n)
	}
}

func TestScriptedFailures(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "failures.json"))
	url := hs.URL + "/internal/v1/chat/completions"

	r := post(t, url, conversation(t, "m", 1), nil)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("step 1: status %d, want 429", r.status)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code != "model_request_budget_exhausted" {
		t.Errorf("step 1 body = %s (err %v)", r.body, err)
	}

	r = post(t, url, conversation(t, "m", 2), nil)
	if r.status != http.StatusOK || string(r.body) != `{"id": "truncated` {
		t.Errorf("raw step answered %d %q", r.status, r.body)
	}
	if json.Valid(r.body) {
		t.Error("the raw step was meant to be malformed JSON")
	}
	var statuses []int
	for _, rec := range srv.Requests() {
		statuses = append(statuses, rec.Status)
	}
	if fmt.Sprint(statuses) != "[429 200]" {
		t.Errorf("recorded statuses %v, want [429 200]", statuses)
	}
}

// TestDelayEndsWhenClientLeaves cancels the client while the server waits
// out a long scripted delay: the handler must return at once, or the test
// server's Close would block for the whole delay.
func TestDelayEndsWhenClientLeaves(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	script := scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{{DelayMs: int(time.Hour / time.Millisecond), Content: "late"}}}
	srv := scriptedmodel.New(script, scriptedmodel.WithRequestHook(func(scriptedmodel.Request) { cancel() }))
	hs := httptest.NewServer(srv)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/chat/completions", bytes.NewReader(conversation(t, "m", 0)))
	_, err := http.DefaultClient.Do(req)
	if err == nil {
		t.Fatal("the request succeeded despite the cancelled client")
	}
	hs.Close() // waits for the handler
	if srv.Calls() != 1 {
		t.Errorf("Calls() = %d, want 1", srv.Calls())
	}
}

func TestRejectsWhatIsNotAChatCompletion(t *testing.T) {
	srv, hs := startServer(t, loadScript(t, "three-steps.json"))
	tests := []struct {
		name, method, path, body string
		want                     int
	}{
		{"wrong path", http.MethodPost, "/v1/completions", `{}`, http.StatusNotFound},
		{"GET", http.MethodGet, "/v1/chat/completions", ``, http.StatusMethodNotAllowed},
		{"not JSON", http.MethodPost, "/v1/chat/completions", `model=m`, http.StatusBadRequest},
		{"no model", http.MethodPost, "/v1/chat/completions", `{"messages":[]}`, http.StatusBadRequest},
		{"no messages", http.MethodPost, "/v1/chat/completions", `{"model":"m"}`, http.StatusBadRequest},
		{"stream", http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[],"stream":true}`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, hs.URL+tt.path, strings.NewReader(tt.body))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.NewDecoder(res.Body).Decode(&e); err != nil || e.Error.Code == "" {
				t.Errorf("error body does not decode: %v", err)
			}
			if res.StatusCode != tt.want {
				t.Errorf("status = %d, want %d", res.StatusCode, tt.want)
			}
		})
	}
	// The chat-completions POSTs are recorded, answered or not.
	if srv.Calls() != 4 {
		t.Errorf("Calls() = %d, want 4", srv.Calls())
	}
}

func TestLoadScript(t *testing.T) {
	s := loadScript(t, "three-steps.json")
	if s.Name != "three-steps" || len(s.Steps) != 3 || s.Steps[2].ToolCalls[0].Name != "finish" {
		t.Errorf("loaded %+v", s)
	}
	tests := []struct{ file, wantErr string }{
		{"bad-unknown-key.json", `unknown field "tool_calls"`},
		{"bad-arguments.json", "steps[0].toolCalls[0].arguments"},
		{"bad-status.json", "steps[0].status"},
		{"bad-no-name.json", "steps[0].toolCalls[0].name"},
		{"bad-mixed.json", "steps[0]: a status or raw step"},
		{"missing.json", "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			_, err := scriptedmodel.LoadScript(filepath.Join("testdata", tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := scriptedmodel.New(loadScript(t, "three-steps.json"))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	r := post(t, "http://"+ln.Addr().String()+"/v1/chat/completions", conversation(t, "m", 0), map[string]string{"Authorization": "Bearer served"})
	if r.status != http.StatusOK || srv.Authorization() != "Bearer served" {
		t.Errorf("status %d, authorization %q", r.status, srv.Authorization())
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve after close = %v, want nil", err)
	}
}

// FuzzServeHTTP feeds arbitrary bodies: the server must answer 200 with a
// completion or 400 with an error, always as JSON, and never panic.
func FuzzServeHTTP(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","content":[{"type":"text","text":"x"}]}],"max_tokens":5}`))
	f.Add([]byte(`{"model":"m","messages":null}`))
	f.Add([]byte(`[]`))
	script := scriptedmodel.Script{Name: "fuzz", Steps: []scriptedmodel.Step{
		{Content: "hello", ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: json.RawMessage(`{"path":"a"}`)}}},
	}}
	f.Fuzz(func(t *testing.T, body []byte) {
		srv := scriptedmodel.New(script) // fresh, so records do not pile up
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
		if w.Code != http.StatusOK && w.Code != http.StatusBadRequest {
			t.Fatalf("status %d for %q", w.Code, body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("answer is not JSON: %q", w.Body.Bytes())
		}
	})
}
