package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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

// TestSessionCommands: belay session new uploads DIR (with a skill),
// session chat reads the person's lines (a message, the answer to the
// approval the turn asks for inline, the next message typed ahead, /quit),
// streams the events, and session show and session patch show the two
// turns and their summed change.
func TestSessionCommands(t *testing.T) {
	entry := embeddedtest.RealSandbox(t)
	scriptFile := filepath.Join(t.TempDir(), "script.json")
	if err := os.WriteFile(scriptFile, []byte(sessionScript), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(c *embedded.Config) {
		c.SandboxBin = entry
		c.ScriptedModel = scriptFile
	})
	skill := filepath.Join(t.TempDir(), "Calc-Style.md")
	if err := os.WriteFile(skill, []byte("# How calc.py is written\n\nEvery function is one line.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := s.belay(t, "session", "new", project(t), "--allow", "calc.py", "--check", "python3 -m pytest -q",
		"--approval", "ask", "--skill", skill, "--max-steps", "3")
	if r.code != 0 {
		t.Fatalf("belay session new = %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(id, "ses_") {
		t.Fatalf("belay session new printed %q; want a session id", r.stdout)
	}

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

	r = s.belay(t, "session", "show", id)
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
