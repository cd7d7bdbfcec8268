package ocisandbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/ocisandbox"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
)

// newLauncher starts a launcher on the real image with profile p (nil:
// hardening.Sandbox) and a handler that answers every internal request
// with 204, in folders of the test's own.
func newLauncher(t *testing.T, p *hardening.Profile) *ocisandbox.Launcher {
	t.Helper()
	return newLauncherWith(t, func(c *ocisandbox.Config) { c.Profile = p })
}

// newLauncherWith starts a launcher as newLauncher does, with change
// applied to its configuration.
func newLauncherWith(t *testing.T, change func(*ocisandbox.Config)) *ocisandbox.Launcher {
	t.Helper()
	img := ocisandboxtest.Image(t)
	dir := t.TempDir()
	cfg := ocisandbox.Config{
		Image:      img,
		ImageCache: ocisandboxtest.Cache(t),
		StateDir:   filepath.Join(dir, "state"),
		WorkRoot:   filepath.Join(dir, "sandboxes"),
		Internal:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		Logger:     slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	change(&cfg)
	l, err := ocisandbox.New(cfg)
	if err != nil {
		t.Fatalf("ocisandbox.New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// runCommand runs args in a sandbox to its end and returns how it ended
// and what it printed.
func runCommand(t *testing.T, l *ocisandbox.Launcher, args ...string) (exitCode int, signaled, oom bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := l.StartCommand(ctx, "run_probe", args, nil)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	exit, err := s.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return exit.ExitCode, exit.Signaled, exit.OOMKilled, s.OutputTail()
}

// TestProbe runs the probe as the sandbox's only process and checks every
// isolation measure from inside (ocisandboxtest.CheckProbe): the user,
// capabilities, no_new_privs, seccomp, the read-only root, the network
// (loopback only: the host's listeners are out of reach), the host's Unix
// sockets (a 0777 one in the host's /tmp and an abstract one), its own
// /proc, unshare and mount, setuid files, the private size-capped scratch
// folders, and api.sock, which it can connect to but not rename or
// remove.
func TestProbe(t *testing.T) {
	l := newLauncher(t, nil)
	targets := ocisandboxtest.ListenOnHost(t, ocisandbox.APISocketPath)
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", ocisandboxtest.ProbeScript, targets.JSON())
	if code != 0 {
		t.Errorf("probe exited %d: %s", code, out)
	}
	r := ocisandboxtest.ParseProbe(t, out)
	ocisandboxtest.CheckProbe(t, r, targets, hardening.Sandbox, "python3", "unshare")
	// The probe is PID 1 and its unshare child is gone: /proc shows the
	// probe alone.
	if len(r.PIDs) != 1 {
		t.Errorf("/proc shows pids %v (%q); want only the probe's", r.PIDs, r.Cmdlines)
	}
	if len(r.ScratchBefore) != 0 {
		t.Errorf("scratch folders not empty at the start: %v", r.ScratchBefore)
	}
}

// TestScratchIsPrivate runs two sandboxes one after the other: what the
// first leaves in /tmp, /var/tmp and /dev/shm is not there for the second.
func TestScratchIsPrivate(t *testing.T) {
	l := newLauncher(t, nil)
	const write = `for d in /tmp /var/tmp /dev/shm; do echo secret > $d/left-behind || exit 1; done; ls /tmp /var/tmp /dev/shm`
	if code, _, _, out := runCommand(t, l, "/bin/sh", "-c", write); code != 0 {
		t.Fatalf("first sandbox exited %d: %s", code, out)
	}
	code, _, _, out := runCommand(t, l, "/bin/sh", "-c", `cat /tmp/left-behind /var/tmp/left-behind /dev/shm/left-behind 2>&1; exit 0`)
	if code != 0 || strings.Contains(out, "secret") || strings.Count(out, "No such file") != 3 {
		t.Errorf("second sandbox read (exit %d): %q; want three missing files", code, out)
	}
}

// TestMemoryLimit allocates past a (small) memory limit: the kernel kills
// the process, and the exit says it was for memory.
func TestMemoryLimit(t *testing.T) {
	p := hardening.Sandbox
	p.MemoryMiB = 128
	l := newLauncher(t, &p)
	code, signaled, oom, out := runCommand(t, l, "/usr/bin/python3", "-c", "b = bytearray(512 << 20); print('allocated', flush=True)")
	if !oom || !signaled || code != 128+9 {
		t.Errorf("exit %d, signaled %v, OOM killed %v (output %q); want killed by SIGKILL at the memory limit", code, signaled, oom, out)
	}
	if strings.Contains(out, "allocated") {
		t.Error("the allocation past the limit succeeded")
	}
	// Under the limit nothing is reported.
	code, _, oom, out = runCommand(t, l, "/usr/bin/python3", "-c", "b = bytearray(16 << 20)")
	if code != 0 || oom {
		t.Errorf("a small allocation: exit %d, OOM killed %v (%q)", code, oom, out)
	}
}

// TestProcessLimit forks until the kernel refuses: the sandbox never holds
// more processes than the profile allows.
func TestProcessLimit(t *testing.T) {
	p := hardening.Sandbox
	p.Processes = 40
	l := newLauncher(t, &p)
	const forker = `
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print("refused after", n, e.errno, flush=True)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
`
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", forker)
	var n, errno int
	if _, err := fmt.Sscanf(strings.TrimSpace(lastOutputLine(out)), "refused after %d %d", &n, &errno); err != nil {
		t.Fatalf("exit %d, output %q: %v", code, out, err)
	}
	if n >= p.Processes || n < p.Processes-5 || errno != 11 {
		t.Errorf("forked %d processes before EAGAIN (errno %d); want just under %d", n, errno, p.Processes)
	}
}

// TestFileSizeLimit writes past a (small) file size limit.
func TestFileSizeLimit(t *testing.T) {
	p := hardening.Sandbox
	p.FileSizeMiB = 1
	l := newLauncher(t, &p)
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", `
import errno
try:
    open("/workspace/big", "wb").write(b"x" * (2 << 20))
    print("wrote")
except OSError as e:
    print("refused", errno.errorcode[e.errno])
`)
	if code != 0 || !strings.Contains(out, "refused EFBIG") {
		t.Errorf("exit %d, output %q; want EFBIG", code, out)
	}
}

func lastOutputLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// TestStopAndCleanup stops a sandbox that would run for a minute: Stop
// kills it, Cleanup removes its folder and runc keeps no container.
func TestStopAndCleanup(t *testing.T) {
	l := newLauncher(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := l.StartCommand(ctx, "run_stop", []string{"/bin/sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Workspace(), "..", "config.json")); !os.IsNotExist(err) {
		t.Errorf("config.json (which holds the claim code) is still there after the start: %v", err)
	}
	start := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	exit, err := s.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !exit.Signaled || exit.OOMKilled || time.Since(start) > 30*time.Second {
		t.Errorf("exit %+v after Stop; want killed by a signal, not OOM", exit)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.Workspace())); !os.IsNotExist(err) {
		t.Errorf("the sandbox folder is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/belay", s.ID())); !os.IsNotExist(err) {
		t.Errorf("the sandbox's cgroup is still there: %v", err)
	}
}

// TestLaunchFailureSaysWhy starts a program the image does not have.
func TestLaunchFailureSaysWhy(t *testing.T) {
	l := newLauncher(t, nil)
	_, err := l.StartCommand(context.Background(), "run_missing", []string{"/no/such/program"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("err = %v, want runc's reason (no such file)", err)
	}
}

// TestOneLauncherPerStateDir: a second launcher on the same state folder
// is refused, and once the first is gone, a new one removes what it left.
func TestOneLauncherPerStateDir(t *testing.T) {
	img := ocisandboxtest.Image(t)
	dir := t.TempDir()
	cfg := ocisandbox.Config{
		Image:      img,
		ImageCache: ocisandboxtest.Cache(t),
		StateDir:   filepath.Join(dir, "state"),
		WorkRoot:   filepath.Join(dir, "sandboxes"),
		Internal:   http.NotFoundHandler(),
	}
	first, err := ocisandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ocisandbox.New(cfg); err == nil || !strings.Contains(err.Error(), "another belay serve") {
		t.Errorf("second launcher: err = %v, want a refusal", err)
	}
	s, err := first.StartCommand(context.Background(), "run_left", []string{"/bin/sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first launcher dies without cleaning up.
	first.Close()
	if _, err := ocisandbox.New(cfg); err != nil {
		t.Fatalf("launcher after the first died: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Wait(ctx); err != nil {
		t.Errorf("the sandbox left behind was not ended: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.Workspace())); !os.IsNotExist(err) {
		t.Errorf("the folder left behind is still there: %v", err)
	}
}

// TestImageCacheMustBeReachable: below a folder others cannot search
// (t.TempDir's are 0700), the sandboxes' user namespace root could not
// mount the image; New refuses at once and names the folder.
func TestImageCacheMustBeReachable(t *testing.T) {
	closed := t.TempDir()
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	img := ocisandboxtest.Image(t)
	dir := t.TempDir()
	_, err := ocisandbox.New(ocisandbox.Config{
		Image:      img,
		ImageCache: filepath.Join(closed, "images"),
		StateDir:   filepath.Join(dir, "state"),
		WorkRoot:   filepath.Join(dir, "sandboxes"),
		Internal:   http.NotFoundHandler(),
	})
	if err == nil || !strings.Contains(err.Error(), closed+" (mode 0700) does not let others search it") {
		t.Errorf("New with the image cache below a 0700 folder: err = %v; want it to name %s", err, closed)
	}
}
