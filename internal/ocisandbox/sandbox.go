package ocisandbox

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/hostids"
	"github.com/belay-dev/belay/internal/outputtail"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// APIBaseURL is the base URL the entry uses for the internal routes; over
// the Unix socket the host is only a name.
const APIBaseURL = "http://belay"

// nameSuffixBytes is the entropy in a sandbox's name after the run id, so
// a retried launch of the same run never meets an old folder or container.
const nameSuffixBytes = 6

// maxRunIDBytes bounds a run id used in a sandbox's name.
const maxRunIDBytes = 64

// startTimeout bounds how long Launch waits for runc to have created the
// container.
const startTimeout = 60 * time.Second

// cleanupKillWait bounds how long Cleanup waits for a killed sandbox's
// runc to exit before it removes the folder anyway.
const cleanupKillWait = 30 * time.Second

// The names in a sandbox's folder.
const (
	configFile   = "config.json"
	pidFile      = "pid"
	runcLogFile  = "runc.log"
	workspaceDir = "workspace"
	apiDir       = "api"
	socketName   = "api.sock"
)

// Sandbox is one sandbox running under runc. It implements belay.Sandbox.
type Sandbox struct {
	l     *Launcher
	runID string
	id    string // the container's id, also its folder's name
	dir   string
	log   *slog.Logger
	out   *outputtail.Buffer

	srv *http.Server
	ln  net.Listener

	// lease holds the host ids the sandbox's user namespace maps to until
	// its folder is gone.
	lease *hostids.Lease
	ids   HostIDs

	cmd   *exec.Cmd
	start time.Time
	done  chan struct{} // closed once runc has exited and the container is deleted

	mu      sync.Mutex
	exited  bool
	end     time.Time
	waitErr error
	exit    belay.SandboxExit

	cleanMu sync.Mutex
	cleaned bool
}

var _ belay.Launcher = (*Launcher)(nil)
var _ belay.Sandbox = (*Sandbox)(nil)

// Launch creates the sandbox's folder, serves the internal routes on its
// api.sock, and runs the image's entrypoint under runc in claim mode. It
// returns once runc has created the container (the entry is starting);
// everything it created is removed again when it fails. The claim code
// goes only into the entry's environment: never into a log line or an
// error, and runc's config.json that holds it is removed once runc has
// read it.
func (l *Launcher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", spec.RunID, err)
	}
	if err := belay.CheckArtifactRunID(spec.RunID); err != nil || len(spec.RunID) > maxRunIDBytes {
		return nil, fmt.Errorf("launch sandbox: run id %q cannot name a sandbox", spec.RunID)
	}
	claim := spec.Claim.Reveal()
	if claim == "" {
		return nil, fmt.Errorf("launch sandbox for run %s: no claim code", spec.RunID)
	}
	env := append(append([]string(nil), l.env...),
		workspace.EnvClaim+"="+claim,
		workspace.EnvAPIURL+"="+APIBaseURL,
		workspace.EnvAPISocket+"="+APISocketPath,
		// belay's uid is not mapped in the sandbox's user namespace, so
		// the entry sees its socket's listener as the overflow uid: a uid
		// no process of the sandbox can have (only its root and its user
		// are mapped), so a relay inside still fails the check.
		workspace.EnvAPIPeerUID+"="+strconv.Itoa(l.peerUID),
	)
	return l.start(ctx, spec.RunID, l.profile.Entrypoint, env, claim)
}

// start runs args with env in a new sandbox for runID; secret is blanked
// out of the output it keeps.
func (l *Launcher) start(ctx context.Context, runID string, args, env []string, secret string) (*Sandbox, error) {
	var suffix [nameSuffixBytes]byte
	if err := l.read(suffix[:]); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", runID, err)
	}
	id := runID + "-" + hex.EncodeToString(suffix[:])
	s := &Sandbox{
		l:     l,
		runID: runID,
		id:    id,
		dir:   filepath.Join(l.root, id),
		log:   l.log.With("run_id", runID, "container", id),
		out:   outputtail.New(outputtail.Max, secret),
		done:  make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			if err := s.Cleanup(); err != nil {
				s.log.Error("clean up after a failed launch", "err", err.Error())
			}
		}
	}()
	lease, err := hostids.Acquire(l.leaseDir, l.ids, filepath.Join(s.dir, workspaceDir))
	if err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", runID, err)
	}
	s.lease = lease
	s.ids = HostIDs{RootUID: lease.UID, RootGID: lease.GID, UID: lease.UID + 1, GID: lease.GID + 1}
	if err := s.prepare(l); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", runID, err)
	}
	spec, err := RuntimeSpec(l.profile, Bundle{
		Rootfs:      l.rootfs,
		Workspace:   filepath.Join(s.dir, workspaceDir),
		SocketDir:   filepath.Join(s.dir, apiDir),
		Args:        args,
		Env:         env,
		CgroupsPath: "/belay/" + id,
		HostIDs:     s.ids,
	})
	if err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", runID, err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: encode config.json: %w", runID, err)
	}
	if err := writeNew(filepath.Join(s.dir, configFile), b, 0o600); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: write config.json: %w", runID, err)
	}
	if err := s.run(ctx); err != nil {
		return nil, fmt.Errorf("launch sandbox for run %s: %w", runID, err)
	}
	ok = true
	s.log.Info("sandbox started", "image", l.image.Digest)
	return s, nil
}

// prepare makes the sandbox's folder: root's, with the workspace handed
// to the sandbox user's host ids and api/ holding the listening socket.
func (s *Sandbox) prepare(l *Launcher) error {
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return fmt.Errorf("create sandbox folder: %w", err)
	}
	ws := filepath.Join(s.dir, workspaceDir)
	if err := os.Mkdir(ws, 0o700); err != nil {
		return fmt.Errorf("create workspace: %w", err)
	}
	if err := os.Lchown(ws, s.ids.UID, s.ids.GID); err != nil {
		return fmt.Errorf("hand the workspace to the sandbox user: %w", err)
	}
	api := filepath.Join(s.dir, apiDir)
	if err := os.Mkdir(api, 0o755); err != nil {
		return fmt.Errorf("create api folder: %w", err)
	}
	if err := os.Chmod(api, 0o755); err != nil {
		return fmt.Errorf("create api folder: %w", err)
	}
	return s.serve(l, api)
}

// serve listens on api/api.sock and serves the internal routes there. The
// socket is bound through the folder's descriptor (/proc/self/fd/N/...),
// so the host path's length never meets the 108-byte limit of a socket
// address. It is root's and the sandbox group's (0660; the group is the
// sandbox's own host gid): the sandbox user can connect; only root can
// rename or remove it, and the folder is mounted read-only in the sandbox
// besides.
func (s *Sandbox) serve(l *Launcher, api string) error {
	dfd, err := unix.Open(api, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open api folder: %w", err)
	}
	defer unix.Close(dfd)
	viaFD := "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + socketName
	ln, err := net.Listen("unix", viaFD)
	if err != nil {
		return fmt.Errorf("listen on api.sock: %w", err)
	}
	// The folder is removed as a whole.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	sock := filepath.Join(api, socketName)
	err = os.Lchown(sock, 0, s.ids.GID)
	if err == nil {
		err = os.Chmod(sock, 0o660)
	}
	if err != nil {
		ln.Close()
		return fmt.Errorf("api.sock: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           l.internal,
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

// run starts `runc run` and waits until runc has created the container
// (its pid file exists) or has failed. runc stays the container's parent
// until the entry exits, and returns the entry's exit status (128+N when a
// signal N killed it). It is started from a goroutine locked to its OS
// thread, kept until runc exits: the kernel's parent-death signal follows
// the thread that forked, and SIGTERM on belay's death makes runc pass it
// to the entry, which then ends the run as a stopped task does.
func (s *Sandbox) run(ctx context.Context) error {
	l := s.l
	s.cmd = &exec.Cmd{
		Path: l.runtime,
		Args: []string{l.runtime, "--root", l.runcRoot, "--log", filepath.Join(s.dir, runcLogFile), "--log-format", "json",
			"run", "--keep", "--pid-file", filepath.Join(s.dir, pidFile), "--bundle", s.dir, s.id},
		Env:         []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Dir:         s.dir,
		Stdout:      s.out,
		Stderr:      s.out,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM},
		WaitDelay:   5 * time.Second,
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			close(s.done)
			started <- err
			return
		}
		s.start = l.now()
		started <- nil
		s.watch()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start runc: %w", err)
	}
	// The pid file appears once the container exists; until then runc
	// may still fail (and say why in its log).
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(filepath.Join(s.dir, pidFile)); err == nil {
			break
		}
		select {
		case <-s.done:
			if _, err := os.Stat(filepath.Join(s.dir, pidFile)); err == nil {
				// Created, and already over: Wait reports how.
				return s.dropConfig()
			}
			return fmt.Errorf("runc failed: %s", s.runcError())
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("runc did not create the container within %v", startTimeout)
		case <-tick.C:
		}
	}
	return s.dropConfig()
}

// dropConfig removes config.json, which holds the claim code in the
// entry's environment, once runc has read it.
func (s *Sandbox) dropConfig() error {
	if err := os.Remove(filepath.Join(s.dir, configFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove config.json: %w", err)
	}
	return nil
}

// watch waits for runc to exit, records how the entry ended and whether
// the kernel killed something in the sandbox for memory, then deletes the
// container (and its cgroup).
func (s *Sandbox) watch() {
	defer close(s.done)
	err := s.cmd.Wait()
	end := s.l.now()
	exit := belay.SandboxExit{Duration: end.Sub(s.start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		ws := ee.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			// runc itself was killed; the container is deleted below.
			exit.Signaled, exit.ExitCode = true, 128+int(ws.Signal())
		case ws.ExitStatus() > 128 && ws.ExitStatus() <= 128+64:
			// runc reports an entry killed by signal N as 128+N.
			exit.Signaled, exit.ExitCode = true, ws.ExitStatus()
		default:
			exit.ExitCode = ws.ExitStatus()
		}
	case errors.Is(err, exec.ErrWaitDelay):
		s.log.Warn("sandbox output stayed open after runc exited; closed it")
	default:
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
	}
	if n, err := oomKills("/belay/" + s.id); err != nil {
		s.log.Warn("read the sandbox's OOM kills", "err", err.Error())
	} else if n > 0 {
		exit.OOMKilled = true
		s.log.Warn("the kernel killed processes of the sandbox at its memory limit", "oom_kills", n, "memory_mib", s.l.profile.MemoryMiB)
	}
	ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout)
	defer cancel()
	if _, err := s.l.runc(ctx, "delete", "--force", s.id); err != nil {
		s.log.Warn("delete container", "err", err.Error())
	}
	s.mu.Lock()
	s.exited, s.end, s.exit = true, end, exit
	s.mu.Unlock()
}

// oomKills reads how many processes the kernel's OOM killer ended in the
// cgroup at path: memory.oom_control's oom_kill under cgroup v1,
// memory.events' oom_kill under v2.
func oomKills(path string) (int, error) {
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", path, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", path, "memory.events"),
	} {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				return strconv.Atoi(strings.TrimSpace(v))
			}
		}
		return 0, fmt.Errorf("%s has no oom_kill line", f)
	}
	return 0, fmt.Errorf("no memory cgroup at %s", path)
}

// runcError is the last error runc logged, or the last line of its output.
func (s *Sandbox) runcError() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, runcLogFile))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal([]byte(lines[i]), &rec) == nil && rec.Level == "error" {
			return rec.Msg
		}
	}
	if l := s.out.LastLine(outputtail.MaxLoggedLine); l != "" {
		return l
	}
	return "no message"
}

// ID is the container's id (runc --root <state>/runc state ID).
func (s *Sandbox) ID() string { return s.id }

// Workspace is the host folder mounted at the sandbox's workspace.
func (s *Sandbox) Workspace() string { return filepath.Join(s.dir, workspaceDir) }

// OutputTail is the end of what the entry wrote to stdout and stderr, with
// the claim code blanked out.
func (s *Sandbox) OutputTail() string { return s.out.Tail() }

// Wait blocks until the entry exits or ctx ends. When ctx ends first it
// returns ctx's error and leaves the sandbox running: stopping it is the
// caller's decision (Stop). The exit carries no files: the entry uploads
// its outputs itself.
func (s *Sandbox) Wait(ctx context.Context) (belay.SandboxExit, error) {
	select {
	case <-s.done:
	case <-ctx.Done():
		return belay.SandboxExit{}, fmt.Errorf("wait for sandbox of run %s: %w", s.runID, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitErr != nil {
		return belay.SandboxExit{}, fmt.Errorf("wait for sandbox of run %s: %w", s.runID, s.waitErr)
	}
	attrs := []any{"exit_code", s.exit.ExitCode, "signaled", s.exit.Signaled, "oom_killed", s.exit.OOMKilled,
		"duration", s.exit.Duration.String(), "output_bytes", s.out.Total()}
	if s.exit.ExitCode != 0 {
		attrs = append(attrs, "last_output_line", s.out.LastLine(outputtail.MaxLoggedLine))
		s.log.Warn("sandbox exited", attrs...)
	} else {
		s.log.Info("sandbox exited", attrs...)
	}
	return s.exit, nil
}

// Stop kills the sandbox (every process in it: the entry is its PID
// namespace's init) and waits until runc has exited or ctx ends. Stopping
// a sandbox that has already exited does nothing.
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
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	_, err := s.l.runc(context.Background(), "kill", s.id, "KILL")
	if err == nil {
		return nil
	}
	select {
	case <-s.done:
		return nil // it ended meanwhile
	default:
	}
	// The container may not exist yet (runc still creating it) or any
	// more: stop runc itself, which kills a container it is creating.
	if kerr := s.cmd.Process.Signal(syscall.SIGKILL); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
		return fmt.Errorf("runc kill: %w; kill runc: %w", err, kerr)
	}
	return nil
}

// Cleanup kills the sandbox if it still runs, deletes its container,
// closes its internal API server and removes its folder, including
// whatever the sandbox user left in the workspace. It is idempotent; after
// a failure it can be called again.
func (s *Sandbox) Cleanup() error {
	s.cleanMu.Lock()
	defer s.cleanMu.Unlock()
	if s.cleaned {
		return nil
	}
	if err := s.kill(); err != nil {
		s.log.Warn("kill sandbox", "err", err.Error())
	}
	if s.cmd != nil && s.cmd.Process != nil {
		t := time.NewTimer(cleanupKillWait)
		select {
		case <-s.done:
		case <-t.C:
			s.log.Error("runc did not exit after SIGKILL; deleting the container and removing its folder anyway")
			ctx, cancel := context.WithTimeout(context.Background(), runtimeTimeout)
			_, _ = s.l.runc(ctx, "delete", "--force", s.id)
			cancel()
		}
		t.Stop()
	}
	if s.srv != nil {
		// Close, not Shutdown: a model call in flight for a sandbox that is
		// gone has nobody to answer.
		if err := s.srv.Close(); err != nil {
			s.log.Warn("close internal API server", "err", err.Error())
		}
		_ = s.ln.Close()
	}
	if err := os.RemoveAll(s.dir); err != nil {
		// The host ids stay leased: files they own are still there.
		return fmt.Errorf("clean up sandbox of run %s: %w", s.runID, err)
	}
	if s.lease != nil {
		s.lease.Release()
	}
	s.cleaned = true
	s.log.Info("sandbox cleaned up")
	return nil
}

// isSandboxName reports whether name is what start names a sandbox: a run
// id, a dash, and the hex suffix.
func isSandboxName(name string) bool {
	i := strings.LastIndexByte(name, '-')
	if i < 1 || len(name)-i-1 != 2*nameSuffixBytes || belay.CheckArtifactRunID(name[:i]) != nil {
		return false
	}
	_, err := hex.DecodeString(name[i+1:])
	return err == nil && strings.ToLower(name[i+1:]) == name[i+1:]
}

// writeNew creates path exclusively (never through a symbolic link) with
// mode perm and writes data.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
