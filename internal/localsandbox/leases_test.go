//go:build linux

package localsandbox_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/localsandbox"
)

// The holder helper is a second belay process: the test binary run again,
// which builds a launcher of its own, starts one sandbox (the test entry,
// "sleep") and reports it on stdout, then holds it until its stdin closes.
const (
	holderWorkRootEnv = "BELAY_LOCALSANDBOX_TEST_WORKROOT"
	holderUIDEnv      = "BELAY_LOCALSANDBOX_TEST_UID"  // first uid and gid; empty for the default
	holderUIDsEnv     = "BELAY_LOCALSANDBOX_TEST_UIDS" // how many
)

// holding is what the holder reports of its sandbox.
type holding struct {
	UID       int
	PID       int
	Workspace string
	Err       string
}

// holderScenario runs in the helper process.
func holderScenario() int {
	res := func() (h holding) {
		tb := &helperTB{}
		defer func() {
			if r := recover(); r != nil && r != errHelperFailed {
				panic(r)
			}
			if tb.failure != "" {
				h.Err = tb.failure
			}
		}()
		api, seen := recordingAPI(tb)
		cfg := localsandbox.Config{EntryPath: os.Getenv(helperEntryEnv), WorkRoot: os.Getenv(holderWorkRootEnv), Internal: api}
		if v := os.Getenv(holderUIDEnv); v != "" {
			cfg.UID, _ = strconv.Atoi(v)
			cfg.GID = cfg.UID
			cfg.UIDs, _ = strconv.Atoi(os.Getenv(holderUIDsEnv))
		}
		l, err := localsandbox.New(cfg)
		if err != nil {
			tb.Fatalf("New: %v", err)
		}
		sb, err := l.Launch(context.Background(), testSpec(tb, "run_holder", "sleep"))
		if err != nil {
			tb.Fatalf("Launch: %v", err)
		}
		select {
		case <-seen:
		case <-time.After(time.Minute):
			tb.Fatalf("the holder's sandbox never reported ready: %s", sb.(*localsandbox.Sandbox).OutputTail())
		}
		s := sb.(*localsandbox.Sandbox)
		return holding{UID: fileOwner(tb, filepath.Join(s.Workspace(), "tokens")), PID: s.PID(), Workspace: s.Workspace()}
	}()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil || res.Err != "" {
		return 1
	}
	// Hold the sandbox until the test closes stdin; then the deferred
	// Cleanup of a real belay is Cleanup here.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// holder is a running holder process.
type holder struct {
	holding
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startHolder starts a holder over workRoot (with the sandbox uid range
// [first, first+count) when count > 0) and waits for its report. The
// process is stopped when the test ends.
func startHolder(tb testing.TB, workRoot string, first, count int) *holder {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{helperEnv + "=holder", helperEntryEnv + "=" + testEntry, holderWorkRootEnv + "=" + workRoot,
		"PATH=/usr/local/bin:/usr/bin:/bin"}
	if count > 0 {
		cmd.Env = append(cmd.Env, holderUIDEnv+"="+strconv.Itoa(first), holderUIDsEnv+"="+strconv.Itoa(count))
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin}
	tb.Cleanup(func() { h.stop(tb) })
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		tb.Fatalf("the holder process reported nothing (%v); stderr:\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(line, &h.holding); err != nil || h.Err != "" {
		tb.Fatalf("holder process: %v %s\nstderr:\n%s", err, h.Err, stderr.String())
	}
	return h
}

// stop ends the holder the way a belay ends: it cleans its sandbox up and
// exits.
func (h *holder) stop(tb testing.TB) {
	tb.Helper()
	if h.cmd.ProcessState != nil {
		return
	}
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		tb.Errorf("holder process: %v", err)
	}
}

// kill ends the holder the way a crashed belay ends: SIGKILL, no cleanup.
func (h *holder) kill(tb testing.TB) {
	tb.Helper()
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

// freeRange picks the first of count uids (and gids) for a test that needs
// ids no other test uses at the same time: a random range among 40000–59999,
// far from the default range other tests and belays use.
func freeRange(tb testing.TB, count int) int {
	tb.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	first := 40000 + int(binary.LittleEndian.Uint32(b[:])%uint32(20000-count))
	// The lease files of a range no one else uses go with the test, so
	// test runs do not pile them up in /run/belay/uids.
	tb.Cleanup(func() {
		for id := first; id < first+count; id++ {
			for _, kind := range []string{"uid-", "gid-"} {
				_ = os.Remove(filepath.Join(localsandbox.DefaultLeaseDir, kind+strconv.Itoa(id)))
			}
		}
	})
	return first
}

// processesOf lists the processes on the host that run as uid (any of
// their four uids).
func processesOf(tb testing.TB, uid int) []int {
	tb.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && strings.Contains(" "+strings.Join(strings.Fields(v), " ")+" ", " "+strconv.Itoa(uid)+" ") {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// waitNoProcessesOf waits until nothing runs as uid; the bound only turns
// a hang into a failure.
func waitNoProcessesOf(tb testing.TB, uid int) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(processesOf(tb, uid)) > 0 {
		if time.Now().After(deadline) {
			tb.Fatalf("processes of uid %d still run: %v", uid, processesOf(tb, uid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTwoBelayProcessesNeverShareAUID performs the attack of issue 16,
// hole 2: two belays on one host, each running a sandbox at the same time.
// The first is another process (a holder); the second is this one, and its
// sandbox finds the first sandbox through the host's /proc and tries to
// read and rewrite its workspace. Both launchers use the default uid
// range, as two `belay serve` would: with per-process uid pools both
// sandboxes ran as 10001 and the attack read the spec and rewrote the
// repository. With host-wide leases the uids differ and every attempt is
// refused.
func TestTwoBelayProcessesNeverShareAUID(t *testing.T) {
	requireRoot(t)
	first := startHolder(t, filepath.Join(shortTempDir(t), "w"), 0, 0)

	api, _ := recordingAPI(t)
	l, _, _ := newLauncher(t, "", api)
	sb := launch(t, l, testSpec(t, "run_attacker", "procattack "+first.Workspace))
	if exit := wait(t, sb); exit.ExitCode != 0 {
		t.Fatalf("attacker entry exited %d: %s", exit.ExitCode, sb.OutputTail())
	}
	rep := readReport(t, sb)
	last := localsandbox.DefaultSandboxID + localsandbox.DefaultSandboxIDs - 1
	if rep.UID == first.UID || first.UID < localsandbox.DefaultSandboxID || first.UID > last ||
		rep.UID < localsandbox.DefaultSandboxID || rep.UID > last {
		t.Fatalf("the two belays' sandboxes ran as uids %d and %d; want two different uids of the default range", first.UID, rep.UID)
	}
	if rep.AttackTarget != first.PID {
		t.Fatalf("the attacker found pid %d through /proc, want the other belay's sandbox %d: the attack was not performed", rep.AttackTarget, first.PID)
	}
	if len(rep.Attacks) < 8 {
		t.Fatalf("the attacker reports only %v", rep.Attacks)
	}
	for attempt, outcome := range rep.Attacks {
		if !strings.Contains(outcome, "permission denied") {
			t.Errorf("%s on the other belay's sandbox: %s; want permission denied", attempt, outcome)
		}
	}
	if _, err := os.Stat(filepath.Join(first.Workspace, "repo", "a.py")); err == nil {
		t.Error("the attacker wrote into the other belay's repository")
	}
}

// TestIDsOwningAProcessAreSkipped leaves a process running as a sandbox
// uid (or gid), as a crashed belay or other software might: the launcher
// must not hand that id out while the process lives, and hands it out
// again once it is gone.
func TestIDsOwningAProcessAreSkipped(t *testing.T) {
	requireRoot(t)
	for _, tt := range []struct {
		name     string
		uid, gid func(first int) int
	}{
		{"uid", func(first int) int { return first }, func(int) int { return 65534 }},
		{"gid", func(int) int { return 65534 }, func(first int) int { return first }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			first := freeRange(t, 2)
			left := exec.Command("/bin/sleep", "3600")
			left.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
				Uid: uint32(tt.uid(first)), Gid: uint32(tt.gid(first)), Groups: []uint32{}}}
			if err := left.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = left.Process.Kill(); _ = left.Wait() }()

			api, _ := recordingAPI(t)
			l, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"),
				Internal: api, UID: first, GID: first, UIDs: 2})
			if err != nil {
				t.Fatal(err)
			}
			sb := launch(t, l, testSpec(t, "run_skip", "report 127.0.0.1:1"))
			wait(t, sb)
			if rep := readReport(t, sb); rep.UID != first+1 || rep.GID != first+1 {
				t.Errorf("with a process of %s %d left, the sandbox ran as %d:%d; want %d:%d", tt.name, first, rep.UID, rep.GID, first+1, first+1)
			}
			if err := sb.Cleanup(); err != nil {
				t.Fatal(err)
			}

			_ = left.Process.Kill()
			_ = left.Wait()
			again := launch(t, l, testSpec(t, "run_again", "report 127.0.0.1:1"))
			wait(t, again)
			if rep := readReport(t, again); rep.UID != first {
				t.Errorf("once the process was gone the sandbox ran as %d; want the freed %d", rep.UID, first)
			}
		})
	}
}

// TestIDsAreLeasedAcrossLaunchers holds the only uid of a range with one
// launcher: a second launcher in the same process and a holder in another
// process both find it taken, say so, and get it once it is released.
func TestIDsAreLeasedAcrossLaunchers(t *testing.T) {
	requireRoot(t)
	first := freeRange(t, 1)
	api, _ := recordingAPI(t)
	newOne := func() *localsandbox.Launcher {
		l, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"),
			Internal: api, UID: first, GID: first, UIDs: 1})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	one, two := newOne(), newOne()
	only := launch(t, one, testSpec(t, "run_only", "sleep"))
	sb, err := two.Launch(context.Background(), testSpec(t, "run_extra", "sleep"))
	if err == nil {
		sb.Cleanup()
		t.Fatal("a second launcher got the uid a running sandbox holds")
	}
	if !strings.Contains(err.Error(), "in use: 1 leased by running sandboxes") {
		t.Errorf("Launch with the only uid held elsewhere = %v; want it to say the uid is leased", err)
	}
	lease := filepath.Join(localsandbox.DefaultLeaseDir, "uid-"+strconv.Itoa(first))
	if b, err := os.ReadFile(lease); err != nil || strings.TrimSpace(string(b)) != only.Workspace() {
		t.Errorf("lease file %s holds %q (%v); want the workspace %s", lease, b, err, only.Workspace())
	}
	if err := only.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(lease); err != nil || len(b) != 0 {
		t.Errorf("after Cleanup the lease file holds %q (%v); want it empty", b, err)
	}
	h := startHolder(t, filepath.Join(shortTempDir(t), "w"), first, 1)
	if h.UID != first {
		t.Errorf("the other process's sandbox ran as %d; want the freed %d", h.UID, first)
	}
	if sb, err := two.Launch(context.Background(), testSpec(t, "run_extra", "sleep")); err == nil {
		sb.Cleanup()
		t.Fatal("a launcher got the uid another process's sandbox holds")
	}
}

// TestIDsOfAWorkspaceLeftBehindAreSkipped kills a belay (a holder) while
// its sandbox runs: the kernel drops its lease and its sandbox dies with
// it, but its workspace, with files of that uid, stays until a launcher on
// that WorkRoot sweeps it. Meanwhile no launcher hands that uid out.
func TestIDsOfAWorkspaceLeftBehindAreSkipped(t *testing.T) {
	requireRoot(t)
	first := freeRange(t, 1)
	deadRoot := filepath.Join(shortTempDir(t), "w")
	h := startHolder(t, deadRoot, first, 1)
	h.kill(t)
	waitNoProcessesOf(t, first)
	if _, err := os.Stat(h.Workspace); err != nil {
		t.Fatalf("the killed belay's workspace is gone already (%v); the test needs it left behind", err)
	}

	api, _ := recordingAPI(t)
	l, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: filepath.Join(shortTempDir(t), "w"),
		Internal: api, UID: first, GID: first, UIDs: 1})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := l.Launch(context.Background(), testSpec(t, "run_after", "report 127.0.0.1:1"))
	if err == nil {
		sb.Cleanup()
		t.Fatal("a launcher handed out the uid whose files are still in a workspace left behind")
	}
	if !strings.Contains(err.Error(), "1 owning a workspace left behind") || !strings.Contains(err.Error(), h.Workspace) {
		t.Errorf("Launch = %v; want it to name the workspace left behind", err)
	}

	// A launcher on the dead belay's WorkRoot sweeps the workspace.
	if _, err := localsandbox.New(localsandbox.Config{EntryPath: testEntry, WorkRoot: deadRoot, Internal: api, UID: first, GID: first, UIDs: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.Workspace); !os.IsNotExist(err) {
		t.Fatalf("the workspace left behind was not swept (%v)", err)
	}
	sb2 := launch(t, l, testSpec(t, "run_after", "report 127.0.0.1:1"))
	wait(t, sb2)
	if rep := readReport(t, sb2); rep.UID != first {
		t.Errorf("after the sweep the sandbox ran as %d; want %d", rep.UID, first)
	}
}
