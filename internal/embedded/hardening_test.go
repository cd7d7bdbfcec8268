package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// requireRoot skips a test that needs root outside CI, and fails it in CI,
// which runs as root so that nothing is silently skipped there.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatal("this test must run as root in CI: only as root does the launcher drop the sandbox to its own uid and namespaces")
	}
	tb.Skip("needs root: only as root does the local launcher drop the sandbox to its own uid and namespaces; run the tests as root (CI does)")
}

// liveEntry is a running sandbox entry as the host sees it.
type liveEntry struct {
	pid       int
	workspace string
}

// findEntry returns the run's sandbox entry process, found in /proc by the
// command line the launcher gives it: belay-sandbox --workspace
// <sandbox dir>/<run id>-<suffix>.
func findEntry(tb testing.TB, sandboxDir, runID string) liveEntry {
	tb.Helper()
	prefix := filepath.Join(sandboxDir, runID) + "-"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var found []liveEntry
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(argv) == 3 && filepath.Base(argv[0]) == embedded.SandboxBinName && argv[1] == "--workspace" &&
			strings.HasPrefix(argv[2], prefix) {
			found = append(found, liveEntry{pid: pid, workspace: argv[2]})
		}
	}
	if len(found) != 1 {
		tb.Fatalf("want one sandbox entry of run %s in /proc, found %v", runID, found)
	}
	return found[0]
}

// procStatus reads /proc/<pid>/status into its fields.
func procStatus(tb testing.TB, pid int) map[string]string {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	return parseStatus(string(b))
}

func parseStatus(s string) map[string]string {
	fields := map[string]string{}
	for line := range strings.Lines(s) {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// waitHeld waits until the provider holds its request, failing the test
// with the run's events if the run ends first.
func waitHeld(tb testing.TB, p *provider, c *httpapi.Client, runID string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	ended := make(chan []belay.Event, 1)
	go func() {
		var events []belay.Event
		_ = c.StreamEvents(ctx, runID, 0, func(e belay.Event) error {
			events = append(events, e)
			return nil
		})
		ended <- events
	}()
	select {
	case <-p.Held():
	case events := <-ended:
		tb.Fatalf("run %s ended before the provider held its request: %s", runID, eventTypes(events))
	}
}

// commandResult splits a shell or run_check result ("exit code N after
// Xs", then the output's tail) into the exit code and the output.
func commandResult(tb testing.TB, r toolResult) (int, string) {
	tb.Helper()
	head, out, _ := strings.Cut(r.Result, "\n")
	var code int
	if r.IsError {
		tb.Fatalf("step %d (%s) was refused: %s", r.Step, r.Name, r.Result)
	}
	if _, err := fmt.Sscanf(head, "exit code %d after", &code); err != nil {
		tb.Fatalf("step %d (%s): %q is not a command result: %v", r.Step, r.Name, head, err)
	}
	return code, out
}

// worldWritableDir is a host folder outside every sandbox that the sandbox
// user could write to, were it ever to reach it.
func worldWritableDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "belay-outside")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// cleanShellEnv is the whole environment of a sandbox command
// (sandbox.CleanEnv), plus PWD, which /bin/sh itself exports.
var cleanShellEnv = []string{"HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"}

// TestSandboxHardening runs one run through Main whose scripted model uses
// an allow_all shell to look at what the sandbox is, and tries the writes
// the tools must refuse. While the run is live (the provider holds the
// last model call) the test looks at the entry from the host.
func TestSandboxHardening(t *testing.T) {
	requireRoot(t)
	t.Parallel()

	// A listener the sandbox must not reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted sync.WaitGroup
	var conns []string
	var connsMu sync.Mutex
	accepted.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c.RemoteAddr().String())
			connsMu.Unlock()
			c.Close()
		}
	})
	port := ln.Addr().(*net.TCPAddr).Port
	outside := worldWritableDir(t)
	const marker = "# written by the hardening test's model\n"

	script := scriptedmodel.Script{Name: "hardening", Steps: []scriptedmodel.Step{
		// 1: who the shell runs as; stat shows a dumpable process's own
		// /proc files as its own, a non-dumpable one's as root's.
		step("shell", map[string]string{"command": "grep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status; stat -c 'owner %u' /proc/self/status"}),
		// 2: the whole environment of a command.
		step("shell", map[string]string{"command": "env"}),
		// 3: a TCP connection to the host's loopback.
		step("shell", map[string]string{"command": fmt.Sprintf(`python3 -c 'import socket; socket.create_connection(("127.0.0.1", %d), 2)'`, port)}),
		// 4: an allowed folder becomes a link out of the repository, and a
		// file outside allowedPaths appears.
		step("shell", map[string]string{"command": "rm -r link && ln -s " + outside + " link && echo planted > other.txt"}),
		// 5–7: writes the tools must refuse.
		step("write_file", map[string]string{"path": "link/x.py", "content": marker}),
		step("write_file", map[string]string{"path": "../x.py", "content": marker}),
		step("write_file", map[string]string{"path": ".git/config", "content": marker}),
		// 8: the fix.
		step("edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
		// 9: asked for while the test looks at the live sandbox.
		finish("Fixed add."),
	}}
	p := newProvider(t, script, len(script.Steps))
	pl := startWith(t, p, nil, "")
	ctx := context.Background()
	req := calcRequest(t)
	req.Files = append(req.Files, belay.File{Path: "link/notes.md", Content: "a folder the agent may change\n"})
	req.AllowedPaths = []string{"calc.py", "link/**"}
	req.Approval = belay.ApprovalConfig{Policy: belay.PolicyAllowAll}
	created, err := pl.c.CreateRun(ctx, req, "")
	if err != nil {
		t.Fatal(err)
	}

	waitHeld(t, p, pl.c, created.RunID)
	entry := findEntry(t, pl.cfg.SandboxDir, created.RunID)
	status := procStatus(t, entry.pid)
	uids := strings.Fields(status["Uid"])
	if len(uids) != 4 || uids[0] == "0" || slices.ContainsFunc(uids, func(u string) bool { return u != uids[0] }) {
		t.Errorf("the entry's uids (real, effective, saved, fs) are %q; want one non-zero uid", status["Uid"])
	}
	if status["NoNewPrivs"] != "1" {
		t.Errorf("the entry has NoNewPrivs %q; want 1", status["NoNewPrivs"])
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/status", entry.pid), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Errorf("the entry's /proc files belong to uid %d, its own: it is dumpable; want dumpable 0 (files shown as root's)", st.Uid)
	}
	for _, name := range []string{"model.token", "events.token", "approvals.token"} {
		if _, err := os.Lstat(filepath.Join(entry.workspace, "tokens", name)); !os.IsNotExist(err) {
			t.Errorf("tokens/%s is still in the live sandbox's workspace (%v); the entry must remove it after reading", name, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(entry.workspace, "x.py")); !os.IsNotExist(err) {
		t.Errorf("write_file ../x.py left a file beside the repository: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(entry.workspace, "repo", ".git", "config")); err != nil || bytes.Contains(b, []byte(marker)) {
		t.Errorf("the repository's .git/config was written (%v)", err)
	}
	if left, err := os.ReadDir(outside); err != nil || len(left) != 0 {
		t.Errorf("the folder outside the sandbox holds %v (%v); the write through the link reached it", left, err)
	}
	p.Release()

	events, run := pl.finished(t, created.RunID)
	if run.Status != belay.StatusCompleted {
		t.Fatalf("run ended %s (%s); want completed; events: %s", run.Status, run.Reason, eventTypes(events))
	}

	// 1: the shell runs as the sandbox user, with no_new_privs.
	code, out := commandResult(t, resultOfStep(t, events, 1))
	shell := parseStatus(out)
	if code != 0 || shell["Uid"] != status["Uid"] || shell["NoNewPrivs"] != "1" || shell["Groups"] != "" {
		t.Errorf("the shell's status (exit code %d):\n%s\nwant the entry's uids (%s), no groups and NoNewPrivs 1", code, out, status["Uid"])
	}
	if !strings.Contains(out, "owner "+uids[0]+"\n") {
		t.Errorf("a dumpable shell's /proc files are not shown as its own uid %s, so the entry's root-owned ones prove nothing:\n%s", uids[0], out)
	}

	// 2: the environment is the clean set and holds no token.
	code, out = commandResult(t, resultOfStep(t, events, 2))
	var keys []string
	for line := range strings.Lines(out) {
		k, v, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		keys = append(keys, k)
		if strings.Contains(v, "bt1.") || strings.Contains(v, providerKey) || strings.Contains(v, pl.m.Token()) {
			t.Errorf("environment variable %s of a sandbox command holds a secret", k)
		}
	}
	slices.Sort(keys)
	if code != 0 || !slices.Equal(keys, cleanShellEnv) {
		t.Errorf("a sandbox command's environment has %q (exit code %d); want exactly %q", keys, code, cleanShellEnv)
	}
	if strings.Contains(out, "bt1.") {
		t.Error("a sandbox command's environment holds a run token")
	}

	// 3: no network: the connection fails, and the listener saw nothing.
	code, out = commandResult(t, resultOfStep(t, events, 3))
	if code == 0 {
		t.Errorf("a sandbox command connected to 127.0.0.1:%d:\n%s", port, out)
	}
	ln.Close()
	accepted.Wait()
	if len(conns) != 0 {
		t.Errorf("the host listener accepted %v from the sandbox", conns)
	}

	// 5–7: each write was refused, with the reason, as a result the model
	// reads.
	if code, out := commandResult(t, resultOfStep(t, events, 4)); code != 0 {
		t.Fatalf("the shell could not set the trap up (exit code %d):\n%s", code, out)
	}
	for stepNo, want := range map[int]string{5: "symbolic link", 6: `".." segment`, 7: ".git segment"} {
		r := resultOfStep(t, events, stepNo)
		if !r.IsError || !strings.Contains(r.Result, want) {
			t.Errorf("step %d (%s): isError %v, %q; want a refusal saying %q", stepNo, r.Name, r.IsError, r.Result, want)
		}
	}

	// Only allowed paths changed: the link and other.txt were left out.
	for _, f := range run.ChangedFiles {
		if !belay.PathAllowed(req.AllowedPaths, f) {
			t.Errorf("changed file %q is outside allowedPaths %q", f, req.AllowedPaths)
		}
	}
	if !slices.Contains(run.ChangedFiles, "calc.py") {
		t.Errorf("changed files %q lack the fix of calc.py", run.ChangedFiles)
	}
	patch, err := pl.c.GetArtifact(ctx, created.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^diff --git a/(\S+) b/(\S+)$`).FindAllStringSubmatch(string(patch), -1) {
		if !belay.PathAllowed(req.AllowedPaths, m[1]) || m[1] != m[2] {
			t.Errorf("the patch changes %s → %s, outside allowedPaths:\n%s", m[1], m[2], patch)
		}
	}
	if bytes.Contains(patch, []byte("other.txt")) || bytes.Contains(patch, []byte(marker)) {
		t.Errorf("the patch carries a change outside allowedPaths:\n%s", patch)
	}
}

// TestEntryRefusesUnsafeTokenFiles runs the built entry directly on a
// prepared workspace, as the sandbox user: a token file that is a symbolic
// link or readable by others stops it before anything else, with a line
// that names the file and the problem and not the token.
func TestEntryRefusesUnsafeTokenFiles(t *testing.T) {
	t.Parallel()
	entry := realEntry(t)
	const canary = "bt1.canary-token-value-0123456789"
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 65534, 65534 // nobody: the entry refuses to run as root
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, tokens string)
		want  string
	}{
		{"symbolic link", func(t *testing.T, tokens string) {
			stash := filepath.Join(filepath.Dir(tokens), "stash")
			writeOwned(t, stash, canary, 0o600, uid, gid)
			if err := os.Symlink("../stash", filepath.Join(tokens, "model.token")); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(filepath.Join(tokens, "model.token"), uid, gid); err != nil {
				t.Fatal(err)
			}
		}, "belay-sandbox: token file tokens/model.token: refused: it is a symbolic link"},
		{"readable by others", func(t *testing.T, tokens string) {
			writeOwned(t, filepath.Join(tokens, "model.token"), canary, 0o644, uid, gid)
		}, "belay-sandbox: token file tokens/model.token: refused: mode 0644, want 0600"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := filepath.Join(embeddedtest.SandboxDir(t), "ws")
			tokens := filepath.Join(ws, "tokens")
			for _, d := range []string{ws, tokens} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(d, uid, gid); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range []string{"events.token", "approvals.token"} {
				writeOwned(t, filepath.Join(tokens, name), canary, 0o600, uid, gid)
			}
			tt.setup(t, tokens)

			ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
			defer cancel()
			cmd := exec.CommandContext(ctx, entry, "--workspace", ws)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(ws, "home"), "LANG=C.UTF-8"}
			if os.Geteuid() == 0 {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if cmd.ProcessState == nil {
				t.Fatalf("start the entry: %v", err)
			}
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("the entry exited %d (%v); want 1\nstderr: %s", code, err, stderr.String())
			}
			if got := strings.TrimSpace(stderr.String()); got != tt.want {
				t.Errorf("stderr %q; want %q", got, tt.want)
			}
			if strings.Contains(stdout.String()+stderr.String(), canary) {
				t.Error("the entry printed the token")
			}
			if _, err := os.Stat(filepath.Join(ws, "out", "result.json")); err == nil {
				t.Error("the entry wrote a result")
			}
			if b, err := os.ReadFile(filepath.Join(ws, "stash")); err == nil && string(b) != canary {
				t.Errorf("the file behind the link was changed: %q", b)
			}
		})
	}
}

// writeOwned writes a file with the mode and owner given.
func writeOwned(tb testing.TB, path, content string, mode os.FileMode, uid, gid int) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		tb.Fatal(err)
	}
	if err := os.Lchown(path, uid, gid); err != nil {
		tb.Fatal(err)
	}
}
