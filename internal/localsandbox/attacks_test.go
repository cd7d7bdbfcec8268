//go:build linux

package localsandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/wire"
)

// The attacks here are performed the way issue 16 found them: by files a
// run uploads, which its checks (python3 -m pytest -q) execute in the
// sandbox. Each attack test reports its outcomes as JSON in an assertion
// message, which reaches the test through the run's final check output.

// checkReport finds "<marker> {json}" in the run's first check output and
// decodes it into v.
func checkReport(t *testing.T, run wire.RunView, marker string, v any) {
	t.Helper()
	if len(run.Checks) == 0 {
		t.Fatalf("the run (%s, %s) has no check results", run.Status, run.Reason)
	}
	m := regexp.MustCompile(regexp.QuoteMeta(marker) + ` (\{.*\})`).FindStringSubmatch(run.Checks[0].OutputTail)
	if m == nil {
		t.Fatalf("the check's output has no %s report:\n%s", marker, run.Checks[0].OutputTail)
	}
	if err := json.Unmarshal([]byte(m[1]), v); err != nil {
		t.Fatalf("the check's %s report %q: %v", marker, m[1], err)
	}
}

// socketAttack is the check that tries to take api.sock and the workspace
// from the sandbox: the token capture of hole 3 starts by renaming
// api.sock and listening on its name with a relay.
const socketAttack = `import errno, json, os, socket

def outcome(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def test_take_the_socket():
    ws = os.path.dirname(os.getcwd())
    sock = os.path.join(ws, "api.sock")
    home = os.path.join(ws, "home")
    relay = os.path.join(home, "relay.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(relay)
    forged = os.path.join(home, "spec.json")
    open(forged, "w").write("{}")
    res = {
        "rename api.sock": outcome(lambda: os.rename(sock, sock + ".old")),
        "move api.sock into home": outcome(lambda: os.rename(sock, os.path.join(home, "api.sock"))),
        "remove api.sock": outcome(lambda: os.unlink(sock)),
        "replace api.sock with a relay": outcome(lambda: os.rename(relay, sock)),
        "bind a relay beside api.sock": outcome(lambda: socket.socket(socket.AF_UNIX).bind(sock + ".relay")),
        "chmod api.sock": outcome(lambda: os.chmod(sock, 0o777)),
        "replace spec.json": outcome(lambda: os.rename(forged, os.path.join(ws, "spec.json"))),
        "rename the workspace": outcome(lambda: os.rename(ws, ws + ".moved")),
        "rename home": outcome(lambda: os.rename(home, home + ".old")),
        "chmod the workspace": outcome(lambda: os.chmod(ws, 0o777)),
    }
    c = socket.socket(socket.AF_UNIX)
    res["connect to api.sock"] = outcome(lambda: c.connect(sock))
    assert False, "ATTACK " + json.dumps(res, sort_keys=True)
`

// TestChecksCannotMoveOrReplaceTheSocket performs the first step of
// hole 3 from a check: rename api.sock, replace it with a relay, move or
// change the workspace. In a workspace of root's every attempt is refused,
// the socket stays the control plane's (the sandbox can still connect to
// it), and the run ends normally with its check result.
func TestChecksCannotMoveOrReplaceTheSocket(t *testing.T) {
	p := newRealPlane(t, finishAtOnce)
	_, run := p.run(t, pytestRequest([]belay.File{{Path: "test_attack.py", Content: socketAttack}}))
	if run.Status != belay.StatusFailed || run.Reason != "checks_failed" {
		t.Fatalf("run ended %s (%s); want failed with checks_failed, the attack's test failing by design; log:\n%s", run.Status, run.Reason, p.logs.String())
	}
	var res map[string]string
	checkReport(t, run, "ATTACK", &res)
	if len(res) != 11 {
		t.Errorf("the attack reports %d outcomes, want 11: %v", len(res), res)
	}
	for attempt, outcome := range res {
		switch {
		case attempt == "connect to api.sock":
			if outcome != "ok" {
				t.Errorf("the sandbox could not connect to api.sock after the attack (%s)", outcome)
			}
		case outcome != "EACCES" && outcome != "EPERM":
			t.Errorf("%s from a check: %s; want it refused (EACCES or EPERM)", attempt, outcome)
		}
	}
}

// plantAbove is run A's check: it tries to leave a pytest.ini and a
// conftest.py that forge success in every folder above its repository,
// where pytest looks for them. (Not in /tmp: in the layout the launcher
// accepts /tmp is not above any workspace, and a file planted there would
// reach other tests on this machine.)
const plantAbove = `import errno, json, os

INI = "[pytest]\naddopts = -p no:cacheprovider\n"
CONFTEST = "def pytest_sessionfinish(session, exitstatus):\n    print('PLANTED CONFTEST RAN')\n    session.exitstatus = 0\n"

def test_plant():
    res = {}
    d = os.path.dirname(os.getcwd())
    while True:
        for name, content in (("pytest.ini", INI), ("conftest.py", CONFTEST)):
            try:
                with open(os.path.join(d, name), "x") as f:
                    f.write(content)
                res[os.path.join(d, name)] = "ok"
            except OSError as e:
                res[os.path.join(d, name)] = errno.errorcode.get(e.errno, str(e.errno))
        if d == "/":
            break
        d = os.path.dirname(d)
    assert False, "PLANT " + json.dumps(res, sort_keys=True)
`

// TestPlantedConfigAboveTheWorkspaceIsUnreachable performs hole 1: run A
// plants pytest.ini and conftest.py (which sets pytest's exit status to 0)
// in the folders above the workspaces; a later run B with a failing test
// must still fail. The launcher refuses a WorkRoot below a folder a sandbox
// could write (TestNewRefusesAWorkRootBelowAWritableFolder), so in the
// layouts it accepts, every folder above A's repository refuses the files.
func TestPlantedConfigAboveTheWorkspaceIsUnreachable(t *testing.T) {
	p := newRealPlane(t, finishAtOnce)
	_, a := p.run(t, pytestRequest([]belay.File{{Path: "test_plant.py", Content: plantAbove}}))
	var res map[string]string
	checkReport(t, a, "PLANT", &res)
	tried := map[string]bool{}
	for path := range res {
		switch dir := filepath.Dir(path); {
		case dir == "/", dir == p.workRoot:
			tried[dir] = true
		case filepath.Dir(dir) == p.workRoot:
			tried["workspace"] = true
		}
	}
	if len(tried) != 3 {
		t.Fatalf("run A did not try its workspace folder, WorkRoot and every folder up to /: %v", res)
	}
	for path, outcome := range res {
		if outcome != "EACCES" && outcome != "EROFS" {
			t.Errorf("run A wrote %s (%s); want every folder above its repository to refuse", path, outcome)
			if outcome == "ok" {
				os.Remove(path)
			}
		}
	}

	_, b := p.run(t, belay.RunRequest{
		Instruction: "Run the checks", Files: calcFiles(t), AllowedPaths: []string{"calc.py"},
		Checks: [][]string{{"python3", "-m", "pytest", "-q"}}, MaxSteps: 3, WallTimeSeconds: 120,
	})
	if b.Status != belay.StatusFailed || b.Reason != "checks_failed" || len(b.Checks) != 1 || b.Checks[0].ExitCode == 0 {
		t.Fatalf("run B ended %s (%s) with checks %+v; want failed: its test fails", b.Status, b.Reason, b.Checks)
	}
	if out := b.Checks[0].OutputTail; !strings.Contains(out, "1 failed") || strings.Contains(out, "PLANTED") {
		t.Errorf("run B's check output:\n%s\nwant its own failing test, untouched by run A", out)
	}
}

// TestNewRefusesAWorkRootBelowAWritableFolder checks the layouts in which a
// run could plant configuration for later runs: a WorkRoot below the
// sticky, world-writable /tmp (where make demo used to put its data), below
// a world-writable folder, a folder of a sandbox uid, a folder its sandbox
// gid may write, or a folder whose ACL lets a sandbox uid write. New must
// refuse each, naming the folder and what to do.
//
// Without root (sandboxes then run as belay's own user) only the folders
// every user may write are refused.
func TestNewRefusesAWorkRootBelowAWritableFolder(t *testing.T) {
	api, _ := recordingAPI(t)
	tests := []struct {
		name    string
		parent  func(t *testing.T) string
		wantWhy string
	}{
		{"sticky /tmp", func(t *testing.T) string {
			dir, err := os.MkdirTemp("", "lsb")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o711); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "its parent " + os.TempDir() + " is writable by every user (the sticky bit"},
		{"world-writable", func(t *testing.T) string {
			dir := shortTempDir(t)
			mustChmod(t, dir, 0o777)
			return dir
		}, "is writable by every user"},
		{"owned by a sandbox uid", func(t *testing.T) string {
			dir := shortTempDir(t)
			mustChown(t, dir, localsandbox.DefaultSandboxID+7, 0)
			return dir
		}, fmt.Sprintf("belongs to uid %d, a sandbox uid", localsandbox.DefaultSandboxID+7)},
		{"writable by a sandbox gid", func(t *testing.T) string {
			dir := shortTempDir(t)
			mustChown(t, dir, 0, localsandbox.DefaultSandboxID+3)
			mustChmod(t, dir, 0o771)
			return dir
		}, fmt.Sprintf("is writable by its group %d, a sandbox gid", localsandbox.DefaultSandboxID+3)},
		{"ACL grants a sandbox uid write", func(t *testing.T) string {
			dir := shortTempDir(t)
			setACL(t, dir, localsandbox.DefaultSandboxID+5)
			return dir
		}, fmt.Sprintf("grants write to uid %d, a sandbox uid, in its ACL", localsandbox.DefaultSandboxID+5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(tt.wantWhy, "every user") {
				requireRoot(t) // sandbox uids exist only as root
			}
			parent := tt.parent(t)
			root := filepath.Join(parent, "w")
			_, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: root, Internal: api})
			if err == nil {
				t.Fatalf("New accepted WorkRoot %s", root)
			}
			suggest := localsandbox.DefaultRootWorkRoot
			if os.Geteuid() != 0 {
				suggest = "outside " + os.TempDir()
			}
			for _, want := range []string{"refusing WorkRoot " + root, tt.wantWhy, "pytest", "BELAY_SANDBOX_DIR", suggest} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("New = %v; want it to say %q", err, want)
				}
			}
		})
	}
}

// setACL grants uid rwx on dir through a POSIX access ACL, written as the
// system.posix_acl_access attribute (what setfacl -m u:UID:rwx does).
func setACL(tb testing.TB, dir string, uid int) {
	tb.Helper()
	entry := func(tag, perm uint16, id uint32) []byte {
		b := make([]byte, 8)
		b[0], b[1], b[2], b[3] = byte(tag), byte(tag>>8), byte(perm), byte(perm>>8)
		b[4], b[5], b[6], b[7] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		return b
	}
	acl := []byte{2, 0, 0, 0}
	acl = append(acl, entry(0x01, 7, 0xffffffff)...)  // owner rwx
	acl = append(acl, entry(0x02, 7, uint32(uid))...) // uid rwx
	acl = append(acl, entry(0x04, 1, 0xffffffff)...)  // group --x
	acl = append(acl, entry(0x10, 7, 0xffffffff)...)  // mask rwx
	acl = append(acl, entry(0x20, 1, 0xffffffff)...)  // other --x
	if err := unix.Setxattr(dir, "system.posix_acl_access", acl, 0); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("set an ACL on %s: %v", dir, err)
		}
		tb.Skipf("this file system takes no ACL (%v)", err)
	}
}

func mustChmod(tb testing.TB, path string, mode os.FileMode) {
	tb.Helper()
	if err := os.Chmod(path, mode); err != nil {
		tb.Fatal(err)
	}
}

func mustChown(tb testing.TB, path string, uid, gid int) {
	tb.Helper()
	if err := os.Chown(path, uid, gid); err != nil {
		tb.Fatal(err)
	}
}

// TestEntryRefusesToStartBelowAWritableFolder makes a folder above the
// workspaces sticky and world-writable after New accepted the layout, as an
// operator might: the real entry must refuse to start, with one line that
// names the folder, before it reads its tokens or builds anything.
func TestEntryRefusesToStartBelowAWritableFolder(t *testing.T) {
	requireRoot(t)
	if realEntryErr != nil {
		t.Fatalf("build the sandbox entry: %v", realEntryErr)
	}
	api, seen := recordingAPI(t)
	parent := shortTempDir(t)
	l, err := localsandbox.New(localsandbox.Config{EntryPath: realEntry, WorkRoot: filepath.Join(parent, "w"), Internal: api})
	if err != nil {
		t.Fatal(err)
	}
	mustChmod(t, parent, 0o1777)
	spec := testSpec(t, "run_refused", "anything")
	sb := launch(t, l, spec)
	exit := wait(t, sb)
	out := strings.TrimSpace(sb.OutputTail())
	if exit.ExitCode != 1 || strings.Count(out, "\n") != 0 {
		t.Fatalf("the entry exited %d with %q; want 1 and one line", exit.ExitCode, out)
	}
	want := "belay-sandbox: refusing to start: " + parent + ", above the workspace, is writable by this user"
	if !strings.HasPrefix(out, want) {
		t.Errorf("the entry said %q; want it to start with %q", out, want)
	}
	if _, err := os.Stat(filepath.Join(sb.Workspace(), "tokens", "model.token")); err != nil {
		t.Errorf("the entry read its tokens before refusing (%v)", err)
	}
	select {
	case r := <-seen:
		t.Errorf("the refused entry called the control plane: %s %s", r.Method, r.Path)
	default:
	}
}

// forkBomb is a check that forks until the kernel says no, then reports how
// far it got.
const forkBomb = `import errno, json, os, time

def test_fork_bomb():
    n, err = 0, None
    try:
        while n < 100000:
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
            n += 1
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
    assert False, "BOMB " + json.dumps({"forked": n, "error": err})
`

// TestForkBombStopsAtTheLimit runs a check that forks without end: the
// sandbox's uid may have hardening.Sandbox.Processes processes and threads,
// so the fork fails with EAGAIN below that number, the run ends normally
// (its check failed), and nothing of the sandbox is left on the host.
func TestForkBombStopsAtTheLimit(t *testing.T) {
	p := newRealPlane(t, finishAtOnce)
	_, run := p.run(t, pytestRequest([]belay.File{{Path: "test_bomb.py", Content: forkBomb}}))
	if run.Status != belay.StatusFailed || run.Reason != "checks_failed" {
		t.Fatalf("run ended %s (%s); want failed with checks_failed (the bomb's test fails by design); log:\n%s", run.Status, run.Reason, p.logs.String())
	}
	var res struct {
		Forked int
		Error  string
	}
	checkReport(t, run, "BOMB", &res)
	if res.Error != "EAGAIN" || res.Forked <= 0 || res.Forked >= hardening.Sandbox.Processes {
		t.Errorf("the bomb forked %d processes and then got %q; want EAGAIN below the limit of %d", res.Forked, res.Error, hardening.Sandbox.Processes)
	}
	t.Logf("the fork bomb stopped after %d processes (limit %d processes and threads for the uid)", res.Forked, hardening.Sandbox.Processes)
	if err := p.orch.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg="sandbox started" run_id=` + run.RunID + ` pid=\d+ uid=(\d+)`).FindStringSubmatch(p.logs.String())
	if m == nil {
		t.Fatalf("no sandbox started for %s in the log", run.RunID)
	}
	uid, _ := strconv.Atoi(m[1])
	waitNoProcessesOf(t, uid)
}

// TestSandboxLimits reads the limits of a running sandbox from the host:
// they are hardening.Sandbox's.
func TestSandboxLimits(t *testing.T) {
	requireRoot(t)
	api, seen := recordingAPI(t)
	l, _, _ := newLauncher(t, "", api)
	sb := launch(t, l, testSpec(t, "run_limits", "sleep"))
	select {
	case <-seen:
	case <-t.Context().Done():
		t.Fatal("the sandbox never reported ready")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", sb.PID()))
	if err != nil {
		t.Fatal(err)
	}
	hs := hardening.Sandbox
	for _, want := range []struct {
		name  string
		value int64
	}{
		{"Max processes", int64(hs.Processes)},
		{"Max file size", int64(hs.FileSizeMiB) << 20},
		{"Max data size", int64(hs.MemoryMiB) << 20},
		{"Max open files", int64(hs.OpenFiles)},
		{"Max core file size", 0},
	} {
		m := regexp.MustCompile(`(?m)^` + want.name + `\s+(\d+)\s+(\d+)`).FindStringSubmatch(string(b))
		if m == nil || m[1] != strconv.FormatInt(want.value, 10) || m[2] != m[1] {
			t.Errorf("%s of the sandbox: %v; want soft and hard %d\n%s", want.name, m, want.value, b)
		}
	}
}

// TestFileSizeLimit writes a file one byte past the limit (lowered to
// 1 MiB so the test writes little): the write fails with EFBIG. With the
// default limit the same write succeeds.
func TestFileSizeLimit(t *testing.T) {
	requireRoot(t)
	for _, tt := range []struct {
		name    string
		limits  *hardening.Profile
		wantErr string
	}{
		{"1 MiB", func() *hardening.Profile { p := hardening.Sandbox; p.FileSizeMiB = 1; return &p }(), "file too large"},
		{"default", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api, _ := recordingAPI(t)
			l, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"),
				Internal: api, Limits: tt.limits})
			if err != nil {
				t.Fatal(err)
			}
			sb := launch(t, l, testSpec(t, "run_fsize", "bigfile "+strconv.Itoa(1<<20+1)))
			if exit := wait(t, sb); exit.ExitCode != 0 {
				t.Fatalf("entry exited %d: %s", exit.ExitCode, sb.OutputTail())
			}
			rep := readReport(t, sb)
			if !strings.Contains(rep.WriteError, tt.wantErr) || (tt.wantErr == "") != (rep.WriteError == "") {
				t.Errorf("writing 1 MiB + 1 byte: error %q; want %q", rep.WriteError, tt.wantErr)
			}
			fi, err := os.Stat(filepath.Join(sb.Workspace(), "home", "big"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" && fi.Size() != 1<<20 {
				t.Errorf("the file grew to %d bytes; want it stopped at the limit (%d)", fi.Size(), 1<<20)
			}
		})
	}
}
