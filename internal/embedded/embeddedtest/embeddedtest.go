// Package embeddedtest starts the embedded control plane (embedded.Main)
// for tests: on 127.0.0.1 port 0, in temporary directories, with the
// scripted model session as the upstream, and shut down gracefully when the
// test ends. The CLI's tests and end-to-end tests share it.
package embeddedtest

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
)

// Logs collects a Main's log output from concurrent goroutines, so a test
// can assert that no secret reached it.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// ModuleRoot returns the directory of belay's go.mod, found from the
// test's working directory upwards.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("embeddedtest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// SandboxDir returns a new, short directory for sandbox workspaces: a Unix
// socket path inside it must stay under 108 bytes, and as root the
// unprivileged sandbox users must be able to search it (mode 0711) while
// no folder above it is writable by them, so it is not in /tmp (see
// workspacetest.Dir). It is removed when the test ends.
func SandboxDir(tb testing.TB) string {
	tb.Helper()
	return workspacetest.Dir(tb, "bsx")
}

// InertSandbox returns an executable that exits at once with status 64,
// for tests of the control plane itself that never need a sandbox to do
// any work: a run that reaches it fails, its sandbox having left no result.
func InertSandbox(tb testing.TB) string {
	tb.Helper()
	return script(tb, "#!/bin/sh\nexit 64\n")
}

// IdleSandbox returns an executable that waits until it is stopped, for
// tests that need a run to stay running (until cancel, wall time or
// shutdown) without a sandbox doing any work.
func IdleSandbox(tb testing.TB) string {
	tb.Helper()
	return script(tb, "#!/bin/sh\nexec /bin/sleep 3600\n")
}

func script(tb testing.TB, content string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "bsb")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, embedded.SandboxBinName)
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		tb.Fatal(err)
	}
	return path
}

// RealSandbox builds the sandbox entry (./sandbox-task) into the test's
// temporary directory and returns its path; the Go build cache makes every
// build after the first quick. Where sandbox-task has no Go package yet, it
// skips the test outside CI and fails it in CI.
func RealSandbox(tb testing.TB) string {
	tb.Helper()
	root := ModuleRoot(tb)
	if m, _ := filepath.Glob(filepath.Join(root, "sandbox-task", "*.go")); len(m) == 0 {
		if os.Getenv("CI") != "" {
			tb.Fatal("sandbox-task has no Go package: the sandbox entry must exist in CI")
		}
		tb.Skip("sandbox-task has no Go package yet; the end-to-end run needs the sandbox entry (go build ./sandbox-task)")
	}
	entry := filepath.Join(tb.TempDir(), embedded.SandboxBinName)
	cmd := exec.Command("go", "build", "-o", entry, "./sandbox-task")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./sandbox-task: %v\n%s", err, out)
	}
	return entry
}

// Config returns a configuration for a test: port 0 on loopback, a fresh
// data directory, short sandbox directory, the example scripted session
// (examples/sessions/fix-calc.json) as the upstream, the process launcher
// (explicitly, with its weaker isolation accepted: these tests are of the
// control plane, and their sandboxes are stand-ins) with the inert
// sandbox, and debug logs into logs (when not nil). OCI switches it to
// the OCI launcher and the real image.
func Config(tb testing.TB, logs *Logs) embedded.Config {
	tb.Helper()
	cfg := embedded.Config{
		Addr:               "127.0.0.1:0",
		DataDir:            filepath.Join(tb.TempDir(), "data"),
		SandboxDir:         SandboxDir(tb),
		SandboxBin:         InertSandbox(tb),
		Launcher:           embedded.LauncherProcess,
		AllowWeakIsolation: true,
		ScriptedModel:      filepath.Join(ModuleRoot(tb), "examples", "sessions", "fix-calc.json"),
		Logger:             slog.New(slog.DiscardHandler),
	}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// Start builds a Main from cfg, runs it, and waits until it listens. The
// test's cleanup closes it gracefully and fails the test if Close or Run
// reports an error.
func Start(tb testing.TB, cfg embedded.Config) *embedded.Main {
	tb.Helper()
	m, err := embedded.New(cfg)
	if err != nil {
		tb.Fatalf("embedded.New: %v", err)
	}
	return Run(tb, m)
}

// Run runs m, waits until it listens, and closes it when the test ends.
func Run(tb testing.TB, m *embedded.Main) *embedded.Main {
	tb.Helper()
	ran := make(chan error, 1)
	go func() { ran <- m.Run(context.Background()) }()
	<-m.Ready()
	if m.Addr() == "" {
		tb.Fatalf("embedded.Main did not start: %v", <-ran)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Errorf("close embedded.Main: %v", err)
		}
		if err := <-ran; err != nil {
			tb.Errorf("embedded.Main.Run: %v", err)
		}
	})
	return m
}

// OCI switches cfg to the OCI launcher with the sandbox image that
// make test builds (ocisandboxtest.Image: it skips the test outside CI
// when the image, runc or root is missing, and fails it in CI), sharing
// the unpacked image between tests, with the weaker isolation no longer
// accepted.
func OCI(tb testing.TB, cfg *embedded.Config) {
	tb.Helper()
	cfg.Launcher = embedded.LauncherOCI
	cfg.AllowWeakIsolation = false
	cfg.SandboxBin = ""
	cfg.SandboxImage = ocisandboxtest.Image(tb)
	cfg.ImageCache = ocisandboxtest.Cache(tb)
}
