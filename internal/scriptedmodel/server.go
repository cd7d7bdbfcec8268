package scriptedmodel

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// MaxRequestBytes caps a request body. It is well above what belay's model
// proxy forwards, so the cap only stops a runaway client.
const MaxRequestBytes = 16 << 20

// Server answers chat-completions requests from a Script. It is an
// http.Handler for POST on any path ending in "/chat/completions", safe for
// concurrent use.
type Server struct {
	script    Script
	now       func() time.Time
	onRequest func(Request)

	mu       sync.Mutex
	requests []Request
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the clock behind each reply's "created" field (default
// time.Now), for byte-for-byte reproducible replies.
func WithClock(now func() time.Time) Option {
	return func(s *Server) { s.now = now }
}

// WithRequestHook calls hook with each request's record as soon as it is
// recorded, before any scripted delay, so a test can act at the moment a
// request is in flight (for example cancel its client) without sleeping.
// The hook runs on the request's goroutine and must not block for long.
func WithRequestHook(hook func(Request)) Option {
	return func(s *Server) { s.onRequest = hook }
}

// New returns a server answering from script. The script is used as given;
// LoadScript and ParseScript validate one read from a file.
func New(script Script, opts ...Option) *Server {
	s := &Server{script: script, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Request is what the server recorded of one chat-completions request: what
// reached the "provider", and how the server answered.
type Request struct {
	// Step is the script step answered (the number of assistant messages in
	// the request), or -1 when the body could not be read as a request.
	Step          int
	Path          string
	Authorization string
	Model         string
	// MaxTokens is max_tokens, or max_completion_tokens when only that is
	// set; 0 when neither is.
	MaxTokens int64
	// Tools are the names of the function tools offered.
	Tools    []string
	Messages []Message
	// Status is the HTTP status answered.
	Status int
	// PromptTokens and CompletionTokens are the usage the reply reported
	// (0 for an error or raw reply).
	PromptTokens     int64
	CompletionTokens int64
}

// Message is one request message, its content flattened to text.
type Message struct {
	Role       string
	Content    string
	ToolCallID string
	ToolCalls  []MessageToolCall
}

// MessageToolCall is a function call in an assistant message of a request.
type MessageToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// Requests returns a copy of every recorded request, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	copy(out, s.requests)
	return out
}

// Calls returns how many chat-completions requests the server has received,
// answered or not.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// Authorization returns the Authorization header of the most recent request
// ("" before any), so a test can assert which credential reached the
// provider. Requests has every request's header.
func (s *Server) Authorization() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		return ""
	}
	return s.requests[len(s.requests)-1].Authorization
}

// Serve answers requests on ln until ln is closed. It returns nil when the
// listener was closed, and the accept error otherwise.
func (s *Server) Serve(ln net.Listener) error {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	err := srv.Serve(ln)
	if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("scripted model: serve: %w", err)
}

// ServeHTTP answers one chat-completions request with the script's next step.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		writeError(w, http.StatusNotFound, "not_found", "the scripted model serves only .../chat/completions")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	rec := Request{Step: -1, Path: r.URL.Path, Authorization: r.Header.Get("Authorization")}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		rec.Status = http.StatusRequestEntityTooLarge
		s.record(rec)
		writeError(w, rec.Status, "too_large", fmt.Sprintf("request body over %d bytes", MaxRequestBytes))
		return
	}
	var req wireRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || req.Messages == nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, rec.Status, "invalid_request", "body must be a chat-completions request with model and messages")
		return
	}
	rec.Model = req.Model
	rec.MaxTokens = req.maxTokens()
	rec.Tools = req.toolNames()
	rec.Messages = req.messages()
	rec.Step = assistantCount(rec.Messages)
	if req.Stream {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		writeError(w, rec.Status, "invalid_request", "the scripted model does not stream")
		return
	}

	step := s.step(rec.Step)
	rec.Status = http.StatusOK
	if step.Status != 0 {
		rec.Status = step.Status
	}
	var reply []byte
	var replyErr error
	if step.Raw == "" && step.Status == 0 {
		if reply, replyErr = s.completion(&rec, req.Model, body, step); replyErr != nil {
			rec.Status = http.StatusInternalServerError
		}
	}
	s.record(rec)

	if step.DelayMs > 0 {
		t := time.NewTimer(time.Duration(step.DelayMs) * time.Millisecond)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}

	switch {
	case step.Raw != "":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Status)
		_, _ = io.WriteString(w, step.Raw)
	case step.Status != 0:
		code := step.ErrorCode
		if code == "" {
			code = "scripted_error"
		}
		writeError(w, step.Status, code, fmt.Sprintf("scripted error at step %d of %q", rec.Step, s.script.Name))
	case replyErr != nil:
		writeError(w, rec.Status, "bad_script", replyErr.Error())
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}
}

// step returns script step i, or the closing finish call past the end.
func (s *Server) step(i int) Step {
	if i < len(s.script.Steps) {
		return s.script.Steps[i]
	}
	args, _ := json.Marshal(map[string]string{
		"summary": fmt.Sprintf("The scripted session %q has no more steps.", s.script.Name),
	})
	return Step{ToolCalls: []ToolCall{{Name: "finish", Arguments: args}}}
}

func (s *Server) record(rec Request) {
	s.mu.Lock()
	s.requests = append(s.requests, rec)
	s.mu.Unlock()
	if s.onRequest != nil {
		s.onRequest(rec)
	}
}

// completion renders step as an OpenAI chat.completion object and notes
// the usage it reports in rec.
func (s *Server) completion(rec *Request, model string, body []byte, step Step) ([]byte, error) {
	type function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type toolCall struct {
		ID       string   `json:"id"`
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	type message struct {
		Role      string     `json:"role"`
		Content   *string    `json:"content"`
		Refusal   *string    `json:"refusal"`
		ToolCalls []toolCall `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Message      message `json:"message"`
		Logprobs     *string `json:"logprobs"`
		FinishReason string  `json:"finish_reason"`
	}
	type usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	}
	type completion struct {
		ID                string   `json:"id"`
		Object            string   `json:"object"`
		Created           int64    `json:"created"`
		Model             string   `json:"model"`
		SystemFingerprint string   `json:"system_fingerprint"`
		Choices           []choice `json:"choices"`
		Usage             usage    `json:"usage"`
	}

	msg := message{Role: "assistant"}
	completionBytes := len(step.Content)
	if step.Content != "" {
		msg.Content = &step.Content
	}
	for i, tc := range step.ToolCalls {
		args := "{}"
		if len(tc.Arguments) > 0 {
			var buf bytes.Buffer
			if err := json.Compact(&buf, tc.Arguments); err != nil {
				return nil, fmt.Errorf("step %d tool call %d: arguments are not JSON: %w", rec.Step, i, err)
			}
			args = buf.String()
		}
		msg.ToolCalls = append(msg.ToolCalls, toolCall{
			ID:       fmt.Sprintf("call_%d_%d", rec.Step, i),
			Type:     "function",
			Function: function{Name: tc.Name, Arguments: args},
		})
		completionBytes += len(tc.Name) + len(args)
	}
	finish := "stop"
	if len(msg.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	sum := sha256.Sum256(body)
	prompt, compl := tokens(promptBytes(rec.Messages)), tokens(completionBytes)
	rec.PromptTokens, rec.CompletionTokens = prompt, compl
	return json.Marshal(completion{
		ID:                "chatcmpl-scripted-" + hex.EncodeToString(sum[:8]),
		Object:            "chat.completion",
		Created:           s.now().Unix(),
		Model:             model,
		SystemFingerprint: "belay-scripted-model",
		Choices:           []choice{{Index: 0, Message: msg, FinishReason: finish}},
		Usage:             usage{PromptTokens: prompt, CompletionTokens: compl, TotalTokens: prompt + compl},
	})
}

// tokens estimates a token count from a byte count: about four bytes a
// token, at least one.
func tokens(n int) int64 {
	return max(1, int64(n+3)/4)
}

func promptBytes(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content)
		for _, tc := range m.ToolCalls {
			n += len(tc.Name) + len(tc.Arguments)
		}
	}
	return n
}

func assistantCount(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// writeError answers an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": message,
		"type":    "scripted_model_error",
		"param":   nil,
		"code":    code,
	}})
}

// wireRequest is the part of a chat-completions request the server reads;
// other keys are ignored, as a permissive provider would.
type wireRequest struct {
	Model               string        `json:"model"`
	Messages            []wireMessage `json:"messages"`
	MaxTokens           int64         `json:"max_tokens"`
	MaxCompletionTokens int64         `json:"max_completion_tokens"`
	Stream              bool          `json:"stream"`
	Tools               []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

type wireMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

func (r wireRequest) maxTokens() int64 {
	if r.MaxTokens != 0 {
		return r.MaxTokens
	}
	return r.MaxCompletionTokens
}

func (r wireRequest) toolNames() []string {
	var names []string
	for _, t := range r.Tools {
		names = append(names, t.Function.Name)
	}
	return names
}

func (r wireRequest) messages() []Message {
	out := make([]Message, 0, len(r.Messages))
	for _, m := range r.Messages {
		msg := Message{Role: m.Role, Content: flattenContent(m.Content), ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, MessageToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		out = append(out, msg)
	}
	return out
}

// flattenContent turns a message's content (a string, an array of parts, or
// null) into its text.
func flattenContent(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}
