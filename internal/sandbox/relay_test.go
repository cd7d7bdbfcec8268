package sandbox_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// relayPy is the attack of issue 16, hole 3: it renames the control
// plane's socket, listens on its name, and relays every connection to the
// real one, writing what the entry sends (its tokens) to a log. It runs as
// the sandbox user, started by an approved shell command or by a process a
// previous run left behind.
const relayPy = `import os, socket, sys, threading
path, log = sys.argv[1], sys.argv[2]
real = path + ".real"
os.rename(path, real)
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(64)
out = open(log, "ab", buffering=0)
out.write(b"LISTENING\n")
def pipe(a, b, record):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            if record:
                out.write(d)
            b.sendall(d)
    except OSError:
        pass
    if record:
        out.write(b"\nCLOSED\n")
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    c, _ = srv.accept()
    out.write(b"CONNECTED\n")
    u = socket.socket(socket.AF_UNIX)
    u.connect(real)
    threading.Thread(target=pipe, args=(c, u, True), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c, False), daemon=True).start()
`

// relayFiles writes the relay script where the sandbox user can run it and
// a log folder it can write to, and returns the script's and the log's
// paths.
func relayFiles(t *testing.T) (script, log string) {
	t.Helper()
	dir := worldReadableDir(t)
	script = filepath.Join(dir, "relay.py")
	mustDo(t, os.WriteFile(script, []byte(relayPy), 0o644))
	logs := filepath.Join(dir, "logs")
	mustDo(t, os.Mkdir(logs, 0o777))
	mustDo(t, os.Chmod(logs, 0o777))
	return script, filepath.Join(logs, "relay.log")
}

// TestEntryNeverTalksToARelayOnItsSocket performs the attack mid-run: an
// approved shell command starts the relay (detached, so it outlives the
// command) over the entry's api.sock, and the control plane closes every
// connection after one answer, so each later call of the entry dials anew.
// The entry keeps talking to the socket it found at its start: the relay
// gets no connection and no token, and the run still reports.
func TestEntryNeverTalksToARelayOnItsSocket(t *testing.T) {
	relay, relayLog := relayFiles(t)
	script := scriptedmodel.Script{Name: "relay", Steps: []scriptedmodel.Step{
		toolCall(t, "shell", map[string]string{"command": "setsid -f /usr/bin/python3 " + relay + " ../api.sock " + relayLog +
			"; for i in 1 2 3 4 5 6 7 8 9 10; do grep -q LISTENING " + relayLog + " 2>/dev/null && break; sleep 0.2; done; cat " + relayLog}),
		toolCall(t, "read_file", map[string]string{"path": "calc.py"}),
		toolCall(t, "edit_file", map[string]string{"path": "calc.py", "old": "a - b", "new": "a + b"}),
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "run_check", Arguments: []byte(`{"argv":["python3","-c","import calc; assert calc.add(2, 3) == 5"]}`)}}},
		finishStep(),
	}}
	sr := prepareSandbox(t, script, runRequest(belay.PolicyAllowAll, 60))
	sr.cp.setFront(func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		w.Header().Set("Connection", "close")
		next.ServeHTTP(w, r)
	})
	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	got, _ := os.ReadFile(relayLog)
	if !strings.Contains(string(got), "LISTENING") {
		t.Fatalf("the relay never listened on api.sock (log %q); the attack did not happen:\n%s", got, sr.stderr.String())
	}
	if strings.Contains(string(got), "CONNECTED") {
		t.Error("the entry connected to the relay")
	}
	for what, tok := range map[string]string{"model": sr.tokens.Model, "events": sr.tokens.Events, "approvals": sr.tokens.Approvals} {
		if strings.Contains(string(got), tok) {
			t.Errorf("the relay captured the %s token", what)
		}
	}
	bundle, err := belay.ValidateResult(sr.runID, sr.req, sr.outputs(t))
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v", err)
	}
	if bundle.Status != belay.StatusCompleted {
		t.Errorf("bundle %s (%q); the run should still report completed", bundle.Status, bundle.Reason)
	}
	if n := sr.cp.model.Calls(); n != len(script.Steps) {
		t.Errorf("%d model calls reached the control plane, want all %d", n, len(script.Steps))
	}
	sr.assertNoSecrets(t)
}

// TestEntryRefusesARelayThatWasThereFirst performs the attack before the
// entry starts, as a process left behind by an earlier run of the same
// uid would: the relay, running as the sandbox user, already listens on
// api.sock. The entry checks who listens (SO_PEERCRED), refuses to send it
// anything and stops with a clear error; the relay gets no token.
func TestEntryRefusesARelayThatWasThereFirst(t *testing.T) {
	requireRoot(t, "to run the relay as the sandbox user, another uid than the control plane's")
	relay, relayLog := relayFiles(t)
	sr := prepareSandbox(t, fixScript(), runRequest(belay.PolicyDenyAll, 0))
	squatter := exec.Command("/usr/bin/python3", relay, sr.cp.socket, relayLog)
	squatter.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: testUID, Gid: testUID}, Setsid: true}
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = squatter.Process.Kill()
		_ = squatter.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(relayLog); strings.Contains(string(b), "LISTENING") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay never listened")
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	code := sr.wait(t)
	stderr := sr.stderr.String()
	if code == 0 || !strings.Contains(stderr, "the listener runs as the sandbox's own uid 10001, not the control plane's uid 0; refusing to send it anything") {
		t.Fatalf("entry exited %d; want it refused the relay with a clear error:\n%s", code, stderr)
	}
	// The relay notes the connection after accepting it, and its end
	// after reading what the entry sent, which may come after the entry
	// has already exited.
	var got []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, _ = os.ReadFile(relayLog)
		if strings.Contains(string(got), "CLOSED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the entry never dialled the relay (log %q): the check was not exercised", got)
		}
	}
	if rest := strings.TrimSpace(strings.NewReplacer("LISTENING", "", "CONNECTED", "", "CLOSED", "").Replace(string(got))); rest != "" {
		t.Errorf("the relay received %d bytes from the entry; want none", len(rest))
	}
	if n := sr.cp.model.Calls(); n != 0 {
		t.Errorf("the model was called %d times", n)
	}
	if evs := sr.cp.events(t, sr.runID); len(evs) != 2 {
		t.Errorf("the run has %d events; want only run.queued and run.started (nothing from the refused entry)", len(evs))
	}
	sr.assertNoSecrets(t)
}
