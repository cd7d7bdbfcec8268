package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	upstreampkg "github.com/belay-dev/belay/internal/upstream"
)

func TestProxyForwards(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider})
		id, toks := h.startRun(t, "", 5)
		a := h.chat(t, toks.Model, chatBody)
		if a.status != 200 {
			t.Fatalf("chat: %d %s", a.status, a.body)
		}
		if a.header.Get("Content-Type") != "application/json" {
			t.Errorf("answer Content-Type %q", a.header.Get("Content-Type"))
		}
		checkCompletion(t, provider, a.body)
		h.up.checkCredential(t, h.key)
		h.up.checkForwarded(t)

		run, err := h.store.GetRun(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Usage.ModelRequests != 1 || run.Usage.PromptTokens != 11 || run.Usage.CompletionTokens != 7 {
			t.Errorf("usage %+v, want 1 request, 11+7 tokens", run.Usage)
		}
		c, err := h.store.GetCapability(context.Background(), id)
		if err != nil || c.UsedRequests != 1 {
			t.Errorf("capability %+v, %v: want 1 used", c, err)
		}

		events := h.allEvents(t, id)
		var req, resp map[string]any
		for _, e := range events {
			switch e.Type {
			case belay.EventModelRequest:
				_ = json.Unmarshal(e.Data, &req)
			case belay.EventModelResponse:
				_ = json.Unmarshal(e.Data, &resp)
			}
		}
		if req["messages"] != float64(2) || req["tools"] != float64(1) || req["maxTokens"] != float64(4096) {
			t.Errorf("model.request %v", req)
		}
		if resp["finishReason"] != "tool_calls" || len(resp["toolCalls"].([]any)) != 1 || resp["toolCalls"].([]any)[0] != "read_file" {
			t.Errorf("model.response %v", resp)
		}
		for _, e := range events {
			if strings.Contains(string(e.Data), fileCanary) || strings.Contains(string(e.Data), "You are an agent") {
				t.Errorf("event %s carries the prompt: %s", e.Type, e.Data)
			}
		}
		if strings.Contains(h.logs.String(), fileCanary) {
			t.Error("the log carries the prompt")
		}
	})
}

func TestProxyRewritesBody(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	_, toks := h.startRun(t, "", 10)
	for _, tc := range []struct {
		name  string
		body  string
		check func(map[string]any) bool
	}{
		{"model absent takes the token's", `{"messages":[{"role":"user","content":"hi"}]}`,
			func(m map[string]any) bool {
				return m["model"] == testModel && m["max_completion_tokens"] == float64(4096)
			}},
		{"small max_completion_tokens kept", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":50}`,
			func(m map[string]any) bool {
				_, has := m["max_tokens"]
				return m["max_completion_tokens"] == float64(50) && !has
			}},
		{"stream_options dropped", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"n":1}`,
			func(m map[string]any) bool { _, has := m["stream_options"]; return !has && m["stream"] == false }},
		{"duplicate model key canonicalised", `{"model":"evil","model":"test-model-1","messages":[{"role":"user","content":"hi"}]}`,
			func(m map[string]any) bool { return m["model"] == testModel }},
	} {
		if a := h.chat(t, toks.Model, tc.body); a.status != 200 {
			t.Errorf("%s: %d %s", tc.name, a.status, a.body)
			continue
		}
		if m := h.up.lastBody(t); !tc.check(m) {
			t.Errorf("%s: forwarded %v", tc.name, m)
		}
	}
}

func TestProxyRefusesBadBodiesBeforeSpending(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider})
		id, toks := h.startRun(t, "", 5)
		for _, tc := range []struct {
			name string
			body string
			want int
			code belay.Code
		}{
			{"unknown key", `{"messages":[{"role":"user","content":"hi"}],"store":true}`, 400, belay.CodeInvalid},
			{"other model", `{"model":"gpt-expensive","messages":[{"role":"user","content":"hi"}]}`, 400, belay.CodeInvalid},
			{"n 2", `{"messages":[{"role":"user","content":"hi"}],"n":2}`, 400, belay.CodeInvalid},
			{"no messages", `{"model":"test-model-1"}`, 400, belay.CodeInvalid},
			{"messages not objects", `{"messages":["hi"]}`, 400, belay.CodeInvalid},
			{"max_tokens zero", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400, belay.CodeInvalid},
			{"max_tokens string", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":"9"}`, 400, belay.CodeInvalid},
			{"stream string", `{"messages":[{"role":"user","content":"hi"}],"stream":"yes"}`, 400, belay.CodeInvalid},
			{"array body", `[{"role":"user"}]`, 400, belay.CodeInvalid},
			{"trailing data", `{"messages":[{"role":"user","content":"hi"}]} {}`, 400, belay.CodeInvalid},
			{"oversize", `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`, 413, belay.CodeTooLarge},
		} {
			a := h.chat(t, toks.Model, tc.body)
			if a.status != tc.want || a.errorCode(t) != tc.code {
				t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, clipBody(a.body), tc.want, tc.code)
			}
		}
		if n := h.up.calls.Load(); n != 0 {
			t.Errorf("refused bodies reached the upstream %d times", n)
		}
		if c, err := h.store.GetCapability(context.Background(), id); err != nil || c.UsedRequests != 0 {
			t.Errorf("capability %+v, %v: refused bodies spent budget", c, err)
		}
	})
}

func TestProxyRefusesBadTokensWithoutCallingUpstream(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider})
		id, toks := h.startRun(t, "", 5)
		ended, endedToks := h.startRun(t, "", 5)
		h.finishRun(t, ended)
		if err := h.store.RevokeCapability(context.Background(), ended); err != nil {
			t.Fatal(err)
		}
		notStarted := h.createRun(t, "")

		forger, err := token.NewSigner([]byte(strings.Repeat("f", 40)), h.clock.Now)
		if err != nil {
			t.Fatal(err)
		}
		forged, _ := forger.Issue(token.AudienceModel, id, testModel, time.Hour)
		otherModel, _ := h.signer.Issue(token.AudienceModel, id, "gpt-other", time.Hour)
		shortLived, _ := h.signer.Issue(token.AudienceModel, id, testModel, time.Second)
		noCapability, _ := h.signer.Issue(token.AudienceModel, notStarted, testModel, time.Hour)
		tampered := toks.Model[:len(toks.Model)-2] + "AA"
		h.clock.Advance(2 * time.Second) // shortLived is now expired

		for _, tc := range []struct{ name, tok string }{
			{"missing", ""},
			{"garbage", "not-a-token"},
			{"forged", forged},
			{"tampered", tampered},
			{"expired", shortLived},
			{"wrong audience (events)", toks.Events},
			{"wrong audience (approvals)", toks.Approvals},
			{"wrong model", otherModel},
			{"wrong run: revoked", endedToks.Model},
			{"wrong run: no capability", noCapability},
		} {
			a := h.chat(t, tc.tok, chatBody)
			if a.status != 401 || a.errorCode(t) != belay.CodeInactiveRunToken {
				t.Errorf("%s: %d %s, want 401 inactive_run_token", tc.name, a.status, a.body)
			}
		}
		if n := h.up.calls.Load(); n != 0 {
			t.Errorf("refused tokens reached the upstream %d times", n)
		}
		// The capability's own expiry ends the run's calls too.
		h.clock.Advance(time.Hour)
		fresh, _ := h.signer.Issue(token.AudienceModel, id, testModel, time.Hour)
		if a := h.chat(t, fresh, chatBody); a.status != 401 || a.errorCode(t) != belay.CodeInactiveRunToken {
			t.Errorf("expired capability: %d %s", a.status, a.body)
		}
		if n := h.up.calls.Load(); n != 0 {
			t.Errorf("upstream called %d times", n)
		}
		for _, tok := range []string{toks.Model, forged, tampered, noCapability} {
			if strings.Contains(h.logs.String(), tok) {
				t.Error("a run token appears in the log")
			}
		}
	})
}

func TestProxyBudgetUnderConcurrency(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider})
		id, toks := h.startRun(t, "", 50)
		const callers = 60
		statuses := make(chan answer, callers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Go(func() {
				<-start
				statuses <- h.chat(t, toks.Model, chatBody)
			})
		}
		close(start)
		wg.Wait()
		close(statuses)
		counts := map[int]int{}
		for a := range statuses {
			counts[a.status]++
			if a.status == 429 && a.errorCode(t) != belay.CodeBudgetExhausted {
				t.Errorf("429 with code %q", a.errorCode(t))
			}
		}
		if counts[200] != 50 || counts[429] != 10 || len(counts) != 2 {
			t.Errorf("answers %v, want 50×200 and 10×429", counts)
		}
		if n := h.up.calls.Load(); n != 50 {
			t.Errorf("upstream called %d times, want exactly 50", n)
		}
		events := h.allEvents(t, id)
		if n := countType(events, belay.EventBudgetExhausted); n != 1 {
			t.Errorf("%d budget.exhausted events, want 1", n)
		}
		if n := countType(events, belay.EventModelRequest); n != 50 {
			t.Errorf("%d model.request events, want 50", n)
		}
		run, err := h.store.GetRun(context.Background(), id)
		if err != nil || run.Usage.ModelRequests != 50 || run.Usage.PromptTokens != 50*11 {
			t.Errorf("usage %+v, %v", run.Usage, err)
		}
	})
}

func TestProxyUpstreamFailures(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider, timeout: 200 * time.Millisecond, maxResp: 64 << 10})
		id, toks := h.startRun(t, "", 100)
		for _, tc := range []struct {
			name    string
			respond http.HandlerFunc
			inMsg   string
		}{
			{"server error", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
				_, _ = io.WriteString(w, `{"error":"boom UPSTREAM-BODY-CANARY"}`)
			}, "HTTP 500"},
			{"bad request echoing the key", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(400)
				_, _ = io.WriteString(w, `{"error":"bad key `+r.Header.Get("Authorization")+` UPSTREAM-BODY-CANARY"}`)
			}, "HTTP 400"},
			{"unauthorized", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(401)
				_, _ = io.WriteString(w, `{"error":"UPSTREAM-BODY-CANARY"}`)
			}, "HTTP 401"},
			{"redirect", func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://127.0.0.1:1/steal", http.StatusTemporaryRedirect)
			}, "HTTP 307"},
			{"not JSON", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, `<html>UPSTREAM-BODY-CANARY</html>`)
			}, "not a JSON object"},
			{"too large", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, `{"pad":"`+strings.Repeat("x", 70<<10)+`"}`)
			}, "larger than"},
			{"timeout", func(w http.ResponseWriter, r *http.Request) {
				<-r.Context().Done()
			}, "did not answer within"},
		} {
			h.up.setResponse(tc.respond)
			a := h.chat(t, toks.Model, chatBody)
			if a.status != 502 || a.errorCode(t) != belay.CodeUpstream {
				t.Errorf("%s: %d %s, want 502 upstream_error", tc.name, a.status, a.body)
				continue
			}
			if !strings.Contains(string(a.body), tc.inMsg) {
				t.Errorf("%s: message %s does not say %q", tc.name, a.body, tc.inMsg)
			}
			if strings.Contains(string(a.body), "UPSTREAM-BODY-CANARY") || strings.Contains(string(a.body), h.key) {
				t.Errorf("%s: answer repeats the upstream's body: %s", tc.name, a.body)
			}
		}
		// A 401 drops the cached key; Bedrock has no key to drop.
		if n, want := h.unauthorized.Load(), int64(1); provider != upstreampkg.KindBedrock && n != want {
			t.Errorf("OnUnauthorized called %d times, want %d", n, want)
		}
		run, err := h.store.GetRun(context.Background(), id)
		if err != nil || run.Usage.ModelRequests != 7 {
			t.Errorf("usage %+v, %v: every paid call counts", run.Usage, err)
		}
		if n := countType(h.allEvents(t, id), belay.EventModelResponse); n != 7 {
			t.Errorf("%d model.response events, want 7", n)
		}
		if strings.Contains(h.logs.String(), "UPSTREAM-BODY-CANARY") {
			t.Error("the log repeats the upstream's body")
		}
	})
}

func TestProxyKeySourceFailure(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider, keyErr: errors.New("secret fetch failed")})
		_, toks := h.startRun(t, "", 5)
		a := h.chat(t, toks.Model, chatBody)
		if a.status != 503 || a.errorCode(t) != belay.CodeUnavailable {
			t.Errorf("%d %s, want 503 unavailable", a.status, a.body)
		}
		if h.up.calls.Load() != 0 {
			t.Error("called the upstream without a key")
		}
		if strings.Contains(string(a.body), "secret fetch failed") {
			t.Errorf("answer leaks the key source's error: %s", a.body)
		}
	})
}

// TestProviderKeyNeverLeaks drives every proxy path and then looks for the
// canary provider key everywhere but the upstream: answers, events, logs.
func TestProviderKeyNeverLeaks(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider, timeout: 200 * time.Millisecond})
		id, toks := h.startRun(t, "", 5)
		h.chat(t, toks.Model, chatBody)
		h.up.setResponse(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(403)
			_, _ = io.WriteString(w, `{"error":"`+r.Header.Get("Authorization")+`"}`)
		})
		h.chat(t, toks.Model, chatBody)
		h.up.setResponse(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		h.chat(t, toks.Model, chatBody)
		h.chat(t, toks.Model, `{"messages":[{"role":"user","content":"`+h.key+`"}],"store":true}`)
		h.chat(t, toks.Events, chatBody)
		for range 3 {
			h.chat(t, toks.Model, chatBody)
		}
		h.public(t, "GET", "/v1/runs/"+id, "")
		h.public(t, "GET", "/v1/runs/"+id+"/events", "")

		if n := h.up.calls.Load(); n < 3 {
			t.Fatalf("upstream called %d times; the test did not exercise forwarding", n)
		}
		h.up.checkCredential(t, h.key)
		where := map[string]string{
			"answers": h.transcriptString(),
			"logs":    h.logs.String(),
		}
		raw, _ := json.Marshal(h.allEvents(t, id))
		where["events"] = string(raw)
		for name, text := range where {
			if text == "" {
				t.Errorf("%s are empty; the test checks nothing there", name)
			}
			if strings.Contains(text, h.key) {
				t.Errorf("the provider key appears in %s", name)
			}
			for _, tok := range []string{toks.Model, toks.Events, toks.Approvals, h.controlToken} {
				if strings.Contains(text, tok) {
					t.Errorf("a token appears in %s", name)
				}
			}
		}
	})
}

// TestCloseEndsDetachedModelCalls shows that a paid model call whose caller
// hung up still ends when the server closes, and that Close waits for it,
// so nothing writes to a store after the server's owner closed it.
func TestCloseEndsDetachedModelCalls(t *testing.T) {
	forEachProvider(t, func(t *testing.T, provider string) {
		h := newHarness(t, harnessOptions{provider: provider, timeout: time.Hour})
		id, toks := h.startRun(t, "", 10)
		reached := make(chan struct{})
		h.up.setResponse(func(w http.ResponseWriter, r *http.Request) {
			close(reached)
			<-r.Context().Done()
		})

		ctx, hangUp := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/internal/v1/chat/completions", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+toks.Model)
		callDone := make(chan struct{})
		go func() {
			defer close(callDone)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		}()
		<-reached
		hangUp() // the sandbox is gone; the paid call goes on upstream
		<-callDone

		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.api.Close(closeCtx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		// Close returned only after the detached call finished: its usage and
		// its model.response are already stored.
		run, err := h.store.GetRun(context.Background(), id)
		if err != nil || run.Usage.ModelRequests != 1 {
			t.Errorf("usage %+v, %v: the paid call was not recorded before Close returned", run.Usage, err)
		}
		if n := countType(h.allEvents(t, id), belay.EventModelResponse); n != 1 {
			t.Errorf("%d model.response events before Close returned, want 1", n)
		}
		// A closed server takes no new work.
		if a := h.chat(t, toks.Model, chatBody); a.status != http.StatusServiceUnavailable || a.errorCode(t) != belay.CodeUnavailable {
			t.Errorf("after Close: %d %s, want 503 unavailable", a.status, a.body)
		}
	})
}

// checkCompletion asserts the answer the sandbox got: the upstream's own
// JSON from the OpenAI-compatible provider, and from the translating ones
// the same call (read_file, its id and arguments, usage 11+7) as a
// chat.completion.
func checkCompletion(tb testing.TB, provider string, body []byte) {
	tb.Helper()
	if provider == upstreampkg.KindOpenAI {
		if string(body) != completion {
			tb.Errorf("answer %s, want the upstream's JSON", body)
		}
		return
	}
	var c struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Role      string  `json:"role"`
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 || len(c.Choices[0].Message.ToolCalls) != 1 {
		tb.Fatalf("answer %s: %v", body, err)
	}
	m := c.Choices[0].Message
	tc := m.ToolCalls[0]
	if c.Object != "chat.completion" || c.Model != testModel || c.Choices[0].FinishReason != "tool_calls" || m.Role != "assistant" ||
		m.Content != nil || tc.ID != "call_1" || tc.Type != "function" || tc.Function.Name != "read_file" ||
		tc.Function.Arguments != `{"path":"calc.py"}` || c.Usage.PromptTokens != 11 || c.Usage.CompletionTokens != 7 {
		tb.Errorf("answer %s, want the chat.completion of the upstream's read_file call", body)
	}
}

// TestProxyRefusesWhatTheProviderCannotBeTold: a request the Messages or
// Converse API cannot express is answered 400 invalid, naming the field,
// without an upstream call. The translation runs in the forward step,
// after the budget is spent, so the refusal is counted as a request (the
// agent never sends such a body; see the README's limits).
func TestProxyRefusesWhatTheProviderCannotBeTold(t *testing.T) {
	for _, provider := range []string{upstreampkg.KindAnthropic, upstreampkg.KindBedrock} {
		t.Run(provider, func(t *testing.T) {
			h := newHarness(t, harnessOptions{provider: provider})
			id, toks := h.startRun(t, "", 5)
			a := h.chat(t, toks.Model, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`)
			if a.status != 400 || a.errorCode(t) != belay.CodeInvalid || !strings.Contains(string(a.body), "messages[0].content[0].type") {
				t.Errorf("%d %s, want 400 invalid naming messages[0].content[0].type", a.status, a.body)
			}
			if n := h.up.calls.Load(); n != 0 {
				t.Errorf("the upstream was called %d times", n)
			}
			run, err := h.store.GetRun(context.Background(), id)
			if err != nil || run.Usage.ModelRequests != 1 {
				t.Errorf("usage %+v, %v: the refused call was paid for, and is counted", run.Usage, err)
			}
		})
	}
}
