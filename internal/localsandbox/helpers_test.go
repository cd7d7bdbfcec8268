//go:build linux

package localsandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
)

// report mirrors testdata/testentry's Report.
type report struct {
	UID, EUID, GID int
	Groups         []int
	PID            int
	SID            int
	Cwd            string
	Args           []string
	Env            []string
	TokenFiles     map[string]struct {
		Mode    string
		UID     int
		ReadErr string
	}
	TokensLeft []string
	TCPError   string
	APIStatus  int
	APIError   string
	Interfaces []string
	PeekErrors []string

	AttackTarget int
	Attacks      map[string]string
	WriteError   string
}

// syncBuffer is a log destination the test reads while sandboxes write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// request is what the internal API test handler saw of one request.
type request struct {
	Method, Path, Bearer string
}

// recordingAPI stands in for the control plane's internal routes: it
// answers every request 200 and reports the path and bearer it received.
func recordingAPI(tb testing.TB) (http.Handler, <-chan request) {
	tb.Helper()
	seen := make(chan request, 16)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case seen <- request{r.Method, r.URL.Path, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")}:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"events":[]}`)
	}), seen
}

// steppingClock returns a clock that moves one step forward on each call.
func steppingClock(step time.Duration) func() time.Time {
	var mu sync.Mutex
	t := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(step)
		return t
	}
}

// clockStep is the step of the tests' clock: every SandboxExit.Duration
// is exactly this (one reading at start, one at exit).
const clockStep = 7 * time.Second

// shortTempDir makes a directory with a short path (a Unix socket path is
// at most 107 bytes) that the sandbox uids may search and that no folder
// above is writable by them (the launcher refuses a WorkRoot under /tmp).
func shortTempDir(tb testing.TB) string {
	tb.Helper()
	return workspacetest.Dir(tb, "lsb")
}

// newLauncher builds a launcher over a fresh WorkRoot with the test entry,
// logging into the returned buffer.
func newLauncher(tb testing.TB, isolation string, api http.Handler) (*localsandbox.Launcher, *syncBuffer, string) {
	tb.Helper()
	logs := &syncBuffer{}
	root := filepath.Join(shortTempDir(tb), "w")
	l, err := localsandbox.New(localsandbox.Config{
		EntryPath: testEntry,
		WorkRoot:  root,
		Internal:  api,
		Isolation: isolation,
		Logger:    slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:       steppingClock(clockStep),
	})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return l, logs, root
}

// canaryTokens are token values that must never show up anywhere but in
// the token files and the bearer the entry sends.
func canaryTokens(tb testing.TB) belay.SandboxTokens {
	tb.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	c := hex.EncodeToString(b[:])
	return belay.SandboxTokens{Model: "canary-model-" + c, Events: "canary-events-" + c, Approvals: "canary-approvals-" + c}
}

// assertNoToken fails when s holds any of the tokens.
func assertNoToken(tb testing.TB, where, s string, toks belay.SandboxTokens) {
	tb.Helper()
	for _, tok := range []string{toks.Model, toks.Events, toks.Approvals} {
		if tok != "" && strings.Contains(s, tok) {
			tb.Errorf("%s holds a token", where)
		}
	}
}

// testSpec is a valid sandbox spec whose instruction tells the test entry
// what to do.
func testSpec(tb testing.TB, runID, instruction string) belay.SandboxSpec {
	tb.Helper()
	return belay.SandboxSpec{
		RunID:           runID,
		Model:           "test-model",
		Instruction:     instruction,
		Files:           []belay.File{{Path: "a.py", Content: "print(1)\n"}},
		AllowedPaths:    []string{"a.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        3,
		WallTimeSeconds: 60,
		Deadline:        time.Now().Add(60 * time.Second).UTC(),
		Approval:        belay.ApprovalConfig{Policy: belay.PolicyDenyAll},
		Tokens:          canaryTokens(tb),
	}
}

// launch starts a sandbox and cleans it up when the test ends.
func launch(tb testing.TB, l *localsandbox.Launcher, spec belay.SandboxSpec) *localsandbox.Sandbox {
	tb.Helper()
	sb, err := l.Launch(context.Background(), spec)
	if err != nil {
		tb.Fatalf("Launch: %v", err)
	}
	tb.Cleanup(func() {
		if err := sb.Cleanup(); err != nil {
			tb.Errorf("Cleanup: %v", err)
		}
	})
	return sb.(*localsandbox.Sandbox)
}

// wait waits for the sandbox to exit.
func wait(tb testing.TB, sb *localsandbox.Sandbox) belay.SandboxExit {
	tb.Helper()
	exit, err := sb.Wait(context.Background())
	if err != nil {
		tb.Fatalf("Wait: %v", err)
	}
	return exit
}

// readReport reads the test entry's out/report.json.
func readReport(tb testing.TB, sb *localsandbox.Sandbox) report {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(sb.Workspace(), "out", "report.json"))
	if err != nil {
		tb.Fatalf("read the entry's report: %v (entry output: %q)", err, sb.OutputTail())
	}
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		tb.Fatal(err)
	}
	return r
}

// tcpTarget is a loopback listener that counts the connections it gets.
type tcpTarget struct {
	ln       net.Listener
	mu       sync.Mutex
	accepted int
	done     chan struct{}
}

func listenTCP(tb testing.TB) *tcpTarget {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	t := &tcpTarget{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.mu.Lock()
			t.accepted++
			t.mu.Unlock()
			c.Close()
		}
	}()
	tb.Cleanup(func() { ln.Close() })
	return t
}

// Accepted closes the listener and says how many connections it took.
func (t *tcpTarget) Accepted() int {
	t.ln.Close()
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.accepted
}

// procStatus reads one field of /proc/PID/status.
func procStatus(tb testing.TB, pid int, field string) string {
	tb.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		tb.Fatalf("read status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	tb.Fatalf("pid %d has no %s in its status", pid, field)
	return ""
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(tb testing.TB, pid int) []int {
	tb.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var kids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok && strings.TrimSpace(v) == strconv.Itoa(pid) {
				kids = append(kids, p)
			}
		}
	}
	return kids
}

// alive reports whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// pidfd opens a pidfd for pid, so the test can wait for its death without
// sleeping.
func pidfd(tb testing.TB, pid int) int {
	tb.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		tb.Fatalf("pidfd_open %d: %v", pid, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// diesSoon reports whether the process behind pidfd fd exits (a zombie
// counts) within a generous bound: a SIGKILL is delivered when the target
// next runs, not when kill returns. The bound only turns a hang into a
// failure.
func diesSoon(tb testing.TB, fd int) bool {
	tb.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			tb.Fatalf("poll pidfd: %v", err)
		}
		return n == 1
	}
}

// requireRoot skips outside CI when not root, and fails in CI, where the
// tests always run as root.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatal("these tests need root (the uid drop and namespaces); CI runs them as root")
	}
	tb.Skip("needs root for the uid drop and namespaces: run `sudo go test ./internal/localsandbox/`")
}

// fileOwner is the uid that owns path.
func fileOwner(tb testing.TB, path string) int {
	tb.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}
