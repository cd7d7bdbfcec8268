package localsandbox

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
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/hostids"
	"github.com/belay-dev/belay/internal/outputtail"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// sandboxLANG is the entry's locale. Its whole environment is PATH
// (workspace.CleanPath), HOME and LANG: nothing from belay's own.
const sandboxLANG = "C.UTF-8"

// APIBaseURL is the base URL the entry uses for the internal routes; over
// the Unix socket the host is only a name.
const APIBaseURL = "http://belay"

// waitDelay bounds how long a sandbox's exit waits for its output pipe to
// close when something it started outlived it outside its process group.
const waitDelay = 5 * time.Second

// cleanupKillWait bounds how long Cleanup waits for a killed sandbox to be
// reaped before it removes the workspace anyway.
const cleanupKillWait = 30 * time.Second

// Sandbox is one running local sandbox. It implements belay.Sandbox.
type Sandbox struct {
	runID string
	ws    string
	log   *slog.Logger
	now   func() time.Time
	owner int // the uid its output files must belong to
	// lease, when set, holds the sandbox's own uid and gid host-wide.
	lease *hostids.Lease
	out   *outputtail.Buffer

	srv *http.Server
	ln  net.Listener

	cmd   *exec.Cmd
	pid   int
	start time.Time
	done  chan struct{} // closed once the entry has exited and been reaped

	mu      sync.Mutex
	exited  bool // the entry has exited (it may not be reaped yet)
	end     time.Time
	waitErr error

	resultOnce sync.Once
	result     belay.SandboxExit
	resultErr  error

	cleanMu sync.Mutex
	created bool // the workspace exists and is this sandbox's to remove
	cleaned bool
}

var _ belay.Launcher = (*Launcher)(nil)
var _ belay.Sandbox = (*Sandbox)(nil)

// Launch creates a fresh workspace for spec, serves the internal routes on
// its api.sock, and starts the entry in it. It returns once the entry is
// running; everything it created is removed again when it fails. The
// tokens go only into the owner-only token files: not into spec.json, the
// entry's environment, a log line or an error.
func (l *Launcher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
	}
	if err := checkRunID(spec.RunID); err != nil {
		return nil, fmt.Errorf("launch sandbox: %w", err)
	}
	log := l.log.With("run_id", spec.RunID)
	tokens := map[string]string{
		workspace.ModelTokenFile:     spec.Tokens.Model,
		workspace.EventsTokenFile:    spec.Tokens.Events,
		workspace.ApprovalsTokenFile: spec.Tokens.Approvals,
	}
	for name, tok := range tokens {
		if tok == "" {
			return nil, fmt.Errorf("launch sandbox for run %s: the %s is empty", spec.RunID, name)
		}
	}

	var suffix [workspaceSuffixBytes]byte
	if err := l.read(suffix[:]); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
	}
	ws := filepath.Join(l.root, spec.RunID+"-"+hex.EncodeToString(suffix[:]))
	socket := filepath.Join(ws, workspace.Socket)
	if len(socket) > maxSocketPath {
		return nil, fmt.Errorf("launch sandbox for run %s: socket path %s is %d bytes, more than a Unix socket allows (%d); choose a shorter WorkRoot", spec.RunID, socket, len(socket), maxSocketPath)
	}

	s := &Sandbox{
		runID: spec.RunID,
		ws:    ws,
		log:   log,
		now:   l.now,
		owner: os.Geteuid(),
		out:   outputtail.New(outputtail.Max, spec.Tokens.Model, spec.Tokens.Events, spec.Tokens.Approvals),
		done:  make(chan struct{}),
	}
	uid, gid := l.uid, l.gid
	if l.tier.dropsUID {
		lease, err := hostids.Acquire(l.leaseDir, hostids.Range{FirstUID: l.uid, FirstGID: l.gid, Slots: l.ids}, ws)
		if err != nil {
			return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
		}
		uid, gid = lease.UID, lease.GID
		s.owner = uid
		s.lease = lease
	}
	ok := false
	defer func() {
		if ok {
			return
		}
		if err := s.removeWorkspace(); err != nil {
			// The uid stays leased: files it owns are still there.
			log.Error("remove workspace after failed launch", "workspace", ws, "err", err.Error())
			return
		}
		if s.lease != nil {
			s.lease.Release()
		}
	}()

	if err := os.Mkdir(ws, 0o700); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: create workspace: %w", spec.RunID, err)
	}
	s.created = true
	if err := s.serve(l.internal); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
	}
	spec.APISocket = socket
	spec.APIBaseURL = APIBaseURL
	// The entry talks only to a listener of belay's uid; in a tier where
	// the sandbox runs as belay's uid too, it cannot tell them apart.
	belayUID := os.Geteuid()
	spec.APIPeerUID, spec.APIPeerSharesUID = &belayUID, !l.tier.dropsUID
	chownTo := -1
	if s.owner != os.Geteuid() {
		chownTo = s.owner
	}
	if err := layoutWorkspace(ws, spec, tokens, chownTo, gid); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
	}

	path, argv := l.entry, []string{l.entry, "--workspace", ws}
	if l.prlimit != "" {
		path, argv = l.prlimit, prlimitArgs(l.prlimit, l.limits, argv)
	}
	s.cmd = &exec.Cmd{
		Path: path,
		Args: argv,
		Env: []string{
			"PATH=" + workspace.CleanPath,
			"HOME=" + filepath.Join(ws, workspace.HomeDir),
			"LANG=" + sandboxLANG,
		},
		Dir:         ws,
		Stdout:      s.out,
		Stderr:      s.out,
		SysProcAttr: l.tier.sysAttrs(uid, gid),
		WaitDelay:   waitDelay,
	}
	// prlimit reports a missing entry only once started; say it here.
	if _, err := os.Stat(l.entry); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: start entry: %w", spec.RunID, err)
	}
	if err := s.startAndWatch(); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: start entry: %w", spec.RunID, err)
	}
	ok = true
	log.Info("sandbox started", "pid", s.pid, "uid", uid, "workspace", ws, "isolation", l.tier.name)
	return s, nil
}

// serve starts the HTTP server for the internal routes on the workspace's
// api.sock. The socket is created while the workspace is still belay's
// alone; layoutWorkspace then lets the sandbox's group connect to it.
func (s *Sandbox) serve(h http.Handler) error {
	ln, err := net.Listen("unix", filepath.Join(s.ws, workspace.Socket))
	if err != nil {
		return fmt.Errorf("listen on api.sock: %w", err)
	}
	// The workspace is removed as a whole; the sandbox may have replaced
	// the name by then.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(filepath.Join(s.ws, workspace.Socket), 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("chmod api.sock: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("internal API server on api.sock stopped", "err", err.Error())
		}
	}()
	return nil
}

// startAndWatch starts the entry from a goroutine locked to its OS thread
// and keeps that thread until the entry has been reaped: the kernel's
// parent-death signal follows the thread that forked the child, not the
// process, so a thread the Go runtime retired would kill a healthy
// sandbox.
func (s *Sandbox) startAndWatch() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		s.pid = s.cmd.Process.Pid
		s.start = s.now()
		started <- nil
		s.watch()
	}()
	return <-started
}

// watch waits for the entry to exit, kills what is left of its process
// group while the group's id cannot yet be reused (the entry is a zombie
// until reaped), then reaps it.
func (s *Sandbox) watch() {
	defer close(s.done)
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, s.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil || !errors.Is(err, unix.EINTR) {
			if err != nil {
				s.log.Error("wait for sandbox entry", "pid", s.pid, "err", err.Error())
			}
			break
		}
	}
	s.mu.Lock()
	s.exited = true
	s.end = s.now()
	if err := unix.Kill(-s.pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		s.log.Warn("kill what is left of the sandbox's process group", "pid", s.pid, "err", err.Error())
	}
	s.mu.Unlock()

	err := s.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil, errors.As(err, &ee):
	case errors.Is(err, exec.ErrWaitDelay):
		s.log.Warn("sandbox output stayed open after it exited; closed it", "pid", s.pid)
	default:
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
	}
}

// PID is the entry's process id in belay's PID namespace, for diagnostics.
func (s *Sandbox) PID() int { return s.pid }

// Workspace is the sandbox's workspace directory.
func (s *Sandbox) Workspace() string { return s.ws }

// OutputTail is the end of what the entry wrote to stdout and stderr, with
// the run's tokens blanked out: enough to explain a crash, never the whole
// output.
func (s *Sandbox) OutputTail() string { return s.out.Tail() }

// Wait blocks until the entry exits or ctx ends. When ctx ends first it
// returns ctx's error and leaves the sandbox running: stopping it is the
// caller's decision (Stop). It reads nothing the sandbox left: the entry
// uploads its outputs through the internal API itself.
func (s *Sandbox) Wait(ctx context.Context) (belay.SandboxExit, error) {
	select {
	case <-s.done:
	case <-ctx.Done():
		return belay.SandboxExit{}, fmt.Errorf("wait for sandbox of run %s: %w", s.runID, ctx.Err())
	}
	s.resultOnce.Do(func() {
		s.mu.Lock()
		waitErr, end := s.waitErr, s.end
		s.mu.Unlock()
		if waitErr != nil {
			s.resultErr = fmt.Errorf("wait for sandbox of run %s: %w", s.runID, waitErr)
			return
		}
		exit := belay.SandboxExit{Duration: end.Sub(s.start)}
		ws := s.cmd.ProcessState.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			exit.Signaled = true
			exit.ExitCode = 128 + int(ws.Signal())
		default:
			exit.ExitCode = ws.ExitStatus()
		}
		attrs := []any{"exit_code", exit.ExitCode, "signaled", exit.Signaled,
			"duration", exit.Duration.String(), "output_bytes", s.out.Total()}
		if exit.ExitCode != 0 {
			attrs = append(attrs, "last_output_line", s.out.LastLine(outputtail.MaxLoggedLine))
			s.log.Warn("sandbox exited", attrs...)
		} else {
			s.log.Info("sandbox exited", attrs...)
		}
		s.result = exit
	})
	return s.result, s.resultErr
}

// Stop kills the sandbox's process group with SIGKILL and waits until the
// entry has been reaped or ctx ends. In a PID namespace the entry is its
// init, so killing it kills everything in the namespace. Stopping a
// sandbox that has already exited does nothing.
func (s *Sandbox) Stop(ctx context.Context) error {
	if err := s.kill(); err != nil {
		return fmt.Errorf("stop sandbox of run %s: %w", s.runID, err)
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop sandbox of run %s: %w", s.runID, ctx.Err())
	}
}

func (s *Sandbox) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited {
		return nil
	}
	if err := unix.Kill(-s.pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", s.pid, err)
	}
	return nil
}

// Cleanup kills the sandbox if it still runs, closes its internal API
// server and removes its workspace, including whatever the sandbox user
// left there. It is idempotent; after a failure it can be called again.
func (s *Sandbox) Cleanup() error {
	s.cleanMu.Lock()
	defer s.cleanMu.Unlock()
	if s.cleaned {
		return nil
	}
	if err := s.kill(); err != nil {
		return fmt.Errorf("clean up sandbox of run %s: %w", s.runID, err)
	}
	reaped := true
	t := time.NewTimer(cleanupKillWait)
	select {
	case <-s.done:
	case <-t.C:
		reaped = false
		s.log.Error("sandbox was not reaped after SIGKILL; removing its workspace anyway, keeping its uid reserved", "pid", s.pid)
	}
	t.Stop()
	if err := s.removeWorkspace(); err != nil {
		return fmt.Errorf("clean up sandbox of run %s: %w", s.runID, err)
	}
	s.cleaned = true
	// The uid is free again only once nothing of the sandbox is left:
	// its processes reaped, its files removed.
	if reaped && s.lease != nil {
		s.lease.Release()
	}
	s.log.Info("sandbox cleaned up")
	return nil
}

// removeWorkspace closes the API server and removes the workspace.
func (s *Sandbox) removeWorkspace() error {
	if s.srv != nil {
		// Close, not Shutdown: a model call in flight for a sandbox that is
		// gone has nobody to answer.
		if err := s.srv.Close(); err != nil {
			s.log.Warn("close internal API server", "err", err.Error())
		}
		// Close also closes the listener once Serve has taken it; this
		// covers a Close that came first.
		_ = s.ln.Close()
	}
	if !s.created {
		return nil
	}
	return removeTree(s.ws)
}
