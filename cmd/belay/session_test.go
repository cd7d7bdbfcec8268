package main

import (
	"context"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
)

// sessionScript is a scripted model for two turns, one reply each (the
// scripted model answers the step numbered by the assistant messages in a
// request, and a turn's request holds one per earlier turn): turn 1 fixes
// add and runs a shell command (asked under the ask policy), turn 2 adds
// sub next to the fixed add.
const sessionScript = `{"name": "cli-session", "steps": [
  {"toolCalls": [
    {"name": "edit_file", "arguments": {"path": "calc.py", "old": "return a - b", "new": "return a + b"}},
    {"name": "shell", "arguments": {"command": "echo hello-from-the-chat"}},
    {"name": "finish", "arguments": {"summary": "Fixed add and said hello."}}]},
  {"toolCalls": [
    {"name": "edit_file", "arguments": {"path": "calc.py", "old": "    return a + b\n", "new": "    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"}},
    {"name": "finish", "arguments": {"summary": "Added sub."}}]}
]}`

// startSessionServer starts belay with the real sandbox entry and
// sessionScript as its model.
func startSessionServer(t *testing.T) *server {
	t.Helper()
	entry := embeddedtest.RealSandbox(t)
	scriptFile := filepath.Join(t.TempDir(), "script.json")
	if err := os.WriteFile(scriptFile, []byte(sessionScript), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServer(t, func(c *embedded.Config) {
		c.SandboxBin = entry
		c.ScriptedModel = scriptFile
	})
}

// newSession runs belay session new over project(t) (calc.py may change,
// pytest checks, every tool asked) with extra flags, and returns its id.
func (s *server) newSession(t *testing.T, extra ...string) string {
	t.Helper()
	args := append([]string{"session", "new", project(t), "--allow", "calc.py", "--check", "python3 -m pytest -q",
		"--approval", "ask", "--max-steps", "3"}, extra...)
	r := s.belay(t, args...)
	if r.code != 0 {
		t.Fatalf("belay session new = %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(id, "ses_") {
		t.Fatalf("belay session new printed %q; want a session id", r.stdout)
	}
	return id
}

// TestSessionCommands: belay session new uploads DIR (with a skill),
// session chat reads the person's lines (a message, the answer to the
// approval the turn asks for inline, the next message typed ahead, /quit),
// streams the events, and session show and session patch show the two
// turns and their summed change.
func TestSessionCommands(t *testing.T) {
	s := startSessionServer(t)
	skill := filepath.Join(t.TempDir(), "Calc-Style.md")
	if err := os.WriteFile(skill, []byte("# How calc.py is written\n\nEvery function is one line.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := s.newSession(t, "--skill", skill)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr lockedBuffer
	code := run(ctx, []string{"session", "chat", id}, &env{
		stdin:  strings.NewReader("Fix add.\ny\nNow add sub.\n/quit\n"),
		stdout: &stdout, stderr: &stderr,
		lookup: func(k string) (string, bool) { v, ok := s.env[k]; return v, ok },
	})
	if code != 0 {
		t.Fatalf("belay session chat = %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	out, errOut := stdout.String(), stderr.String()
	for _, want := range []string{"approval.requested", "hello-from-the-chat", "agent: Fixed add and said hello.", "agent: Added sub.", "run.completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("chat's stdout lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"approve shell", "belay: turn 1, run run_", "belay: turn 2, run run_"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("chat's stderr lacks %q:\n%s", want, errOut)
		}
	}

	r := s.belay(t, "session", "show", id)
	if r.code != 0 {
		t.Fatalf("belay session show = %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"turn 1  completed", "turn 2  completed", "you: Now add sub.", "skills: calc-style", "workspace: after turn 2, changed calc.py"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("session show lacks %q:\n%s", want, r.stdout)
		}
	}
	r = s.belay(t, "session", "patch", id)
	if r.code != 0 || !strings.Contains(r.stdout, "+    return a + b") || !strings.Contains(r.stdout, "+def sub(a, b):") {
		t.Errorf("belay session patch = %d:\n%s", r.code, r.stdout)
	}
	r = s.belay(t, "session", "close", id)
	if r.code != 0 || !strings.Contains(r.stdout, "closed") {
		t.Errorf("belay session close = %d: %s %s", r.code, r.stdout, r.stderr)
	}
	v, err := s.client(t).GetSession(context.Background(), id)
	if err != nil || v.Status != belay.SessionClosed || len(v.Turns) != 2 {
		t.Errorf("after close: %+v, %v", v, err)
	}
	r = s.belay(t, "session", "chat", id, "--message", "more")
	if r.code == 0 || !strings.Contains(r.stderr, "closed") {
		t.Errorf("chat on a closed session = %d: %s", r.code, r.stderr)
	}
}

// TestSessionChatConnectsAgain cuts the chat's connections while the turn
// waits for an approval (as API Gateway does to a WebSocket idle for ten
// minutes): the chat connects again from the last event it showed, the
// answer typed after goes out on the new connection, and the turn's
// events are each shown once, in order.
func TestSessionChatConnectsAgain(t *testing.T) {
	s := startSessionServer(t)
	id := s.newSession(t)

	proxy := newCuttingProxy(t, s.main.Addr())
	environ := maps.Clone(s.env)
	environ[envEndpoint] = "http://" + proxy.addr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stdin, typed := io.Pipe()
	defer typed.Close()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"session", "chat", id}, &env{
			stdin: stdin, stdout: &stdout, stderr: &stderr,
			lookup: func(k string) (string, bool) { v, ok := environ[k]; return v, ok },
		})
	}()
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			select {
			case code := <-done:
				t.Fatalf("chat ended (%d) before %s\nstdout: %s\nstderr: %s", code, what, stdout.String(), stderr.String())
			case <-ctx.Done():
				t.Fatalf("no %s\nstdout: %s\nstderr: %s", what, stdout.String(), stderr.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if _, err := io.WriteString(typed, "Fix add.\n"); err != nil {
		t.Fatal(err)
	}
	waitUntil("approval question", func() bool { return strings.Contains(stderr.String(), "approve shell") })
	if n := proxy.cut(); n == 0 {
		t.Fatal("the chat had no connection open to cut")
	}
	waitUntil("new connection", func() bool { return strings.Contains(stderr.String(), "connected again") })
	if _, err := io.WriteString(typed, "y\n/quit\n"); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-ctx.Done():
		t.Fatalf("chat did not end\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
	}
	out, errOut := stdout.String(), stderr.String()
	if code != 0 {
		t.Fatalf("belay session chat = %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "connection dropped") {
		t.Errorf("stderr does not say the connection dropped:\n%s", errOut)
	}
	for _, want := range []string{"approval.requested", "approval.decided", "run.completed", "agent: Fixed add and said hello."} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("stdout shows %q %d times; want once:\n%s", want, n, out)
		}
	}
	last := int64(0)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "#") {
			continue
		}
		seq, err := strconv.ParseInt(f[0][1:], 10, 64)
		if err != nil || seq <= last {
			t.Fatalf("event line %q after #%d: each event once, in order\n%s", line, last, out)
		}
		last = seq
	}
}

// cuttingProxy forwards TCP connections to a server until cut closes the
// open ones, as a failing network or API Gateway's idle timeout would; new
// connections are forwarded again.
type cuttingProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

func newCuttingProxy(tb testing.TB, target string) *cuttingProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target}
	tb.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *cuttingProxy) addr() string { return p.ln.Addr().String() }

// cut closes every connection open through the proxy and says how many
// there were.
func (p *cuttingProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}
