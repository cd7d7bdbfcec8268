// Package awstest is an HTTP test server for the AWS services that have no
// peer that runs here — Step Functions, ECS and Secrets Manager — speaking
// their JSON protocol (awsJson1_0 and 1_1) as the Go SDK does. It checks
// each request the SDK sends (method, path, content type, a SigV4
// Authorization header, the X-Amz-Target operation and a JSON body),
// records it, and answers what the test scripted for that operation. It
// stands in for the service only: whatever the service would decide, the
// test decides, so tests built on it prove what the client sends and how
// it reads answers, not the service's behaviour.
package awstest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Handler answers one operation: a status and a body to encode as JSON.
// An error answer is Error(...).
type Handler func(body map[string]any) (int, any)

// Server is one service's test server.
type Server struct {
	*httptest.Server
	tb     testing.TB
	prefix string

	mu       sync.Mutex
	handlers map[string]Handler
	calls    []Call
}

// Call is one request the server took.
type Call struct {
	Operation string
	Body      map[string]any
}

// The X-Amz-Target prefixes of the services.
const (
	StepFunctions  = "AWSStepFunctions."
	ECS            = "AmazonEC2ContainerServiceV20141113."
	SecretsManager = "secretsmanager."
)

// New starts a server for the service whose targets start with prefix,
// and closes it when the test ends.
func New(tb testing.TB, prefix string) *Server {
	tb.Helper()
	s := &Server{tb: tb, prefix: prefix, handlers: make(map[string]Handler)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.Close)
	return s
}

// Handle scripts the answer of an operation ("StartExecution").
func (s *Server) Handle(op string, h Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[op] = h
}

// Calls returns the bodies of the requests for op, in order.
func (s *Server) Calls(op string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, c := range s.calls {
		if c.Operation == op {
			out = append(out, c.Body)
		}
	}
	return out
}

// All returns every call, in order.
func (s *Server) All() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Error is the body of an AWS JSON-protocol error answer of type typ.
func Error(typ, message string) map[string]string {
	return map[string]string{"__type": typ, "message": message}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	fail := func(format string, args ...any) {
		s.tb.Errorf("awstest: "+format, args...)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(Error("ValidationException", "awstest refused the request"))
	}
	if r.Method != http.MethodPost || r.URL.Path != "/" {
		fail("%s %s: want POST /", r.Method, r.URL.Path)
		return
	}
	ct := r.Header.Get("Content-Type")
	if ct != "application/x-amz-json-1.0" && ct != "application/x-amz-json-1.1" {
		fail("Content-Type %q: want application/x-amz-json-1.0 or 1.1", ct)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=") {
		fail("request is not SigV4-signed: Authorization %q", r.Header.Get("Authorization"))
		return
	}
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), s.prefix)
	if !ok {
		fail("X-Amz-Target %q: want %s<Operation>", r.Header.Get("X-Amz-Target"), s.prefix)
		return
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		fail("read body: %v", err)
		return
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		fail("%s: body is not a JSON object: %v", op, err)
		return
	}
	s.mu.Lock()
	s.calls = append(s.calls, Call{Operation: op, Body: body})
	h := s.handlers[op]
	s.mu.Unlock()
	if h == nil {
		fail("unexpected operation %s (body %s)", op, raw)
		return
	}
	status, resp := h(body)
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(resp)
}
