// Package embedded is belay's one-machine control plane, the composition
// root of `belay serve`: the same HTTP handler as on AWS, served by a plain
// http.Server on loopback, over the SQLite store, the artifacts folder, the
// in-process orchestrator and a local sandbox launcher: the sandbox image
// under runc (internal/ocisandbox), or, only when the operator accepts
// weaker isolation, the entry as a host subprocess (internal/localsandbox;
// see chooseLauncher). The store and the
// artifacts may instead be AWS's own adapters, a DynamoDB table and an S3
// bucket (StorageConfig), with the rest unchanged. Main is what the
// CLI runs and what end-to-end tests start on port 0 in a temporary
// directory.
package embedded

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/token"
)

// sandboxStopGrace lets a sandbox past its wall time exit on its own (and
// leave its transcript) before it is killed.
const sandboxStopGrace = 5 * time.Second

// Main is the embedded control plane. New checks the configuration and
// prepares the data directory; Run serves until its context ends or Close
// is called. A Main runs once.
type Main struct {
	cfg        Config
	log        *slog.Logger
	now        func() time.Time
	token      string
	tokenFile  string
	signingKey []byte
	apiKey     secrets.Source
	script     *scriptedmodel.Script
	sandboxBin string
	launcher   launcherChoice
	limits     belay.Limits
	repoEvents *repoEvents

	ready     chan struct{}
	stop      chan struct{} // closed by Close
	stopOnce  sync.Once
	done      chan struct{} // closed when Run has released everything
	streams   context.Context
	endStream context.CancelFunc

	mu         sync.Mutex
	started    bool
	addr       string
	isolation  []string
	notApplied []string
	runErr     error
}

// New checks cfg, fills in its defaults and prepares the data directory:
// created 0700 (0711 when, as root, the sandbox workspaces are inside it, so
// the unprivileged sandbox users can pass through; with root's defaults,
// DefaultRootDataDir and DefaultRootSandboxDir, they are not), with a control-plane
// token in control-token unless cfg.Token is set, and a run-token signing
// key in signing-key, both 0600 and written on first start only. A missing
// or invalid setting is an error that names its environment variable.
func New(cfg Config) (*Main, error) {
	m := &Main{
		log:   cfg.Logger,
		now:   cfg.Now,
		ready: make(chan struct{}),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("%s (--addr) %q is not host:port: %w", EnvAddr, cfg.Addr, err)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.EventBufferSize < 0 {
		return nil, fmt.Errorf("event buffer size (--event-buffer) %d is negative", cfg.EventBufferSize)
	}
	if err := checkSandboxEventLimits(&cfg, m.log); err != nil {
		return nil, err
	}
	if n := cfg.MaxResumes; n != nil && (*n < 0 || *n > MaxMaxResumes) {
		return nil, fmt.Errorf("%s (--max-resumes) must be a whole number from 0 to %d", EnvMaxResumes, MaxMaxResumes)
	}
	if err := cfg.Storage.check(); err != nil {
		return nil, err
	}
	if err := m.configureUpstream(&cfg); err != nil {
		return nil, err
	}
	limits, err := runLimits(cfg.Limits, cfg.Model)
	if err != nil {
		return nil, err
	}
	if m.repoEvents, err = prepareRepoEvents(cfg.RepoEvents, limits); err != nil {
		return nil, err
	}
	m.limits = m.repoEvents.limits(limits)
	// A git source may name a repository served on this machine.
	m.limits.GitURLs.AllowLoopbackHTTP = true
	if cfg.Token != "" && len(cfg.Token) < httpapi.MinControlTokenLen {
		return nil, fmt.Errorf("%s is shorter than %d characters; use a long random value (or unset it to have one generated)", EnvToken, httpapi.MinControlTokenLen)
	}
	if m.launcher, err = chooseLauncher(cfg, thisMachine()); err != nil {
		return nil, err
	}
	if m.launcher.kind == LauncherProcess {
		if m.sandboxBin, err = findSandboxBin(cfg.SandboxBin, os.Executable, exec.LookPath); err != nil {
			return nil, err
		}
	}

	if cfg.DataDir == "" {
		// The same rule the CLI follows to find the token file.
		if cfg.DataDir = DefaultDataDir(os.LookupEnv); cfg.DataDir == "" {
			return nil, fmt.Errorf("no data directory: set %s (--data-dir), XDG_DATA_HOME or HOME", EnvDataDir)
		}
	}
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("%s (--data-dir): %w", EnvDataDir, err)
	}
	if cfg.SandboxDir == "" {
		cfg.SandboxDir = filepath.Join(cfg.DataDir, sandboxesDir)
		if cfg.DataDir == DefaultRootDataDir {
			// Root's defaults: the data directory stays owner-only,
			// the workspaces are beside it.
			cfg.SandboxDir = DefaultRootSandboxDir
		}
	}
	if cfg.SandboxDir, err = filepath.Abs(cfg.SandboxDir); err != nil {
		return nil, fmt.Errorf("%s (--sandbox-dir): %w", EnvSandboxDir, err)
	}
	if cfg.ImageCache == "" && m.launcher.kind == LauncherOCI {
		cfg.ImageCache = filepath.Join(cfg.DataDir, imagesDir)
		if cfg.DataDir == DefaultRootDataDir {
			// Root's defaults: the data directory stays owner-only, the
			// unpacked images are a cache beside it.
			cfg.ImageCache = DefaultRootImageCache
		}
	}
	perm := os.FileMode(0o700)
	// The process launcher's sandbox uids pass through the data directory
	// to their workspaces; the OCI launcher mounts those (runc opens them
	// as root), but each sandbox's user namespace root, an unprivileged
	// host id, passes through it to the image it mounts. Searching, not
	// listing: everything in it is owner-only.
	inside := func(dir string) bool { return strings.HasPrefix(dir, cfg.DataDir+string(filepath.Separator)) }
	if os.Geteuid() == 0 && (m.launcher.kind == LauncherProcess && inside(cfg.SandboxDir) || m.launcher.kind == LauncherOCI && inside(cfg.ImageCache)) {
		perm = 0o711
	}
	if err := prepareDataDir(cfg.DataDir, perm); err != nil {
		return nil, fmt.Errorf("%s (--data-dir): %w", EnvDataDir, err)
	}
	m.removeOldImageCache(cfg.DataDir, cfg.ImageCache)

	if cfg.Token != "" {
		m.token = cfg.Token
	} else {
		m.tokenFile = filepath.Join(cfg.DataDir, ControlTokenFile)
		tok, created, err := loadOrCreateSecret(m.tokenFile, cfg.Rand)
		if err != nil {
			return nil, fmt.Errorf("control-plane token: %w", err)
		}
		if len(tok) < httpapi.MinControlTokenLen {
			return nil, fmt.Errorf("control-plane token in %s is shorter than %d characters; remove the file to have a new one written", m.tokenFile, httpapi.MinControlTokenLen)
		}
		m.token = tok
		if created {
			m.log.Info("wrote a new control-plane token", "path", m.tokenFile)
		}
	}
	keyFile := filepath.Join(cfg.DataDir, SigningKeyFile)
	keyHex, _, err := loadOrCreateSecret(keyFile, cfg.Rand)
	if err != nil {
		return nil, fmt.Errorf("run-token signing key: %w", err)
	}
	if m.signingKey, err = hex.DecodeString(keyHex); err != nil || len(m.signingKey) < token.MinSecretLen {
		return nil, fmt.Errorf("run-token signing key %s must hold at least %d hex-encoded bytes; remove it to have a new one written", keyFile, token.MinSecretLen)
	}
	m.cfg = cfg
	m.streams, m.endStream = context.WithCancel(context.Background())
	return m, nil
}

// Token returns the control-plane token, for the CLI and tests. It is a
// secret: never log it.
func (m *Main) Token() string { return m.token }

// TokenFile returns the file the token was read from or written to, or ""
// when it came from BELAY_TOKEN.
func (m *Main) TokenFile() string { return m.tokenFile }

// DataDir returns the data directory in use.
func (m *Main) DataDir() string { return m.cfg.DataDir }

// SandboxDir returns the directory of the sandbox workspaces.
func (m *Main) SandboxDir() string { return m.cfg.SandboxDir }

// Model returns the one model runs may use.
func (m *Main) Model() string { return m.cfg.Model }

// SandboxBin returns the sandbox entry binary the process launcher
// starts, or "" with the OCI launcher (the entry is in the image).
func (m *Main) SandboxBin() string { return m.sandboxBin }

// Launcher returns the launcher sandboxes run with (LauncherOCI or
// LauncherProcess) and why it was chosen.
func (m *Main) Launcher() (kind, why string) { return m.launcher.kind, m.launcher.why }

// SandboxImage returns the OCI launcher's image archive, or "" with the
// process launcher.
func (m *Main) SandboxImage() string { return m.launcher.image }

// Ready is closed once Run listens (Addr is then set) or has failed.
func (m *Main) Ready() <-chan struct{} { return m.ready }

// Addr returns the bound listen address once Ready is closed, "" before:
// with port 0 in Config.Addr, the port the system chose.
func (m *Main) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// Isolation lists the isolation measures applied to every sandbox, once
// Ready is closed.
func (m *Main) Isolation() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.isolation...)
}

// NotApplied lists the isolation measures no sandbox gets, once Ready is
// closed: what the machine did not allow, and what a local process cannot
// have (localsandbox.WeakIsolation).
func (m *Main) NotApplied() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.notApplied...)
}

// Run opens the store, ends what a previous process left running
// (orchestrator.Recover), listens and serves until ctx ends or Close is
// called, then shuts down gracefully (see Close) and returns. It returns nil
// after a shutdown it was asked for, and an error if it could not start or
// serving failed.
func (m *Main) Run(ctx context.Context) (err error) {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("embedded: Run called twice")
	}
	m.started = true
	m.mu.Unlock()
	defer close(m.done)
	readyOnce := sync.OnceFunc(func() { close(m.ready) })
	defer readyOnce()

	var cleanups []func() error
	release := func() error {
		var errs []error
		for i := len(cleanups) - 1; i >= 0; i-- {
			errs = append(errs, cleanups[i]())
		}
		cleanups = nil
		return errors.Join(errs...)
	}
	defer func() {
		if rerr := release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		m.mu.Lock()
		m.runErr = err
		m.mu.Unlock()
	}()
	select {
	case <-m.stop:
		return errors.New("embedded: closed before Run")
	default:
	}

	st, err := openStorage(ctx, m.cfg, m.log)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, st.close)
	// Every writer in this process (handler, orchestrator) goes through the
	// watched store, so event streams wake on a write instead of a poll.
	watched := belay.WatchStore(st.store)
	// Each run a repository event started gets its safe outputs once it
	// ends: the store reports every state a run reaches.
	rt := &repoEventsRuntime{log: m.log}
	store, artifacts := belay.Store(belay.NotifyStore(watched, rt.onStatus)), st.artifacts
	signer, err := token.NewSigner(m.signingKey, m.now)
	if err != nil {
		return fmt.Errorf("run-token signer: %w", err)
	}

	upstream, stopUpstream, err := m.openUpstream(ctx)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, stopUpstream)

	// The launcher serves the handler's internal routes to each sandbox,
	// the orchestrator drives the launcher, and the handler drives the
	// orchestrator: the handler is built last and handed to the launcher
	// through this indirection, before any sandbox can exist.
	var api *httpapi.Server
	internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.InternalHandler().ServeHTTP(w, r)
	})
	launcher, closeLauncher, err := m.newLauncher(internal)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, closeLauncher)
	orch, err := orchestrator.New(orchestrator.Config{
		Store:      store,
		Artifacts:  artifacts,
		Launcher:   launcher,
		Signer:     signer,
		Logger:     m.log,
		Now:        m.now,
		StopGrace:  sandboxStopGrace,
		MaxResumes: orchestratorResumes(m.cfg.MaxResumes),
	})
	if err != nil {
		return err
	}
	runs, hooks, err := m.buildRepoEvents(store, artifacts, orch, m.limits, rt)
	if err != nil {
		return err
	}
	apiCfg := httpapi.Config{
		Store:              store,
		Artifacts:          artifacts,
		Orchestrator:       orch,
		Signer:             signer,
		Limits:             m.limits,
		Intake:             runs,
		ControlTokens:      []string{m.token},
		EventsChanged:      watched.Changed,
		SandboxEventLimits: m.cfg.SandboxEventLimits,
		Upstream:           upstream,
		Logger:             m.log,
		Now:                m.now,
		// Sessions: each turn's workspace built in memory with go-git.
		Workspaces: gitsource.Workspaces{},
	}
	if sources, ok := artifacts.(belay.SourceStore); ok {
		apiCfg.Sources = sources
	}
	if hooks != nil {
		apiCfg.Webhooks = hooks
	}
	api, err = httpapi.New(apiCfg)
	if err != nil {
		return err
	}
	// Cleanups run in reverse: the orchestrator stops its sandboxes first,
	// then the handler ends detached work (a model call whose sandbox is
	// gone) and waits for it, and only then do the stores close.
	cleanups = append(cleanups, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ShutdownTimeout)
		defer cancel()
		return api.Close(ctx)
	})
	// From here the orchestrator may run sandboxes; it stops them before
	// the store closes.
	cleanups = append(cleanups, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ShutdownTimeout)
		defer cancel()
		return orch.Close(ctx)
	})
	// Dispatches and publishes in flight finish first: they create and
	// submit runs and read the stores.
	cleanups = append(cleanups, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ShutdownTimeout)
		defer cancel()
		return rt.close(ctx)
	})
	if err := orch.Recover(ctx); err != nil {
		// A run that cannot be ended now is logged; the others were.
		m.log.Error("recover runs left by an earlier start", "err", err)
	}

	// Enough descriptors, and a cap on connections below them: a flood of
	// idle connections must not keep an authorised request out.
	files, err := raiseFileLimit()
	if err != nil {
		m.log.Warn("could not raise the open-file limit to its hard limit", "limit", files, "err", err.Error())
	}
	tcp, err := net.Listen("tcp", m.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s (%s, --addr): %w", m.cfg.Addr, EnvAddr, err)
	}
	ln := newConnLimiter(tcp, connectionCap(files), m.log, m.now)
	srv := &http.Server{
		Handler:           ln.track(m.endStreamsOnShutdown(api)),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnState:         ln.connState,
		ConnContext:       ln.connContext,
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
	}
	m.mu.Lock()
	m.addr = ln.Addr().String()
	m.isolation = launcher.Isolation()
	m.notApplied = launcher.NotApplied()
	m.mu.Unlock()
	if host, _, _ := net.SplitHostPort(m.addr); !httpapi.IsLoopbackHost(host) {
		m.log.Warn("listening beyond loopback over plain HTTP: the control-plane token crosses the network in clear; put TLS in front", "addr", m.addr)
	}
	m.log.Info("belay control plane listening", "addr", m.addr, "data_dir", m.cfg.DataDir, "model", m.cfg.Model,
		"open_file_limit", files, "max_connections", ln.max)
	readyOnce()

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		// Serve only returns on its own when accepting fails.
		_ = srv.Close()
		return fmt.Errorf("serve on %s: %w", m.addr, err)
	case <-ctx.Done():
	case <-m.stop:
	}
	return m.shutdown(srv, served)
}

// shutdown stops accepting, ends event streams (their readers resume with
// Last-Event-ID), and waits for every other in-flight request to finish.
// Run's deferred release then closes the orchestrator and the stores.
func (m *Main) shutdown(srv *http.Server, served <-chan error) error {
	m.log.Info("shutting down: finishing in-flight requests and runs")
	m.endStream()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err != nil {
		_ = srv.Close()
		err = fmt.Errorf("requests still in flight after %v: %w", m.cfg.ShutdownTimeout, err)
	}
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// endStreamsOnShutdown gives every event read a context that also ends at
// shutdown. An SSE stream only ends at its run's terminal event, so without
// this a graceful shutdown would wait for every followed run to finish.
func (m *Main) endStreamsOnShutdown(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(m.streams, cancel)
			defer stop()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}

// Close shuts the control plane down gracefully and waits until it has: it
// stops accepting connections, ends event streams, lets every other
// in-flight request finish, then closes the orchestrator (runs in flight
// are stopped and recorded as failed, "control plane shutting down"; queued
// runs stay queued for the next start), and closes the stores. Each stage
// is bounded by ShutdownTimeout. It returns Run's error, if any; calling it
// again returns the same.
func (m *Main) Close() error {
	m.stopOnce.Do(func() { close(m.stop) })
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	if !started {
		return nil
	}
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runErr
}

// checkSandboxEventLimits fills in the default caps on sandbox events and
// refuses a cap that is not positive. A count cap at or above the event
// buffer is allowed, with a warning: a sandbox could then push the control
// plane's own events out of its run's log.
func checkSandboxEventLimits(cfg *Config, log *slog.Logger) error {
	l, def := &cfg.SandboxEventLimits, belay.DefaultSandboxEventLimits()
	switch {
	case l.MaxEvents < 0:
		return fmt.Errorf("%s (--sandbox-events) must be a positive whole number", EnvSandboxEvents)
	case l.MaxBytes < 0:
		return fmt.Errorf("%s (--sandbox-event-bytes) must be a positive whole number", EnvSandboxEventBytes)
	}
	if l.MaxEvents == 0 {
		l.MaxEvents = def.MaxEvents
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = def.MaxBytes
	}
	buffer := cfg.EventBufferSize
	if buffer == 0 {
		buffer = belay.DefaultEventBufferSize
	}
	if l.MaxEvents >= buffer {
		log.Warn("the cap on a sandbox's events is not below the event buffer: a sandbox could push the control plane's own events out of its run's log",
			"sandbox_events", l.MaxEvents, "event_buffer", buffer)
	}
	return nil
}

// removeOldImageCache removes the unpacked images an earlier belay kept in
// <data dir>/oci/images (a cache of about 200 MB per image, made again
// from the image when needed), unless that is still the configured cache.
// A failure is logged: the old cache only costs disk space.
func (m *Main) removeOldImageCache(dataDir, cache string) {
	old := filepath.Join(dataDir, ociDir, imagesDir)
	if old == cache {
		return
	}
	if _, err := os.Lstat(old); err != nil {
		return
	}
	if err := os.RemoveAll(old); err != nil {
		m.log.Warn("could not remove the image cache an earlier belay left; remove it by hand", "path", old, "err", err.Error())
		return
	}
	m.log.Info("removed the image cache an earlier belay left", "path", old)
}
