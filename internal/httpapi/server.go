package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/intake"
	"github.com/belay-dev/belay/internal/session"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/upstream"
	"github.com/belay-dev/belay/internal/wire"
)

// Defaults of the Config fields that may be left zero.
const (
	DefaultHeartbeatInterval   = 15 * time.Second
	DefaultEventsPollInterval  = 250 * time.Millisecond
	DefaultUpstreamTimeout     = 120 * time.Second
	DefaultMaxUpstreamResponse = upstream.DefaultMaxResponseBytes
)

// MinControlTokenLen is the shortest control-plane token New accepts: a
// shorter one could be guessed. Whoever reads tokens from configuration
// checks it first, to name the setting.
const MinControlTokenLen = 16

// Config is what the handler needs. Store, Artifacts, Orchestrator, Signer,
// Limits.Model, ControlTokens or PublicAuth, and Upstream (a Provider, or
// URL and Key) are required; the rest have defaults.
type Config struct {
	Store     belay.Store
	Artifacts belay.ArtifactStore
	// Orchestrator is told to Submit each new run and to Cancel a run
	// after its cancellation is recorded and its capability revoked.
	Orchestrator belay.Orchestrator
	// Signer verifies the sandbox's run tokens on the internal routes.
	Signer *token.Signer
	Limits belay.Limits
	// ControlTokens are the accepted control-plane bearer tokens, each at
	// least MinControlTokenLen bytes; more than one lets an operator rotate
	// without downtime. They make the public routes' authentication
	// ControlTokenAuth; set them or PublicAuth, not both.
	ControlTokens []string
	// PublicAuth, when set, authenticates the public routes instead of
	// the control-plane tokens (the Lambda functions under
	// BELAY_AUTH=sigv4 trust API Gateway's IAM check).
	PublicAuth Authenticator
	Upstream   Upstream
	// Logger receives one line per request at debug level and every
	// internal error at error level. Nil discards.
	Logger *slog.Logger
	// Now is the clock for run timestamps, capability expiry and approval
	// timeouts. Nil means time.Now.
	Now func() time.Time
	// Entropy feeds run, approval and request ids. Nil means crypto/rand.
	// A read error means a broken machine, and the handler panics.
	Entropy io.Reader
	// HeartbeatInterval is the longest an SSE stream stays silent; a
	// comment line keeps proxies from closing it. Zero means 15 s.
	HeartbeatInterval time.Duration
	// EventsPollInterval is how often an SSE stream polls the store for new
	// events. Zero means 250 ms.
	EventsPollInterval time.Duration
	// EventsChanged, when set, returns a channel closed at the next write
	// that appends events (belay.WatchedStore.Changed), so a stream wakes
	// at once rather than at its next poll. Polling stays the fallback.
	EventsChanged func() <-chan struct{}
	// SandboxEventLimits caps what each run's sandbox may append to its
	// log through the events route; zero fields take
	// belay.DefaultSandboxEventLimits.
	SandboxEventLimits belay.SandboxEventLimits
	// Presigner, when set, gives a claiming sandbox presigned upload URLs
	// for its outputs (on AWS, the S3 adapter); nil points it at the
	// outputs route. When it also presigns downloads (SourcePresigner),
	// the sandbox of a git-source run downloads its bundle from S3.
	Presigner OutputPresigner
	// Git and Sources, together, let runs start from a git source
	// (POST /v1/runs with source.git, and the dispatcher): the control
	// plane fetches with Git and keeps the bundle in Sources, which the
	// sandbox downloads (GET /internal/v1/runs/{id}/source). Without them
	// a git source is refused.
	Git     belay.SourceFetcher
	Sources belay.SourceStore
	// Workspaces, when set, enables sessions (the /v1/sessions routes):
	// it builds each turn's workspace (gitsource.Workspaces). Without it
	// those routes answer not_found, and the handler links no git code.
	Workspaces belay.Workspaces
	// ReadSessions, without Workspaces, serves a session's event stream
	// (GET /v1/sessions/{id}/events) from the store alone
	// (session.Reader), writing nothing; the other session routes answer
	// not_found. The stream function on AWS.
	ReadSessions bool
	// Webhooks, when set, serves POST /v1/webhooks/github (no bearer: the
	// signature is the credential).
	Webhooks http.Handler
	// Intake, when set, is the run-creation service to use (shared with
	// the dispatcher); nil builds one from the fields above.
	Intake *intake.Service
}

// Upstream is the operator's model provider, which the model proxy forwards
// to after a call has passed every check.
type Upstream struct {
	// Provider sends the calls (internal/modelprovider builds one from the
	// operator's configuration: OpenAI-compatible, Anthropic or Bedrock).
	// When nil, the handler builds the OpenAI-compatible provider from
	// URL, AllowLoopbackHTTP, Key, OnUnauthorized and Client, which are
	// then required; with a Provider they are unused.
	Provider upstream.Provider
	// URL is the chat-completions endpoint; see ValidateUpstreamURL.
	URL string
	// AllowLoopbackHTTP permits plain http to a loopback host, for a model
	// served on the same machine in embedded mode.
	AllowLoopbackHTTP bool
	// Key returns the provider key. It is called once per forwarded call,
	// after the budget is spent, so the key source should cache.
	Key func(ctx context.Context) (string, error)
	// OnUnauthorized, when set, is called when the upstream answers 401,
	// so a caching key source can refresh a rotated key early.
	OnUnauthorized func()
	// Client sends the upstream calls; nil means a client of its own. The
	// handler never follows redirects, whichever client it is given, so the
	// key is only ever sent to URL.
	Client *http.Client
	// Timeout bounds one upstream call. Zero means 120 s.
	Timeout time.Duration
	// MaxResponseBytes caps the upstream's answer. Zero means 4 MiB.
	MaxResponseBytes int64
}

// Server is the control plane's HTTP handler. It is safe for concurrent use.
type Server struct {
	store         belay.Store
	artifacts     belay.ArtifactStore
	orchestrator  belay.Orchestrator
	signer        *token.Signer
	limits        belay.Limits
	publicAuth    Authenticator
	upstream      Upstream
	provider      upstream.Provider
	log           *slog.Logger
	now           func() time.Time
	heartbeat     time.Duration
	pollEvery     time.Duration
	changed       func() <-chan struct{}
	presigner     OutputPresigner
	sandboxEvents belay.SandboxEventLimits
	sources       belay.SourceStore
	intake        *intake.Service
	sessions      *session.Service
	sessionReads  sessionReader // sessions, or a session.Reader (Config.ReadSessions); nil for neither
	webhooks      http.Handler

	entropyMu sync.Mutex
	entropy   io.Reader

	public   *http.ServeMux
	internal *http.ServeMux

	// base ends when the server closes: work detached from its caller (a
	// paid model call) still stops then. active counts requests in flight,
	// including those whose caller hung up, so Close can wait for them.
	base       context.Context
	cancelBase context.CancelFunc
	activeMu   sync.Mutex
	closed     bool
	active     sync.WaitGroup
}

// New checks cfg and builds the handler. It refuses a config that would
// serve insecurely (a bad upstream URL, an empty control token) rather than
// start and fail later.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("httpapi: Config.Store is required")
	case cfg.Artifacts == nil:
		return nil, errors.New("httpapi: Config.Artifacts is required")
	case cfg.Orchestrator == nil:
		return nil, errors.New("httpapi: Config.Orchestrator is required")
	case cfg.Signer == nil:
		return nil, errors.New("httpapi: Config.Signer is required")
	case cfg.Limits.Model == "":
		return nil, errors.New("httpapi: Config.Limits.Model is required")
	case cfg.Limits.MaxBodyBytes <= 0:
		return nil, errors.New("httpapi: Config.Limits.MaxBodyBytes must be positive (see belay.DefaultLimits)")
	case len(cfg.ControlTokens) == 0 && cfg.PublicAuth == nil:
		return nil, errors.New("httpapi: at least one control-plane token (or a PublicAuth) is required")
	case len(cfg.ControlTokens) > 0 && cfg.PublicAuth != nil:
		return nil, errors.New("httpapi: set Config.ControlTokens or Config.PublicAuth, not both")
	case cfg.Upstream.Provider == nil && cfg.Upstream.Key == nil:
		return nil, errors.New("httpapi: Config.Upstream.Key (or Provider) is required")
	}
	provider := cfg.Upstream.Provider
	if provider == nil {
		p, err := upstream.NewOpenAI(upstream.OpenAIConfig{
			URL: cfg.Upstream.URL, AllowLoopbackHTTP: cfg.Upstream.AllowLoopbackHTTP,
			Key: cfg.Upstream.Key, OnUnauthorized: cfg.Upstream.OnUnauthorized, Client: cfg.Upstream.Client,
		})
		if err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
		provider = p
	}
	s := &Server{
		store:         cfg.Store,
		artifacts:     cfg.Artifacts,
		orchestrator:  cfg.Orchestrator,
		signer:        cfg.Signer,
		limits:        cfg.Limits,
		upstream:      cfg.Upstream,
		provider:      provider,
		log:           cfg.Logger,
		now:           cfg.Now,
		entropy:       cfg.Entropy,
		heartbeat:     cfg.HeartbeatInterval,
		pollEvery:     cfg.EventsPollInterval,
		changed:       cfg.EventsChanged,
		presigner:     cfg.Presigner,
		sandboxEvents: cfg.SandboxEventLimits,
		sources:       cfg.Sources,
		webhooks:      cfg.Webhooks,
	}
	def := belay.DefaultSandboxEventLimits()
	if s.sandboxEvents.MaxEvents <= 0 {
		s.sandboxEvents.MaxEvents = def.MaxEvents
	}
	if s.sandboxEvents.MaxBytes <= 0 {
		s.sandboxEvents.MaxBytes = def.MaxBytes
	}
	s.publicAuth = cfg.PublicAuth
	if s.publicAuth == nil {
		auth, err := ControlTokenAuth(cfg.ControlTokens)
		if err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
		s.publicAuth = auth
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.entropy == nil {
		s.entropy = rand.Reader
	}
	if s.heartbeat <= 0 {
		s.heartbeat = DefaultHeartbeatInterval
	}
	if s.pollEvery <= 0 {
		s.pollEvery = DefaultEventsPollInterval
	}
	if s.upstream.Timeout <= 0 {
		s.upstream.Timeout = DefaultUpstreamTimeout
	}
	if s.upstream.MaxResponseBytes <= 0 {
		s.upstream.MaxResponseBytes = DefaultMaxUpstreamResponse
	}

	var err error
	s.intake = cfg.Intake
	if s.intake == nil {
		s.intake, err = intake.New(intake.Config{
			Store: s.store, Orchestrator: s.orchestrator, Git: cfg.Git, Sources: cfg.Sources, Limits: s.limits,
			NewID: func() string { return s.newID("run_") }, Now: s.now, Logger: s.log,
		})
		if err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
	}

	if cfg.Workspaces != nil {
		if s.sessions, err = s.newSessions(cfg.Workspaces); err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
		s.sessionReads = s.sessions
	} else if cfg.ReadSessions {
		s.sessionReads = session.Reader{Store: s.store}
	}

	s.base, s.cancelBase = context.WithCancel(context.Background())
	s.public = http.NewServeMux()
	s.internal = http.NewServeMux()
	for _, mux := range []*http.ServeMux{s.public, s.internal} {
		mux.HandleFunc("POST /internal/v1/chat/completions", s.handleChatCompletions)
		mux.HandleFunc("POST /internal/v1/runs/{id}/events", s.handleAppendEvents)
		mux.HandleFunc("POST /internal/v1/runs/{id}/approvals", s.handleRequestApproval)
		mux.HandleFunc("GET /internal/v1/runs/{id}/approvals/{approvalId}", s.handleGetApprovalInternal)
		mux.HandleFunc("PUT /internal/v1/runs/{id}/outputs/{name}", s.handlePutOutput)
		mux.HandleFunc("PUT /internal/v1/runs/{id}/checkpoints/{seq}", s.handlePutCheckpoint)
		mux.HandleFunc("GET /internal/v1/runs/{id}/checkpoints/latest", s.handleGetLatestCheckpoint)
		mux.HandleFunc("GET /internal/v1/runs/{id}/source", s.handleGetSource)
		mux.HandleFunc("POST /internal/v1/claim", s.handleClaim)
		mux.HandleFunc("/", s.handleNoRoute)
	}
	s.public.HandleFunc("GET /v1/config", s.handleConfig)
	s.public.HandleFunc("POST /v1/runs", s.handleCreateRun)
	s.public.HandleFunc("GET /v1/runs", s.handleListRuns)
	s.public.HandleFunc("GET /v1/runs/{id}", s.handleGetRun)
	s.public.HandleFunc("GET /v1/runs/{id}/events", s.handleEvents)
	s.public.HandleFunc("GET /v1/runs/{id}/approvals", s.handleListApprovals)
	s.public.HandleFunc("POST /v1/runs/{id}/approvals/{approvalId}", s.handleDecideApproval)
	s.public.HandleFunc("POST /v1/runs/{id}/cancel", s.handleCancel)
	s.public.HandleFunc("GET /v1/runs/{id}/artifacts", s.handleListArtifacts)
	s.public.HandleFunc("GET /v1/runs/{id}/artifacts/{name}", s.handleGetArtifact)
	for pattern, h := range map[string]http.HandlerFunc{
		"POST /v1/sessions":               s.handleCreateSession,
		"GET /v1/sessions/{id}":           s.handleGetSession,
		"DELETE /v1/sessions/{id}":        s.handleCloseSession,
		"POST /v1/sessions/{id}/messages": s.handleSendMessage,
		"POST /v1/sessions/{id}/stop":     s.handleStopSession,
		"GET /v1/sessions/{id}/patch":     s.handleSessionPatch,
		"GET /v1/sessions/{id}/ws":        s.handleSessionWebSocket,
	} {
		s.public.HandleFunc(pattern, s.withSessions(h))
	}
	s.public.HandleFunc("GET /v1/sessions/{id}/events", s.handleSessionEvents)
	if s.webhooks != nil {
		s.public.Handle("POST "+wire.GitHubWebhookPath, s.webhooks)
	}
	return s, nil
}

// Intake returns the run-creation service the handler creates runs with,
// for the dispatcher to create runs from repository events the same way.
func (s *Server) Intake() *intake.Service { return s.intake }

// ServeHTTP serves the public and the internal routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, s.public)
}

// InternalHandler serves only the internal routes (model proxy, event
// append, approvals, outputs, checkpoints, the claim exchange): what the local launcher
// exposes on the sandbox's Unix socket, so a sandbox can never reach the
// public API.
func (s *Server) InternalHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r, s.internal)
	})
}

// requestState is what a request's handlers tell the shared error and log
// paths: its id, and the run it concerns once known.
type requestState struct {
	id    string
	runID string
}

type stateKey struct{}

func stateOf(r *http.Request) *requestState {
	if st, ok := r.Context().Value(stateKey{}).(*requestState); ok {
		return st
	}
	return &requestState{}
}

// serve wraps every route: request id, security headers, the public
// routes' authentication, panic recovery and a debug log line.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) {
	start := time.Now()
	st := &requestState{id: s.newID("req_")}
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
	h := w.Header()
	h.Set(wire.RequestIDHeader, st.id)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	sw := &statusWriter{ResponseWriter: w}
	if !s.enter() {
		s.writeError(sw, r, belay.Errorf(belay.CodeUnavailable, "the control plane is shutting down"))
		return
	}
	defer s.active.Done()

	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("handler panicked", "request_id", st.id, "run_id", st.runID, "panic", fmt.Sprint(p))
			if sw.status == 0 {
				s.writeError(sw, r, errors.New("panic"))
			}
		}
		s.log.Debug("request", "request_id", st.id, "run_id", st.runID, "method", r.Method,
			"path", r.URL.Path, "status", sw.status, "duration", time.Since(start))
	}()

	if s.needsPublicAuth(r) {
		if err := s.authenticate(r); err != nil {
			s.writeError(sw, r, err)
			return
		}
	}
	mux.ServeHTTP(sw, r)
}

// enter counts a request in flight, unless the server is closed.
func (s *Server) enter() bool {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	if s.closed {
		return false
	}
	s.active.Add(1)
	return true
}

// detached returns a context for work that must run to its end even if the
// caller hangs up (a model call already paid for), but that still ends when
// the server closes.
func (s *Server) detached(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() { stop(); cancel() }
}

// Close refuses new requests, ends detached work (in-flight model calls
// answer upstream_error), and waits until every request in flight has
// returned, or ctx ends. The stores must stay open until it returns.
func (s *Server) Close(ctx context.Context) error {
	s.activeMu.Lock()
	s.closed = true
	s.activeMu.Unlock()
	s.cancelBase()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("httpapi: requests still in flight: %w", ctx.Err())
	}
}

func (s *Server) handleNoRoute(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix plus 128 random bits, lower-case base32. Entropy may
// be a test's deterministic reader, which need not be safe for concurrent
// use, hence the lock. A failing entropy source is not recoverable.
func (s *Server) newID(prefix string) string {
	var b [16]byte
	s.entropyMu.Lock()
	_, err := io.ReadFull(s.entropy, b[:])
	s.entropyMu.Unlock()
	if err != nil {
		panic(fmt.Sprintf("httpapi: read entropy: %v", err))
	}
	return prefix + idEncoding.EncodeToString(b[:])
}

// statusWriter remembers the status for the log line. Unwrap lets
// http.ResponseController reach the real writer's Flush and deadlines.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
