package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/bedrock"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/token"
	upstreampkg "github.com/belay-dev/belay/internal/upstream"
	"github.com/belay-dev/belay/internal/wire"
)

const testModel = "test-model-1"

// fileCanary is planted in uploaded file contents and prompts; the public
// run view, events and logs must never repeat it.
const fileCanary = "FILE-CANARY-51d0c2"

// clock is the harness's settable time, shared by the server and the signer.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// recordingOrchestrator records what the handler asks of the orchestrator
// port, whose real implementations are tested in their own packages.
type recordingOrchestrator struct {
	mu        sync.Mutex
	submitted []string
	cancelled []string
	submitErr error
	cancelErr error
}

func (o *recordingOrchestrator) Submit(_ context.Context, id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.submitted = append(o.submitted, id)
	return o.submitErr
}

func (o *recordingOrchestrator) Cancel(_ context.Context, id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cancelled = append(o.cancelled, id)
	return o.cancelErr
}

func (o *recordingOrchestrator) calls() (submitted, cancelled []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.submitted...), append([]string(nil), o.cancelled...)
}

// The providers every proxy test runs against: the OpenAI-compatible
// forwarder, Anthropic's Messages API and Bedrock's Converse API. Neither
// Anthropic nor Bedrock can run here: their upstream is this loopback
// server speaking their wire format (checking Bedrock's SigV4 signature
// with the harness's credentials, through aws-sdk-go-v2's signer).
var providers = []string{upstreampkg.KindOpenAI, upstreampkg.KindAnthropic, upstreampkg.KindBedrock}

// forEachProvider runs test once per provider, as a subtest.
func forEachProvider(t *testing.T, test func(t *testing.T, provider string)) {
	for _, p := range providers {
		t.Run(p, func(t *testing.T) { test(t, p) })
	}
}

// The harness's AWS credentials for Bedrock: the secret access key is the
// harness's key canary, so every check that the provider key never leaks
// covers it.
const (
	harnessRegion      = "us-west-2"
	harnessAccessKeyID = "AKIDHARNESS000000001"
)

// upstream is a real loopback model provider: it counts calls, records the
// Authorization header and body of each, and answers with respond.
type upstream struct {
	provider string
	creds    aws.Credentials
	srv      *httptest.Server
	calls    atomic.Int64
	mu       sync.Mutex
	auths    []string
	headers  []http.Header
	bodies   [][]byte
	paths    []string
	sigErrs  []string
	respond  atomic.Pointer[http.HandlerFunc]
}

// completion is a chat-completions answer asking for one tool call.
const completion = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"test-model-1",` +
	`"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,` +
	`"tool_calls":[{"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"calc.py\"}"}}]}}],` +
	`"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`

// anthropicCompletion is completion as the Messages API says it.
const anthropicCompletion = `{"id":"msg_1","type":"message","role":"assistant","model":"test-model-1",` +
	`"content":[{"type":"tool_use","id":"call_1","name":"read_file","input":{"path":"calc.py"}}],` +
	`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":7}}`

// bedrockCompletion is completion as the Converse API says it.
const bedrockCompletion = `{"output":{"message":{"role":"assistant","content":[` +
	`{"toolUse":{"toolUseId":"call_1","name":"read_file","input":{"path":"calc.py"}}}]}},` +
	`"stopReason":"tool_use","usage":{"inputTokens":11,"outputTokens":7,"totalTokens":18},"metrics":{"latencyMs":1}}`

func newUpstream(tb testing.TB, provider, secret string) *upstream {
	tb.Helper()
	u := &upstream{provider: provider, creds: aws.Credentials{
		AccessKeyID: harnessAccessKeyID, SecretAccessKey: secret, SessionToken: "harness-session-token",
	}}
	answer := map[string]string{
		upstreampkg.KindOpenAI: completion, upstreampkg.KindAnthropic: anthropicCompletion, upstreampkg.KindBedrock: bedrockCompletion,
	}[provider]
	u.setResponse(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	})
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.calls.Add(1)
		var sigErr error
		if provider == upstreampkg.KindBedrock {
			sigErr = scriptedmodel.VerifySigV4(r, body, u.creds, harnessRegion, "bedrock", time.Now())
		}
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.headers = append(u.headers, r.Header.Clone())
		u.bodies = append(u.bodies, body)
		u.paths = append(u.paths, r.URL.Path)
		if sigErr != nil {
			u.sigErrs = append(u.sigErrs, sigErr.Error())
		}
		u.mu.Unlock()
		if sigErr != nil {
			w.Header().Set("X-Amzn-Errortype", "InvalidSignatureException")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"message":"signature mismatch"}`)
			return
		}
		(*u.respond.Load())(w, r)
	}))
	tb.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) setResponse(h http.HandlerFunc) { u.respond.Store(&h) }

// url is what the provider is configured with: the chat-completions URL,
// the Messages API's base URL, or Bedrock's endpoint.
func (u *upstream) url() string {
	if u.provider == upstreampkg.KindOpenAI {
		return u.srv.URL + "/v1/chat/completions"
	}
	return u.srv.URL
}

func (u *upstream) lastBody(tb testing.TB) map[string]any {
	tb.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		tb.Fatal("upstream was never called")
	}
	var m map[string]any
	if err := json.Unmarshal(u.bodies[len(u.bodies)-1], &m); err != nil {
		tb.Fatalf("upstream body is not JSON: %v", err)
	}
	return m
}

// checkForwarded asserts what the last call sent: the run's model, the
// proxy's max-tokens cap of 4096, no stream, and chatBody's system
// prompt, one user message and one tool, in the provider's own terms.
func (u *upstream) checkForwarded(tb testing.TB) {
	tb.Helper()
	sent := u.lastBody(tb)
	u.mu.Lock()
	path := u.paths[len(u.paths)-1]
	u.mu.Unlock()
	count := func(v any) int { l, _ := v.([]any); return len(l) }
	switch u.provider {
	case upstreampkg.KindOpenAI:
		if sent["stream"] != false || sent["max_tokens"] != float64(4096) || sent["model"] != testModel || count(sent["messages"]) != 2 {
			tb.Errorf("forwarded body %v: want stream false, max_tokens 4096, the run's model, 2 messages", sent)
		}
	case upstreampkg.KindAnthropic:
		if path != "/v1/messages" || sent["model"] != testModel || sent["max_tokens"] != float64(4096) ||
			(sent["stream"] != nil && sent["stream"] != false) || count(sent["system"]) != 1 || count(sent["messages"]) != 1 || count(sent["tools"]) != 1 {
			tb.Errorf("forwarded %s %v: want the Messages API, max_tokens 4096, the run's model, 1 system block, 1 message, 1 tool", path, sent)
		}
	case upstreampkg.KindBedrock:
		ic, _ := sent["inferenceConfig"].(map[string]any)
		tc, _ := sent["toolConfig"].(map[string]any)
		if path != "/model/"+testModel+"/converse" || ic["maxTokens"] != float64(4096) ||
			count(sent["system"]) != 1 || count(sent["messages"]) != 1 || count(tc["tools"]) != 1 {
			tb.Errorf("forwarded %s %v: want Converse for the run's model, maxTokens 4096, 1 system block, 1 message, 1 tool", path, sent)
		}
	}
}

// checkCredential asserts that every call carried the provider's credential
// and nothing else: the key as a bearer token (OpenAI-compatible,
// Anthropic), or a SigV4 signature by the harness's credentials that the
// server verified, with no key at all (Bedrock).
func (u *upstream) checkCredential(tb testing.TB, key string) {
	tb.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.auths) == 0 {
		tb.Fatal("upstream was never called")
	}
	for i, auth := range u.auths {
		switch u.provider {
		case upstreampkg.KindBedrock:
			if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+harnessAccessKeyID+"/") {
				tb.Errorf("upstream call %d: Authorization %q is not a SigV4 signature by the configured credentials", i, auth)
			}
			if u.headers[i].Get("X-Api-Key") != "" {
				tb.Errorf("upstream call %d carries an X-Api-Key", i)
			}
			var wire bytes.Buffer
			_ = u.headers[i].Write(&wire)
			wire.Write(u.bodies[i])
			if strings.Contains(wire.String(), key) {
				tb.Errorf("upstream call %d carries the secret access key itself", i)
			}
		default:
			if auth != "Bearer "+key {
				tb.Errorf("upstream call %d had Authorization %q, want the provider key", i, auth)
			}
		}
	}
	if len(u.sigErrs) > 0 {
		tb.Errorf("Bedrock signatures did not verify: %v", u.sigErrs)
	}
}

// syncBuffer collects log output from concurrent handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type harnessOptions struct {
	// provider is the upstream's kind; empty means openai.
	provider   string
	bufferSize int
	heartbeat  time.Duration
	poll       time.Duration
	timeout    time.Duration
	maxResp    int64
	keyErr     error
	quietLogs  bool
	// watch wraps the store in belay.WatchStore and hands its signal to
	// the server, as belay serve does.
	watch bool
	// presigner, when set, is the server's OutputPresigner.
	presigner httpapi.OutputPresigner
	// sandboxEvents caps each run's sandbox events (zero: the defaults).
	sandboxEvents belay.SandboxEventLimits
	// sessions enables the session routes (gitsource.Workspaces).
	sessions bool
}

// harness is one server over a real SQLite store in a temporary directory,
// a real loopback upstream and a real listener.
type harness struct {
	srv          *httptest.Server
	store        belay.Store
	artifacts    belay.ArtifactStore
	signer       *token.Signer
	clock        *clock
	orch         *recordingOrchestrator
	up           *upstream
	api          *httpapi.Server
	logs         *syncBuffer
	controlToken string
	// key is the provider key: for Bedrock, the secret access key of the
	// credentials that sign the calls.
	key          string
	provider     string
	unauthorized atomic.Int64
	// transcript keeps every answer body and header the tests read, so a
	// test can prove a secret never appeared in one.
	transcriptMu sync.Mutex
	transcript   bytes.Buffer
}

func randomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func openStore(tb testing.TB, bufferSize int) belay.Store {
	tb.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "belay.db"), sqlite.Options{EventBufferSize: bufferSize})
	if err != nil {
		tb.Fatalf("open sqlite store: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

func openArtifacts(tb testing.TB) belay.ArtifactStore {
	tb.Helper()
	st, err := localdir.New(filepath.Join(tb.TempDir(), "artifacts"))
	if err != nil {
		tb.Fatalf("open artifact folder: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

func newHarness(tb testing.TB, opts harnessOptions) *harness {
	tb.Helper()
	if opts.provider == "" {
		opts.provider = upstreampkg.KindOpenAI
	}
	h := &harness{
		clock:        &clock{t: time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)},
		orch:         &recordingOrchestrator{},
		logs:         &syncBuffer{},
		controlToken: "ctl-" + randomHex(tb, 24),
		key:          "sk-canary-" + randomHex(tb, 16),
		provider:     opts.provider,
	}
	h.up = newUpstream(tb, opts.provider, h.key)
	h.store = openStore(tb, opts.bufferSize)
	var changed func() <-chan struct{}
	if opts.watch {
		w := belay.WatchStore(h.store)
		h.store, changed = w, w.Changed
	}
	h.artifacts = openArtifacts(tb)
	signer, err := token.NewSigner([]byte(strings.Repeat("s", 32)+randomHex(tb, 8)), h.clock.Now)
	if err != nil {
		tb.Fatal(err)
	}
	h.signer = signer
	var logger *slog.Logger
	if opts.quietLogs {
		logger = slog.New(slog.DiscardHandler)
	} else {
		logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	keyErr := opts.keyErr
	key := func(context.Context) (string, error) {
		if keyErr != nil {
			return "", keyErr
		}
		return h.key, nil
	}
	onUnauthorized := func() { h.unauthorized.Add(1) }
	up := httpapi.Upstream{Timeout: opts.timeout, MaxResponseBytes: opts.maxResp}
	switch opts.provider {
	case upstreampkg.KindOpenAI:
		up.URL, up.AllowLoopbackHTTP, up.Key, up.OnUnauthorized = h.up.url(), true, key, onUnauthorized
	case upstreampkg.KindAnthropic:
		p, err := anthropic.New(anthropic.Config{BaseURL: h.up.url(), AllowLoopbackHTTP: true, Key: key,
			OnUnauthorized: onUnauthorized, Now: h.clock.Now})
		if err != nil {
			tb.Fatal(err)
		}
		up.Provider = p
	case upstreampkg.KindBedrock:
		creds := aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			if keyErr != nil {
				return aws.Credentials{}, keyErr
			}
			return h.up.creds, nil
		})
		p, err := bedrock.New(context.Background(), bedrock.Config{Endpoint: h.up.url(), AllowLoopbackHTTP: true,
			AWS: &aws.Config{Region: harnessRegion, Credentials: creds}, Now: h.clock.Now})
		if err != nil {
			tb.Fatal(err)
		}
		up.Provider = p
	default:
		tb.Fatalf("unknown provider %q", opts.provider)
	}
	cfg := httpapi.Config{
		Store:              h.store,
		Artifacts:          h.artifacts,
		Orchestrator:       h.orch,
		Signer:             signer,
		Limits:             belay.DefaultLimits(testModel),
		ControlTokens:      []string{"ctl-other-" + randomHex(tb, 16), h.controlToken},
		Upstream:           up,
		Logger:             logger,
		Now:                h.clock.Now,
		HeartbeatInterval:  opts.heartbeat,
		EventsPollInterval: opts.poll,
		EventsChanged:      changed,
		Presigner:          opts.presigner,
		SandboxEventLimits: opts.sandboxEvents,
	}
	if opts.sessions {
		cfg.Workspaces = gitsource.Workspaces{}
	}
	api, err := httpapi.New(cfg)
	if err != nil {
		tb.Fatalf("httpapi.New: %v", err)
	}
	h.api = api
	h.srv = httptest.NewServer(api)
	tb.Cleanup(h.srv.Close)
	return h
}

// answer is one HTTP answer, read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) errorCode(tb testing.TB) belay.Code {
	tb.Helper()
	var e wire.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil {
		tb.Fatalf("answer %d is not an error body: %v: %s", a.status, err, a.body)
	}
	return e.Error.Code
}

func (a answer) decode(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		tb.Fatalf("decode answer %d: %v: %s", a.status, err, a.body)
	}
}

// do sends a request to the server and reads the whole answer.
func (h *harness) do(tb testing.TB, method, path, bearer string, body []byte, header http.Header) answer {
	tb.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, path, err)
	}
	h.record(resp.Header, b)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (h *harness) record(hdr http.Header, body []byte) {
	h.transcriptMu.Lock()
	defer h.transcriptMu.Unlock()
	_ = hdr.Write(&h.transcript)
	h.transcript.Write(body)
	h.transcript.WriteByte('\n')
}

func (h *harness) transcriptString() string {
	h.transcriptMu.Lock()
	defer h.transcriptMu.Unlock()
	return h.transcript.String()
}

// public calls a public route with the control-plane token.
func (h *harness) public(tb testing.TB, method, path string, body string) answer {
	tb.Helper()
	return h.do(tb, method, path, h.controlToken, []byte(body), nil)
}

// runBody is a valid run request; extra JSON members are spliced in.
func runBody(extra string) string {
	b := `{"instruction":"Fix the failing test in calc.py",` +
		`"files":[{"path":"calc.py","content":"def add(a, b):\n    return a - b  # ` + fileCanary + `\n"},` +
		`{"path":"tests/test_calc.py","content":"from calc import add\n"}],` +
		`"allowedPaths":["calc.py"],"checks":[["python3","-m","pytest","-q"]],"maxSteps":3`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// createRun creates a run through the API and returns its id.
func (h *harness) createRun(tb testing.TB, extra string) string {
	tb.Helper()
	a := h.public(tb, "POST", "/v1/runs", runBody(extra))
	if a.status != http.StatusAccepted {
		tb.Fatalf("create run: %d %s", a.status, a.body)
	}
	var cr wire.CreateRunResponse
	a.decode(tb, &cr)
	return cr.RunID
}

// startRun creates a run and does what the orchestrator would: moves it to
// running, activates a capability of maxRequests and issues its tokens.
func (h *harness) startRun(tb testing.TB, extra string, maxRequests int) (string, token.Set) {
	tb.Helper()
	id := h.createRun(tb, extra)
	ctx := context.Background()
	now := h.clock.Now()
	if _, err := h.store.Transition(ctx, id, belay.Transition{
		To: belay.StatusRunning, At: now, Attempt: 1,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunStarted, Data: json.RawMessage(`{}`)}},
	}); err != nil {
		tb.Fatalf("start run: %v", err)
	}
	if err := h.store.ActivateCapability(ctx, belay.Capability{
		RunID: id, Model: testModel, State: belay.CapabilityActive,
		ExpiresAt: now.Add(time.Hour), MaxRequests: maxRequests,
	}); err != nil {
		tb.Fatalf("activate capability: %v", err)
	}
	set, err := h.signer.IssueSet(id, testModel, time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return id, set
}

// finishRun moves a running run to completed.
func (h *harness) finishRun(tb testing.TB, id string) {
	tb.Helper()
	now := h.clock.Now()
	code := 0
	if _, err := h.store.Transition(context.Background(), id, belay.Transition{
		To: belay.StatusCompleted, At: now, ExitCode: &code,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunCompleted, Data: json.RawMessage(`{}`)}},
	}); err != nil {
		tb.Fatalf("finish run: %v", err)
	}
}

// appendEvents appends n tool.call events straight to the store.
func (h *harness) appendEvents(tb testing.TB, id string, n int) {
	tb.Helper()
	in := make([]belay.EventInput, n)
	for i := range in {
		in[i] = belay.EventInput{Time: h.clock.Now(), Type: belay.EventToolCall, Data: json.RawMessage(`{"tool":"read_file"}`)}
	}
	if _, err := h.store.AppendEvents(context.Background(), id, "", in); err != nil {
		tb.Fatalf("append events: %v", err)
	}
}

// allEvents reads a run's whole log from the store.
func (h *harness) allEvents(tb testing.TB, id string) []belay.Event {
	tb.Helper()
	page, err := h.store.ListEvents(context.Background(), id, 0, 100000)
	if err != nil {
		tb.Fatalf("list events: %v", err)
	}
	return page.Events
}

func countType(events []belay.Event, typ string) int {
	n := 0
	for _, e := range events {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// chat calls the model proxy with a token and a body.
func (h *harness) chat(tb testing.TB, tok, body string) answer {
	tb.Helper()
	return h.do(tb, "POST", "/internal/v1/chat/completions", tok, []byte(body), nil)
}

const chatBody = `{"model":"test-model-1","messages":[{"role":"system","content":"You are an agent."},` +
	`{"role":"user","content":"Fix it. ` + fileCanary + `"}],` +
	`"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}],"max_tokens":100000,"stream":true}`

// sseEvent is one parsed server-sent event, or a comment.
type sseEvent struct {
	id, event, data string
	comment         string
}

// sseReader parses a text/event-stream body.
type sseReader struct{ sc *bufio.Scanner }

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	return &sseReader{sc: sc}
}

// next returns the next event or comment; io.EOF when the stream ended.
func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	seen := false
	for s.sc.Scan() {
		line := s.sc.Text()
		if line == "" {
			if seen {
				return ev, nil
			}
			continue
		}
		if c, ok := strings.CutPrefix(line, ":"); ok {
			return sseEvent{comment: strings.TrimSpace(c)}, nil
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		seen = true
		switch field {
		case "id":
			ev.id = value
		case "event":
			ev.event = value
		case "data":
			ev.data = value
		}
	}
	if err := s.sc.Err(); err != nil {
		return ev, err
	}
	if seen {
		return ev, io.ErrUnexpectedEOF
	}
	return ev, io.EOF
}

// openStream starts an SSE request. The test's deadline bounds it, so a
// stream that never ends fails the test instead of hanging it.
func (h *harness) openStream(tb testing.TB, ctx context.Context, path string, header http.Header) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", h.srv.URL+path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+h.controlToken)
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		tb.Fatalf("open stream: %v", err)
	}
	return resp
}

// httptestServer serves handler on a real loopback listener and returns its URL.
func httptestServer(tb testing.TB, handler http.Handler) string {
	tb.Helper()
	srv := httptest.NewServer(handler)
	tb.Cleanup(srv.Close)
	return srv.URL
}

// doURL sends one request with a bearer token and reads the whole answer.
func doURL(tb testing.TB, method, url, bearer string, body []byte) answer {
	tb.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}
