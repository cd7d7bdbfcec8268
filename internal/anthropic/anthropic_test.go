package anthropic_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/upstream"
)

// Anthropic's API cannot run here: these tests talk to a loopback
// httptest server that checks each request as the Messages API would
// (path, version header, credential) and answers what the test scripts.

const keyCanary = "sk-ant-canary-0f1e2d3c4b5a69788796a5b4c3d2e1f0"

// bodyCanary is planted in the server's error bodies: no error the
// provider returns may repeat it.
const bodyCanary = "ANTHROPIC-BODY-CANARY"

const answerJSON = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-x",` +
	`"content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"toolu_01","name":"read_file","input":{"path":"calc.py"}}],` +
	`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":7}}`

const chatJSON = `{"model":"claude-x","messages":[{"role":"user","content":"Fix it."}],"max_completion_tokens":4096,` +
	`"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]}`

// fakeAPI is the loopback stand-in for the Messages API.
type fakeAPI struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	headers []http.Header
	bodies  []string
	respond atomic.Pointer[http.HandlerFunc]
}

func newFakeAPI(tb testing.TB) *fakeAPI {
	tb.Helper()
	f := &fakeAPI{}
	f.setResponse(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answerJSON)
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.bodies = append(f.bodies, string(body))
		f.mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" || r.Header.Get("Anthropic-Version") == "" {
			http.Error(w, "not a Messages call", http.StatusNotFound)
			return
		}
		(*f.respond.Load())(w, r)
	}))
	tb.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) setResponse(h http.HandlerFunc) { f.respond.Store(&h) }

func (f *fakeAPI) seen() ([]http.Header, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.headers...), append([]string(nil), f.bodies...)
}

func newProvider(tb testing.TB, f *fakeAPI, key func(context.Context) (string, error), unauthorized *atomic.Int64) *anthropic.Provider {
	tb.Helper()
	p, err := anthropic.New(anthropic.Config{
		BaseURL: f.srv.URL, AllowLoopbackHTTP: true, Key: key,
		OnUnauthorized: func() { unauthorized.Add(1) },
		Now:            func() time.Time { return created },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func staticKey(context.Context) (string, error) { return keyCanary, nil }

func TestProviderSendsOnceWithTheKeyUpstreamOnly(t *testing.T) {
	f := newFakeAPI(t)
	var unauthorized atomic.Int64
	p := newProvider(t, f, staticKey, &unauthorized)
	answer, err := p.Complete(context.Background(), upstream.Call{Body: []byte(chatJSON)})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content   string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(answer, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("answer %s: %v", answer, err)
	}
	ch := c.Choices[0]
	if ch.FinishReason != "tool_calls" || ch.Message.Content != "Reading." || len(ch.Message.ToolCalls) != 1 ||
		ch.Message.ToolCalls[0].ID != "toolu_01" || ch.Message.ToolCalls[0].Function.Arguments != `{"path":"calc.py"}` ||
		c.Usage.PromptTokens != 11 || c.Usage.CompletionTokens != 7 {
		t.Errorf("answer %s", answer)
	}
	headers, bodies := f.seen()
	if len(headers) != 1 {
		t.Fatalf("%d calls, want 1", len(headers))
	}
	h := headers[0]
	if h.Get("Authorization") != "Bearer "+keyCanary && h.Get("X-Api-Key") != keyCanary {
		t.Errorf("the key did not reach the API: Authorization %q", h.Get("Authorization"))
	}
	if strings.Contains(bodies[0], keyCanary) {
		t.Error("the key is in the request body")
	}
	if strings.Contains(string(answer), keyCanary) {
		t.Error("the key is in the answer")
	}
}

// TestProviderIgnoresTheEnvironment: ANTHROPIC_* variables of the process
// (another key, another base URL, extra headers) change nothing.
func TestProviderIgnoresTheEnvironment(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-environment")
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "token-from-the-environment")
	t.Setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Leak: yes")
	f := newFakeAPI(t)
	var unauthorized atomic.Int64
	p := newProvider(t, f, staticKey, &unauthorized)
	if _, err := p.Complete(context.Background(), upstream.Call{Body: []byte(chatJSON)}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	headers, _ := f.seen()
	if len(headers) != 1 {
		t.Fatalf("%d calls reached the configured URL, want 1", len(headers))
	}
	all, _ := json.Marshal(headers[0])
	if strings.Contains(string(all), "environment") || headers[0].Get("X-Leak") != "" {
		t.Errorf("the environment leaked into the request: %s", all)
	}
}

// TestProviderErrors maps each way the API can fail to the proxy's error,
// after exactly one call (never a retry that would spend a request twice),
// and proves no error repeats the API's body or the key.
func TestProviderErrors(t *testing.T) {
	errorBody := func(status int, typ string, header map[string]string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for k, v := range header {
				w.Header().Set(k, v)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Request-Id", "req_42")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"`+typ+`","message":"`+bodyCanary+` `+r.Header.Get("Authorization")+`"}}`)
		}
	}
	tests := []struct {
		name         string
		respond      http.HandlerFunc
		limit        int64
		timeout      time.Duration
		kind         upstream.ErrorKind
		status       int
		inMsg        string
		unauthorized int64
	}{
		{"bad request", errorBody(400, "invalid_request_error", nil), 0, 0, upstream.ErrStatus, 400, "HTTP 400", 0},
		{"key refused", errorBody(401, "authentication_error", nil), 0, 0, upstream.ErrStatus, 401, "refused the key (HTTP 401)", 1},
		{"forbidden", errorBody(403, "permission_error", nil), 0, 0, upstream.ErrStatus, 403, "HTTP 403", 0},
		{"rate limited, asking for a retry", errorBody(429, "rate_limit_error", map[string]string{"Retry-After": "0", "X-Should-Retry": "true"}), 0, 0, upstream.ErrStatus, 429, "HTTP 429", 0},
		{"server error", errorBody(500, "api_error", nil), 0, 0, upstream.ErrStatus, 500, "HTTP 500", 0},
		{"overloaded", errorBody(529, "overloaded_error", map[string]string{"X-Should-Retry": "true"}), 0, 0, upstream.ErrStatus, 529, "HTTP 529", 0},
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/steal", http.StatusTemporaryRedirect)
		}, 0, 0, upstream.ErrStatus, 307, "HTTP 307", 0},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `<html>`+bodyCanary+`</html>`)
		}, 0, 0, upstream.ErrMalformed, 200, "not a JSON object", 0},
		{"tool input not an object", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"m","type":"message","content":[{"type":"tool_use","id":"t","name":"f","input":["`+bodyCanary+`"]}],"stop_reason":"tool_use"}`)
		}, 0, 0, upstream.ErrMalformed, 200, "could not be read", 0},
		{"too large", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"m","type":"message","content":[{"type":"text","text":"`+strings.Repeat("x", 70<<10)+bodyCanary+`"}]}`)
		}, 64 << 10, 0, upstream.ErrTooLarge, 200, "larger than 65536 bytes", 0},
		{"no answer in time", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			0, 200 * time.Millisecond, upstream.ErrUnreachable, 0, "could not reach", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.setResponse(tt.respond)
			var unauthorized atomic.Int64
			p := newProvider(t, f, staticKey, &unauthorized)
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			_, err := p.Complete(ctx, upstream.Call{Body: []byte(chatJSON), MaxResponseBytes: tt.limit})
			var ue *upstream.Error
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want an *upstream.Error", err)
			}
			if ue.Kind != tt.kind || ue.Status != tt.status || !strings.Contains(ue.Message, tt.inMsg) {
				t.Errorf("error kind %d status %d %q; want kind %d status %d, saying %q", ue.Kind, ue.Status, ue.Message, tt.kind, tt.status, tt.inMsg)
			}
			if n := f.calls.Load(); n != 1 {
				t.Errorf("the API was called %d times, want exactly 1 (no retries)", n)
			}
			if n := unauthorized.Load(); n != tt.unauthorized {
				t.Errorf("OnUnauthorized called %d times, want %d", n, tt.unauthorized)
			}
			if strings.Contains(err.Error(), bodyCanary) || strings.Contains(err.Error(), keyCanary) {
				t.Errorf("the error repeats the API's body or the key: %v", err)
			}
		})
	}
}

func TestProviderKeyUnavailable(t *testing.T) {
	f := newFakeAPI(t)
	var unauthorized atomic.Int64
	p := newProvider(t, f, func(context.Context) (string, error) { return "", errors.New("secret fetch failed") }, &unauthorized)
	_, err := p.Complete(context.Background(), upstream.Call{Body: []byte(chatJSON)})
	var ue *upstream.Error
	if !errors.As(err, &ue) || ue.Kind != upstream.ErrKeyUnavailable || ue.Message != "the model provider key is unavailable" {
		t.Fatalf("err = %v, want ErrKeyUnavailable", err)
	}
	if f.calls.Load() != 0 {
		t.Error("the API was called without a key")
	}
}

// TestProviderRefusesBeforeCalling: a request the Messages API cannot be
// told is refused without a call.
func TestProviderRefusesBeforeCalling(t *testing.T) {
	f := newFakeAPI(t)
	var unauthorized atomic.Int64
	p := newProvider(t, f, staticKey, &unauthorized)
	_, err := p.Complete(context.Background(), upstream.Call{Body: []byte(
		`{"model":"claude-x","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x"}}]}],"max_tokens":5}`)})
	var ue *upstream.Error
	if !errors.As(err, &ue) || ue.Kind != upstream.ErrInvalid {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	if f.calls.Load() != 0 {
		t.Error("the API was called with a request it cannot be told")
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"http://api.example.com", "https://user:pw@api.example.com", "https://api.example.com?x=1", "ftp://x"} {
		if _, err := anthropic.New(anthropic.Config{BaseURL: u, Key: staticKey}); err == nil {
			t.Errorf("New accepted %q", u)
		}
	}
	if _, err := anthropic.New(anthropic.Config{BaseURL: "http://127.0.0.1:1", Key: staticKey}); err == nil {
		t.Error("New accepted plain http to loopback without AllowLoopbackHTTP")
	}
	if _, err := anthropic.New(anthropic.Config{}); err == nil {
		t.Error("New accepted no key source")
	}
}
