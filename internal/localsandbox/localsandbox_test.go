//go:build linux

package localsandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localsandbox"
)

// TestLaunchIsolatesTheEntry runs the test entry under each isolation mode
// and checks what it saw of its own process: who it runs as, its
// environment, its token files, its network and its way to the control
// plane. Isolation "none" is the fallback path and must show the opposite
// where isolation is missing (it reaches the network, it runs as the
// current user), which also proves those checks can fail.
func TestLaunchIsolatesTheEntry(t *testing.T) {
	tests := []struct {
		isolation   string
		wantUID     int
		wantNetwork bool
		wantPIDNS   bool
		wantApplied []string // measures Isolation must list
		wantMissing string   // a measure NotApplied and the log must list
	}{
		{localsandbox.IsolationAuto, localsandbox.DefaultSandboxID, false, true,
			[]string{"network namespace", "leased host-wide", "workspace folder of root's", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_NOFILE"}, ""},
		{localsandbox.IsolationNone, os.Getuid(), true, false, []string{"empty environment", "RLIMIT_FSIZE"}, "network namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.isolation, func(t *testing.T) {
			if tt.isolation == localsandbox.IsolationAuto {
				requireRoot(t)
			}
			api, seen := recordingAPI(t)
			l, logs, _ := newLauncher(t, tt.isolation, api)
			target := listenTCP(t)
			spec := testSpec(t, "run_isolation", "report "+target.ln.Addr().String())
			sb := launch(t, l, spec)
			exit := wait(t, sb)
			if exit.ExitCode != 0 || exit.Signaled {
				t.Fatalf("entry exited %d (signaled %v); output: %q", exit.ExitCode, exit.Signaled, sb.OutputTail())
			}
			if exit.Duration != clockStep {
				t.Errorf("Duration = %v, want %v (one clock step from start to exit)", exit.Duration, clockStep)
			}
			rep := readReport(t, sb)

			wantUID := tt.wantUID
			if tt.isolation == localsandbox.IsolationAuto {
				// The lowest uid of the range no other sandbox on the
				// host holds; other tests may hold some.
				if !isSandboxID(rep.UID) || rep.GID != rep.UID || len(rep.Groups) != 0 {
					t.Errorf("entry ran as %d:%d with groups %v; want a sandbox uid, the gid at the same offset and no groups", rep.UID, rep.GID, rep.Groups)
				}
				wantUID = rep.UID
			}
			if rep.UID != wantUID || rep.EUID != wantUID {
				t.Errorf("entry ran as uid %d (euid %d), want %d", rep.UID, rep.EUID, wantUID)
			}
			wantEnv := []string{
				"PATH=/usr/local/bin:/usr/bin:/bin",
				"HOME=" + filepath.Join(sb.Workspace(), "home"),
				"LANG=C.UTF-8",
			}
			if !slices.Equal(rep.Env, wantEnv) {
				t.Errorf("entry environment = %q, want exactly %q", rep.Env, wantEnv)
			}
			assertNoToken(t, "the entry's environment", strings.Join(rep.Env, "\n"), spec.Tokens)
			if want := []string{testEntryPathFor(l, sb), "--workspace", sb.Workspace()}; len(rep.Args) != 3 || rep.Args[1] != want[1] || rep.Args[2] != want[2] {
				t.Errorf("entry argv = %q, want [entry --workspace %s]", rep.Args, sb.Workspace())
			}
			if rep.SID != rep.PID {
				t.Errorf("entry is in session %d, want a session of its own (%d): without one it shares belay's terminal", rep.SID, rep.PID)
			}
			if rep.Cwd != sb.Workspace() {
				t.Errorf("entry working directory = %s, want the workspace %s", rep.Cwd, sb.Workspace())
			}

			for _, name := range []string{"model.token", "events.token", "approvals.token"} {
				tf, ok := rep.TokenFiles[name]
				switch {
				case !ok || tf.Mode == "":
					t.Errorf("%s: the entry found no token file", name)
				case tf.Mode != "-rw-------" || tf.UID != wantUID:
					t.Errorf("%s: mode %s owner %d, want -rw------- owned by %d", name, tf.Mode, tf.UID, wantUID)
				case tf.ReadErr != "":
					t.Errorf("%s: the entry could not read it: %s", name, tf.ReadErr)
				}
			}
			if len(rep.TokensLeft) != 0 {
				t.Errorf("token files left after the entry read them: %v", rep.TokensLeft)
			}

			reached := target.Accepted() > 0
			if reached != tt.wantNetwork {
				t.Errorf("entry reached a loopback TCP listener: %v, want %v (dial error %q; interfaces %q)", reached, tt.wantNetwork, rep.TCPError, rep.Interfaces)
			}
			if (rep.PID == 1) != tt.wantPIDNS {
				t.Errorf("entry saw itself as pid %d; in its own PID namespace: %v, want %v", rep.PID, rep.PID == 1, tt.wantPIDNS)
			}

			if rep.APIStatus != 200 {
				t.Fatalf("entry's call through api.sock: status %d, error %q", rep.APIStatus, rep.APIError)
			}
			select {
			case r := <-seen:
				if r.Path != "/internal/v1/runs/run_isolation/events" || r.Bearer != spec.Tokens.Events {
					t.Errorf("internal API got %s %s with the wrong bearer or path", r.Method, r.Path)
				}
			default:
				t.Error("the internal API handler saw no request")
			}

			specJSON, err := os.ReadFile(filepath.Join(sb.Workspace(), "spec.json"))
			if err != nil {
				t.Fatal(err)
			}
			assertNoToken(t, "spec.json", string(specJSON), spec.Tokens)
			var written belay.SandboxSpec
			if err := json.Unmarshal(specJSON, &written); err != nil {
				t.Fatal(err)
			}
			if written.APISocket != filepath.Join(sb.Workspace(), "api.sock") || written.APIBaseURL != "http://belay" {
				t.Errorf("spec.json apiSocket %q apiBaseUrl %q, want the workspace's api.sock and http://belay", written.APISocket, written.APIBaseURL)
			}

			applied := strings.Join(l.Isolation(), "\n")
			for _, want := range tt.wantApplied {
				if !strings.Contains(applied, want) {
					t.Errorf("Isolation() = %q, want it to list %q", l.Isolation(), want)
				}
			}
			notApplied := strings.Join(l.NotApplied(), "\n")
			for _, weak := range localsandbox.WeakIsolation() {
				if slices.Contains(l.Isolation(), weak) || !slices.Contains(l.NotApplied(), weak) {
					t.Errorf("%q is listed as applied, or not listed as not applied; a local process never gets it", weak)
				}
			}
			if tt.wantMissing == "" && len(l.NotApplied()) != len(localsandbox.WeakIsolation()) {
				t.Errorf("NotApplied() = %q; want only what no local process gets (WeakIsolation)", l.NotApplied())
			}
			if tt.wantMissing != "" && (strings.Contains(applied, tt.wantMissing) || !strings.Contains(notApplied, tt.wantMissing)) {
				t.Errorf("Isolation() = %q lists %q, which was not applied, or NotApplied() = %q does not", l.Isolation(), tt.wantMissing, l.NotApplied())
			}
			// The log says plainly, as a warning, everything that was not
			// applied.
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "not_applied=") {
				t.Errorf("the log has no warning listing what was not applied:\n%s", logs.String())
			}
			for _, missing := range l.NotApplied() {
				if !strings.Contains(logs.String(), missing) {
					t.Errorf("the log does not say %q was not applied:\n%s", missing, logs.String())
				}
			}
			assertNoToken(t, "the log", logs.String(), spec.Tokens)
			assertNoToken(t, "the entry's output", sb.OutputTail(), spec.Tokens)
		})
	}
}

// isSandboxID reports whether id is in the default range of sandbox uids.
func isSandboxID(id int) bool {
	return id >= localsandbox.DefaultSandboxID && id < localsandbox.DefaultSandboxID+localsandbox.DefaultSandboxIDs
}

// testEntryPathFor is the entry path the launcher starts: a copy in
// WorkRoot/bin as root, the test entry itself otherwise.
func testEntryPathFor(l *localsandbox.Launcher, sb *localsandbox.Sandbox) string {
	if os.Geteuid() == 0 {
		return filepath.Join(filepath.Dir(filepath.Dir(sb.Workspace())), "bin", "belay-sandbox")
	}
	return testEntry
}

// TestStopKillsTheEntryAndWhatItStarted starts an entry that starts a
// child and sleeps; Wait with an ended context must leave it running, and
// Stop must kill both.
func TestStopKillsTheEntryAndWhatItStarted(t *testing.T) {
	tests := []struct {
		isolation string
		dropsUID  bool
	}{
		{localsandbox.IsolationAuto, true},
		{localsandbox.IsolationNone, false},
	}
	for _, tt := range tests {
		t.Run(tt.isolation, func(t *testing.T) {
			if tt.isolation == localsandbox.IsolationAuto {
				requireRoot(t)
			}
			api, seen := recordingAPI(t)
			l, _, _ := newLauncher(t, tt.isolation, api)
			sb := launch(t, l, testSpec(t, "run_stop", "sleep"))
			select {
			case <-seen: // the entry has started its child
			case <-t.Context().Done():
				t.Fatal("the entry never reported ready")
			}
			if tt.dropsUID {
				uid := fileOwner(t, filepath.Join(sb.Workspace(), "tokens"))
				if want := fmt.Sprintf("%d %d %d %d", uid, uid, uid, uid); !isSandboxID(uid) || procStatus(t, sb.PID(), "Uid") != want {
					t.Errorf("/proc/%d/status Uid = %q, want %q, a sandbox uid", sb.PID(), procStatus(t, sb.PID(), "Uid"), want)
				}
				if got := procStatus(t, sb.PID(), "Groups"); got != "" {
					t.Errorf("/proc/%d/status Groups = %q, want none", sb.PID(), got)
				}
			}
			kids := childrenOf(t, sb.PID())
			if len(kids) != 1 {
				t.Fatalf("the entry has children %v, want its one sleep", kids)
			}
			kidFD := pidfd(t, kids[0])

			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := sb.Wait(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait with an ended context = %v, want context.Canceled", err)
			}
			if !alive(sb.PID()) || !alive(kids[0]) {
				t.Fatal("Wait with an ended context stopped the sandbox; only Stop may")
			}

			if err := sb.Stop(context.Background()); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			exit := wait(t, sb)
			if !exit.Signaled || exit.ExitCode != 128+9 {
				t.Errorf("exit after Stop: code %d signaled %v, want 137 signaled", exit.ExitCode, exit.Signaled)
			}
			if !diesSoon(t, kidFD) {
				t.Errorf("the entry's child %d outlived Stop", kids[0])
			}
			if err := sb.Stop(context.Background()); err != nil {
				t.Errorf("second Stop: %v, want nil (idempotent)", err)
			}
		})
	}
}

// TestCleanupRemovesTheWorkspace leaves an unsearchable folder owned by the
// sandbox user behind; Cleanup must still remove everything, close the
// socket, and be idempotent.
func TestCleanupRemovesTheWorkspace(t *testing.T) {
	for _, isolation := range []string{localsandbox.IsolationAuto, localsandbox.IsolationNone} {
		t.Run(isolation, func(t *testing.T) {
			api, _ := recordingAPI(t)
			l, _, root := newLauncher(t, isolation, api)
			sb := launch(t, l, testSpec(t, "run_clean", "mess"))
			exit := wait(t, sb)
			if exit.ExitCode != 0 {
				t.Fatalf("entry exited %d: %q", exit.ExitCode, sb.OutputTail())
			}
			locked := filepath.Join(sb.Workspace(), "out", "locked")
			if fi, err := os.Stat(locked); err != nil || fi.Mode().Perm() != 0 {
				t.Fatalf("the entry left no unsearchable folder (%v)", err)
			}
			if os.Geteuid() == 0 && isolation == localsandbox.IsolationAuto {
				if uid := fileOwner(t, locked); !isSandboxID(uid) {
					t.Errorf("the entry's folder is owned by %d, want the sandbox uid", uid)
				}
			}
			if err := sb.Cleanup(); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if _, err := os.Lstat(sb.Workspace()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("workspace still there after Cleanup (%v)", err)
			}
			if c, err := net.Dial("unix", filepath.Join(sb.Workspace(), "api.sock")); err == nil {
				c.Close()
				t.Error("api.sock still answers after Cleanup")
			}
			if err := sb.Cleanup(); err != nil {
				t.Errorf("second Cleanup: %v, want nil", err)
			}
			left, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range left {
				if e.Name() != "bin" {
					t.Errorf("WorkRoot still holds %s", e.Name())
				}
			}
		})
	}
}

// TestTokensPrintedByTheSandboxAreBlanked has the entry print its tokens
// and crash: the exit code comes back, and neither the log line about the
// crash nor OutputTail holds a token.
func TestTokensPrintedByTheSandboxAreBlanked(t *testing.T) {
	api, _ := recordingAPI(t)
	l, logs, _ := newLauncher(t, "", api)
	spec := testSpec(t, "run_leak", "leak")
	sb := launch(t, l, spec)
	exit := wait(t, sb)
	if exit.ExitCode != 3 || exit.Signaled {
		t.Fatalf("exit code %d signaled %v, want 3", exit.ExitCode, exit.Signaled)
	}
	if !strings.Contains(sb.OutputTail(), ".token is [redacted]") {
		t.Errorf("OutputTail = %q, want the printed tokens blanked", sb.OutputTail())
	}
	if !strings.Contains(logs.String(), "last_output_line=") {
		t.Errorf("the crash is not logged with its last output line:\n%s", logs.String())
	}
	assertNoToken(t, "OutputTail", sb.OutputTail(), spec.Tokens)
	assertNoToken(t, "the log", logs.String(), spec.Tokens)
}

// TestLaunchFailureLeavesNothing makes Launch fail before and after the
// workspace exists; either way WorkRoot holds nothing of the run and the
// error holds no token.
func TestLaunchFailureLeavesNothing(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, root string, spec *belay.SandboxSpec)
	}{
		{"path in run id", func(t *testing.T, root string, spec *belay.SandboxSpec) { spec.RunID = "../escape" }},
		{"empty run id", func(t *testing.T, root string, spec *belay.SandboxSpec) { spec.RunID = "" }},
		{"missing token", func(t *testing.T, root string, spec *belay.SandboxSpec) { spec.Tokens.Approvals = "" }},
		{"entry cannot start", func(t *testing.T, root string, spec *belay.SandboxSpec) {
			requireRoot(t) // as root the launcher runs its own copy of the entry
			if err := os.Remove(filepath.Join(root, "bin", "belay-sandbox")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api, _ := recordingAPI(t)
			l, logs, root := newLauncher(t, "", api)
			spec := testSpec(t, "run_fail", "report 127.0.0.1:1")
			tt.setup(t, root, &spec)
			sb, err := l.Launch(context.Background(), spec)
			if err == nil {
				sb.Cleanup()
				t.Fatal("Launch succeeded")
			}
			assertNoToken(t, "the Launch error", err.Error(), spec.Tokens)
			assertNoToken(t, "the log", logs.String(), spec.Tokens)
			left, rerr := os.ReadDir(root)
			if rerr != nil {
				t.Fatal(rerr)
			}
			for _, e := range left {
				if e.Name() != "bin" {
					t.Errorf("after a failed launch (%v) WorkRoot still holds %s", err, e.Name())
				}
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
				t.Error("a run id escaped WorkRoot")
			}
		})
	}
}

// TestNewRefusesBadConfig checks the mistakes New must name before any
// sandbox runs.
func TestNewRefusesBadConfig(t *testing.T) {
	api, _ := recordingAPI(t)
	tests := []struct {
		name    string
		root    bool
		cfg     func(t *testing.T) localsandbox.Config
		wantErr string
	}{
		{"unknown isolation", false, func(t *testing.T) localsandbox.Config {
			return localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"), Internal: api, Isolation: "full"}
		}, `isolation "full"`},
		{"no handler", false, func(t *testing.T) localsandbox.Config {
			return localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w")}
		}, "Internal is required"},
		{"entry missing", false, func(t *testing.T) localsandbox.Config {
			return localsandbox.Config{EntryPath: "/nonexistent/entry", WorkRoot: filepath.Join(shortTempDir(t), "w"), Internal: api}
		}, "entry"},
		{"WorkRoot path too long for a socket", false, func(t *testing.T) localsandbox.Config {
			return localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), strings.Repeat("d", 60)), Internal: api}
		}, "too long"},
		{"WorkRoot writable by others", false, func(t *testing.T) localsandbox.Config {
			dir := filepath.Join(shortTempDir(t), "w")
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			return localsandbox.Config{EntryPath: testEntry, WorkRoot: dir, Internal: api}
		}, "must not be writable"},
		{"WorkRoot the sandbox uid cannot reach", true, func(t *testing.T) localsandbox.Config {
			dir := shortTempDir(t)
			if err := os.Chmod(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			return localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(dir, "w"), Internal: api}
		}, "cannot reach WorkRoot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				requireRoot(t)
			}
			_, err := localsandbox.New(tt.cfg(t))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestNewRemovesStaleWorkspaces leaves a workspace behind as a dead belay
// would (token file still there, nothing on its api.sock) next to a live
// sandbox's and an unrelated folder: a new launcher on the same WorkRoot
// removes only the stale one.
func TestNewRemovesStaleWorkspaces(t *testing.T) {
	api, seen := recordingAPI(t)
	l, _, root := newLauncher(t, "", api)
	live := launch(t, l, testSpec(t, "run_live", "sleep"))
	select {
	case <-seen:
	case <-t.Context().Done():
		t.Fatal("the live sandbox never reported ready")
	}
	stale := filepath.Join(root, "run_dead-0123456789ab")
	if err := os.MkdirAll(filepath.Join(stale, "tokens"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "tokens", "model.token"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(root, "notes")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}

	if _, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: root, Internal: api}); err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale workspace still there (%v)", err)
	}
	for _, keep := range []string{live.Workspace(), other} {
		if _, err := os.Lstat(keep); err != nil {
			t.Errorf("%s was removed: %v", keep, err)
		}
	}
}

// TestEachSandboxHasItsOwnUID runs two sandboxes at once: they get
// different uids and the second cannot list or read the first's
// workspace. A uid is given out again only after Cleanup.
func TestEachSandboxHasItsOwnUID(t *testing.T) {
	requireRoot(t)
	api, seen := recordingAPI(t)
	base := freeRange(t, 2)
	l, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"),
		Internal: api, UID: base, GID: base, UIDs: 2})
	if err != nil {
		t.Fatal(err)
	}
	first := launch(t, l, testSpec(t, "run_first", "sleep"))
	select {
	case <-seen:
	case <-t.Context().Done():
		t.Fatal("the first sandbox never reported ready")
	}
	second := launch(t, l, testSpec(t, "run_second", "peek "+first.Workspace()))
	if exit := wait(t, second); exit.ExitCode != 0 {
		t.Fatalf("second sandbox exited %d: %q", exit.ExitCode, second.OutputTail())
	}
	rep := readReport(t, second)
	if want := fmt.Sprintf("%d %d %d %d", base, base, base, base); procStatus(t, first.PID(), "Uid") != want {
		t.Errorf("first sandbox runs as uid %q, want %s", procStatus(t, first.PID(), "Uid"), want)
	}
	if rep.UID != base+1 || rep.GID != base+1 {
		t.Errorf("second sandbox ran as %d:%d, want %d:%d", rep.UID, rep.GID, base+1, base+1)
	}
	if len(rep.PeekErrors) != 2 {
		t.Errorf("second sandbox could list or read the first's workspace (errors: %q)", rep.PeekErrors)
	}
	for _, e := range rep.PeekErrors {
		if !strings.Contains(e, "permission denied") {
			t.Errorf("peek error %q, want permission denied", e)
		}
	}

	if err := first.Cleanup(); err != nil {
		t.Fatal(err)
	}
	third := launch(t, l, testSpec(t, "run_third", "report 127.0.0.1:1"))
	wait(t, third)
	if rep := readReport(t, third); rep.UID != base {
		t.Errorf("after the first sandbox's Cleanup the next one ran as %d, want its freed uid %d", rep.UID, base)
	}
}
