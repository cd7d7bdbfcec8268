package scriptedmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
	sigv4     *sigv4Check

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

// Request is what the server recorded of one request: what reached the
// "provider", and how the server answered. Whatever the wire format, its
// fields say the same things (the messages in chat-completions terms: a
// tool result is a "tool" message), so one test reads all three.
type Request struct {
	// Format is the wire format: FormatOpenAI, FormatAnthropic or
	// FormatBedrock.
	Format string
	// Step is the script step answered (the number of assistant messages,
	// or turns, in the request), or -1 when the body could not be read as
	// a request.
	Step          int
	Path          string
	Authorization string
	// APIKey is the X-Api-Key header, if any.
	APIKey string
	// Signed reports that the request's SigV4 signature was checked and
	// matched (Bedrock, with WithSigV4); SignatureError says why a check
	// failed (the request was then answered 403).
	Signed         bool
	SignatureError string
	Model          string
	// MaxTokens is max_tokens (Anthropic; OpenAI's, or its
	// max_completion_tokens when only that is set) or
	// inferenceConfig.maxTokens (Bedrock); 0 when none is set.
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

// Message is one request message, its content flattened to text. A system
// prompt is a "system" message; an Anthropic or Bedrock tool result is a
// "tool" message of its own, with ToolCallID.
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

// Calls returns how many requests the server has received on its three
// routes, answered or not.
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

// ServeHTTP answers one request with the script's next step, in the wire
// format its path names: OpenAI chat completions (a path ending in
// /chat/completions), Anthropic's Messages API (/v1/messages) or Bedrock's
// Converse API (/model/{modelId}/converse).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, ok := formatFor(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found",
			"the scripted model serves .../chat/completions, /v1/messages and /model/{modelId}/converse")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		f.writeError(w, http.StatusMethodNotAllowed, "", "use POST")
		return
	}
	rec := Request{Step: -1, Format: f.name, Path: r.URL.Path, Authorization: r.Header.Get("Authorization"),
		APIKey: r.Header.Get("X-Api-Key")}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		rec.Status = http.StatusRequestEntityTooLarge
		s.record(rec)
		f.writeError(w, rec.Status, "", fmt.Sprintf("request body over %d bytes", MaxRequestBytes))
		return
	}
	if f.name == FormatBedrock && s.sigv4 != nil {
		if err := VerifySigV4(r, body, s.sigv4.creds, s.sigv4.region, "bedrock", s.now()); err != nil {
			rec.Status = http.StatusForbidden
			rec.SignatureError = err.Error()
			s.record(rec)
			f.writeError(w, rec.Status, "InvalidSignatureException", "the request signature does not match: "+err.Error())
			return
		}
		rec.Signed = true
	}
	p, perr := f.parse(r, body)
	rec.Model, rec.MaxTokens, rec.Tools, rec.Messages = p.model, p.maxTokens, p.tools, p.messages
	if p.messages != nil {
		rec.Step = assistantCount(rec.Messages)
	}
	if perr != nil {
		code := ""
		rec.Status = http.StatusBadRequest
		if he, ok := errors.AsType[*httpError](perr); ok {
			rec.Status, code = he.status, he.code
		}
		s.record(rec)
		f.writeError(w, rec.Status, code, perr.Error())
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
		rec.PromptTokens, rec.CompletionTokens = tokens(promptBytes(rec.Messages)), tokens(completionBytes(step))
		if reply, replyErr = f.render(s, &rec, body, step); replyErr != nil {
			rec.Status = http.StatusInternalServerError
			rec.PromptTokens, rec.CompletionTokens = 0, 0
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
		if code == "" && f.name == FormatOpenAI {
			code = "scripted_error"
		}
		f.writeError(w, step.Status, code, fmt.Sprintf("scripted error at step %d of %q", rec.Step, s.script.Name))
	case replyErr != nil:
		f.writeError(w, rec.Status, "bad_script", replyErr.Error())
	default:
		if f.name == FormatBedrock {
			w.Header().Set("X-Amzn-Requestid", fmt.Sprintf("scripted-%d-%s", rec.Step, shortHash(body)))
		}
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
