package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/ocisandbox"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// The tests in this file run the whole embedded control plane with the
// OCI launcher, `belay serve`'s default: each run's sandbox is the real
// image (built by make test, BELAY_TEST_SANDBOX_IMAGE) under runc, the
// entry in claim mode as the Fargate task starts it. The attacks of issue
// 16 are performed the way its threat model says an attacker can: by the
// model's tool calls (shell commands, approved by the run's allow_all
// policy) and by the run's uploaded files that the checks execute.

// startOCI starts a control plane whose upstream is p and whose sandboxes
// run in the image under runc.
func startOCI(tb testing.TB, p *provider, logs *embeddedtest.Logs) plane {
	tb.Helper()
	return startOCIWith(tb, p, logs, func(*embedded.Config) {})
}

// startOCIWith starts a control plane as startOCI does, with change
// applied to its configuration.
func startOCIWith(tb testing.TB, p *provider, logs *embeddedtest.Logs, change func(*embedded.Config)) plane {
	tb.Helper()
	cfg := embeddedtest.Config(tb, logs)
	embeddedtest.OCI(tb, &cfg)
	change(&cfg)
	cfg.ScriptedModel = ""
	cfg.Model = e2eModel
	cfg.ModelAPIURL = p.srv.URL + "/v1/chat/completions"
	cfg.ModelAPIKey = providerKey
	m := embeddedtest.Start(tb, cfg)
	tb.Cleanup(func() {
		p.Release()
		p.srv.CloseClientConnections()
	})
	if kind, _ := m.Launcher(); kind != embedded.LauncherOCI {
		tb.Fatalf("the control plane runs the %s launcher, want oci", kind)
	}
	return plane{m: m, c: clientOf(tb, m), cfg: cfg}
}

// TestOCIFixesTheExample is the demo's run with the OCI launcher: the
// example session fixes calc.py inside the image, the run completes, and
// its patch is byte for byte the one the process launcher's run gives.
func TestOCIFixesTheExample(t *testing.T) {
	script, err := scriptedmodel.LoadScript(filepath.Join(embeddedtest.ModuleRoot(t), "examples", "sessions", "fix-calc.json"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &embeddedtest.Logs{}
	oci := startOCI(t, newProvider(t, script, 0), logs)
	created, err := oci.c.CreateRun(context.Background(), calcRequest(t), "")
	if err != nil {
		t.Fatal(err)
	}
	events, run := oci.finished(t, created.RunID)
	if run.Status != belay.StatusCompleted || len(run.Checks) != 1 || run.Checks[0].ExitCode != 0 {
		t.Fatalf("run ended %s (reason %q, checks %+v); want completed with pytest passing; events: %s",
			run.Status, run.Reason, run.Checks, eventTypes(events))
	}
	checkCausalOrder(t, events)
	patch, err := oci.c.GetArtifact(context.Background(), created.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	applyAndTest(t, calcRequest(t).Files, patch)

	// The same session with the process launcher and the entry built
	// from this tree.
	proc := startWith(t, newProvider(t, script, 0), nil, "")
	created2, err := proc.c.CreateRun(context.Background(), calcRequest(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, run2 := proc.finished(t, created2.RunID); run2.Status != belay.StatusCompleted {
		t.Fatalf("the process launcher's run ended %s (%q)", run2.Status, run2.Reason)
	}
	patch2, err := proc.c.GetArtifact(context.Background(), created2.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(patch, patch2) {
		t.Errorf("the patches differ:\noci:\n%s\nprocess:\n%s", patch, patch2)
	}
	if strings.Contains(logs.String(), workspaceEnvClaim+"=") {
		t.Error("the logs hold the claim variable")
	}
}

// workspaceEnvClaim is the claim's variable, which no log line may show
// with a value.
const workspaceEnvClaim = "BELAY_CLAIM"

// plantCommand plants, in every place a shell command might write outside
// its workspace, a pytest configuration and a conftest.py that would turn
// any later pytest run into a pass, each under a name unique to this
// sandbox; it also forges a result bundle in the workspace's out/ folder
// (outputs are uploaded by the entry, so nothing reads it) and fills
// /dev/shm, which must be gone with the sandbox.
const plantCommand = `id=$(cat /proc/sys/kernel/random/uuid)
conftest='import pytest
def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'
for d in / /workspace/.. /usr/lib/python3/dist-packages /tmp /var/tmp /dev/shm; do
  printf '%s' "$conftest" > "$d/conftest.py" 2>/dev/null && echo "planted $d/conftest.py"
  printf '[pytest]\naddopts = -p no:cacheprovider\n' > "$d/pytest.ini" 2>/dev/null && echo "planted $d/pytest.ini"
  touch "$d/planted-$id" 2>/dev/null
done
mkdir -p /workspace/out && printf '{"status":"completed","exitCode":0}' > /workspace/out/result.json && echo "forged out/result.json"
head -c 67108864 /dev/zero > /dev/shm/fill-$id && echo "filled /dev/shm"
echo "plant done"`

// TestOCIAttacks runs two attacking runs at once and a third after them,
// all on the calc example with its failing test left unfixed. Each run's
// model plants configuration wherever it can write outside its workspace
// (to make a later pytest pass), then runs the probe (probe.py, one of the
// run's uploaded files) with a shell command. Every run must fail its
// check as it should: nothing one planted reached another. The probe
// shows each sandbox alone: the image's user with no capability, seccomp,
// a read-only root (nothing can be planted above the workspace), private
// scratch folders holding only its own plants, its own /proc, only
// loopback, no host socket, unshare and mount refused, and api.sock that
// cannot be renamed or replaced.
func TestOCIAttacks(t *testing.T) {
	targets := ocisandboxtest.ListenOnHost(t, ocisandbox.APISocketPath)
	script := scriptedmodel.Script{Name: "attack", Steps: []scriptedmodel.Step{
		step("shell", map[string]string{"command": plantCommand}),
		step("shell", map[string]string{"command": "python3 probe.py '" + targets.JSON() + "'"}),
		finish("Planted what I could and probed."),
	}}
	logs := &embeddedtest.Logs{}
	pl := startOCI(t, newProvider(t, script, 0), logs)
	req := calcRequest(t)
	req.Files = append(req.Files, belay.File{Path: "probe.py", Content: ocisandboxtest.ProbeScript})
	req.Approval = belay.ApprovalConfig{Policy: belay.PolicyAllowAll}

	attack := func(t *testing.T) (plant string, probe ocisandboxtest.ProbeResult) {
		created, err := pl.c.CreateRun(context.Background(), req, "")
		if err != nil {
			t.Fatal(err)
		}
		events, run := pl.finished(t, created.RunID)
		var results []toolResult
		for _, r := range toolResults(t, events) {
			if r.Name == "shell" {
				results = append(results, r)
			}
		}
		if len(results) != 2 || results[0].IsError || results[1].IsError {
			t.Fatalf("shell results %+v, want 2 that ran; events: %s", results, eventTypes(events))
		}
		if run.Status != belay.StatusFailed || run.Reason != "checks_failed" || len(run.Checks) != 1 ||
			run.Checks[0].ExitCode != 1 || !strings.Contains(run.Checks[0].OutputTail, "1 failed") {
			t.Errorf("run ended %s (%q), checks %+v; want failed, checks_failed: pytest's 1 failed, whatever was planted", run.Status, run.Reason, run.Checks)
		}
		return results[0].Result, ocisandboxtest.ParseProbe(t, results[1].Result)
	}

	// A group's parallel subtests run together, and t.Run returns once
	// both have ended.
	t.Run("concurrent", func(t *testing.T) {
		for i := range 2 {
			t.Run(fmt.Sprintf("run-%d", i+1), func(t *testing.T) {
				t.Parallel()
				plant, probe := attack(t)
				checkAttack(t, plant, probe, targets)
			})
		}
	})
	t.Run("after", func(t *testing.T) {
		plant, probe := attack(t)
		checkAttack(t, plant, probe, targets)
	})
	if strings.Contains(logs.String(), workspaceEnvClaim+"=") {
		t.Error("the logs hold the claim variable")
	}
}

// checkAttack checks one attacking run's plant output and probe.
func checkAttack(t *testing.T, plant string, probe ocisandboxtest.ProbeResult, targets ocisandboxtest.Targets) {
	t.Helper()
	for _, line := range strings.Split(plant, "\n") {
		if strings.HasPrefix(line, "planted ") && !strings.HasPrefix(line, "planted /tmp/") &&
			!strings.HasPrefix(line, "planted /var/tmp/") && !strings.HasPrefix(line, "planted /dev/shm/") {
			t.Errorf("%s: a shell command wrote outside the workspace and the sandbox's own scratch folders", line)
		}
	}
	if !strings.Contains(plant, "planted /tmp/conftest.py") || !strings.Contains(plant, "filled /dev/shm") || !strings.Contains(plant, "plant done") {
		t.Errorf("the plant did not run as expected:\n%s", plant)
	}
	ocisandboxtest.CheckProbe(t, probe, targets, hardening.Sandbox, "belay-sandbox", "sh", "python3", "unshare")
	// The scratch folders hold this sandbox's own plants, from one id:
	// nothing of the concurrent run's, nothing of the earlier runs'.
	ids := map[string]bool{}
	for _, p := range probe.ScratchBefore {
		base := filepath.Base(p)
		if id, ok := strings.CutPrefix(base, "planted-"); ok {
			ids[id] = true
		} else if id, ok := strings.CutPrefix(base, "fill-"); ok {
			ids[id] = true
		}
	}
	if len(ids) != 1 {
		t.Errorf("the scratch folders hold plants of %d sandboxes, want only this one's: %v", len(ids), probe.ScratchBefore)
	}
	// /proc: the entry as init, the shell and the probe.
	if probe.Cmdlines[0] != hardening.Sandbox.Entrypoint[0] {
		t.Errorf("pid 1 is %q, want the entry", probe.Cmdlines[0])
	}
}

// limitsTests are uploaded tests that a run's final check executes: a fork
// bomb, which must stop at the sandbox's process limit, and a write past
// the file size limit (a sparse one: one byte at 2 GiB).
const limitsTests = `import errno, os, time

def test_fork_bomb():
    # Every process forks until the kernel refuses; the first refusal in
    # the test's own process counts what the sandbox holds then.
    me = os.getpid()
    while True:
        try:
            os.fork()
        except OSError as e:
            if os.getpid() != me:
                time.sleep(3)
                os._exit(0)
            n = sum(1 for p in os.listdir("/proc") if p.isdigit())
            print("BOMB refused errno=%d processes=%d" % (e.errno, n), flush=True)
            time.sleep(4)
            assert False, "the fork bomb was stopped"

def test_file_size_limit():
    fd = os.open("big.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"x", 2 << 30)
    except OSError as e:
        assert e.errno == errno.EFBIG, errno.errorcode[e.errno]
        return
    finally:
        os.close(fd)
    assert False, "wrote past the file size limit"
`

// entryThreadReserve is how many of the sandbox user's processes and
// threads the entry keeps from the commands it runs (internal/sandbox's
// reserve, lowering each command's RLIMIT_NPROC).
const entryThreadReserve = 64

// TestOCILimits runs uploaded tests against the sandbox's limits, each
// run ending cleanly: a fork bomb stops at the nproc limit, short of the
// entry's reserve (and the entry
// still writes, validates and uploads the run's result), a write past the
// file size limit is refused, and memory past the limit ends in an OOM
// kill that the control plane reports as such.
func TestOCILimits(t *testing.T) {
	script := scriptedmodel.Script{Name: "finish at once", Steps: []scriptedmodel.Step{finish("Nothing to do.")}}
	pl := startOCI(t, newProvider(t, script, 0), nil)
	p := hardening.Sandbox

	t.Run("processes and file size", func(t *testing.T) {
		req := calcRequest(t)
		req.Files = []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a + b\n"},
			{Path: "tests/test_limits.py", Content: limitsTests}}
		run := runToEnd(t, pl, req)
		if run.Status != belay.StatusFailed || run.Reason != "checks_failed" || len(run.Checks) != 1 {
			t.Fatalf("run ended %s (%q), checks %+v; want failed, checks_failed", run.Status, run.Reason, run.Checks)
		}
		out := run.Checks[0].OutputTail
		i := strings.Index(out, "BOMB refused errno=11 processes=")
		if i < 0 {
			t.Fatalf("the fork bomb did not report a refusal (EAGAIN):\n%s", out)
		}
		n, _ := strconv.Atoi(strings.Fields(out[i+len("BOMB refused errno=11 processes="):])[0])
		// The sandbox's nproc limit (its user's host uid is its own)
		// stops the bomb before the pids cgroup does: the check runs with
		// entryThreadReserve fewer than the entry, whose threads count
		// in the same limit.
		t.Logf("the fork bomb was refused (EAGAIN) with %d processes in the sandbox", n)
		if n > p.Processes-entryThreadReserve || n < p.Processes/2 {
			t.Errorf("the fork bomb was refused with %d processes in the sandbox; want it stopped by the nproc limit of %d less the entry's reserve of %d", n, p.Processes, entryThreadReserve)
		}
		// test_file_size_limit passes only when the write was refused.
		if !strings.Contains(out, "1 failed, 1 passed") || !strings.Contains(out, "the fork bomb was stopped") {
			t.Errorf("want the bomb's test failed and the file size test passed (the write past %d MiB refused):\n%s", p.FileSizeMiB, out)
		}
	})

	t.Run("memory", func(t *testing.T) {
		req := calcRequest(t)
		req.Files = append(req.Files, belay.File{Path: "tests/test_memory.py", Content: fmt.Sprintf(
			"def test_memory():\n    b = bytearray(b'x') * (%d << 20)\n    assert len(b) > 0\n", p.MemoryMiB+512)})
		run := runToEnd(t, pl, req)
		if run.Status != belay.StatusFailed || run.Reason != orchestrator.ReasonOutOfMemory {
			t.Errorf("run ended %s (%q), checks %+v; want failed, %q", run.Status, run.Reason, run.Checks, orchestrator.ReasonOutOfMemory)
		}
		if len(run.Checks) != 1 || run.Checks[0].ExitCode == 0 {
			t.Errorf("checks %+v; want pytest killed", run.Checks)
		}
	})
}

func runToEnd(t *testing.T, pl plane, req belay.RunRequest) wire.RunView {
	t.Helper()
	created, err := pl.c.CreateRun(context.Background(), req, "")
	if err != nil {
		t.Fatal(err)
	}
	events, run := pl.finished(t, created.RunID)
	if !slices.ContainsFunc(events, func(e belay.Event) bool { return e.Type == belay.EventSandboxReady }) {
		t.Errorf("no sandbox.ready: %s", eventTypes(events))
	}
	return run
}

// TestOCIImageCacheInDataDir starts the OCI launcher with the default
// image cache, <data dir>/images: as root each sandbox's user namespace
// root (an unprivileged host id) must pass through the data directory to
// mount the image, so the data directory and the cache are searchable by
// others (0711) while the launcher's state and everything else stay the
// owner's; a run's sandbox then starts from that image.
func TestOCIImageCacheInDataDir(t *testing.T) {
	script := scriptedmodel.Script{Name: "finish at once", Steps: []scriptedmodel.Step{finish("Nothing to do.")}}
	pl := startOCIWith(t, newProvider(t, script, 0), nil, func(cfg *embedded.Config) {
		cfg.DataDir = filepath.Join(embeddedtest.SandboxDir(t), "data")
		cfg.ImageCache = ""
	})
	for path, want := range map[string]fs.FileMode{
		pl.cfg.DataDir:                                 0o711,
		filepath.Join(pl.cfg.DataDir, "images"):        0o711,
		filepath.Join(pl.cfg.DataDir, "oci"):           0o700,
		filepath.Join(pl.cfg.DataDir, "artifacts"):     0o700,
		filepath.Join(pl.cfg.DataDir, "signing-key"):   0o600,
		filepath.Join(pl.cfg.DataDir, "control-token"): 0o600,
	} {
		if mode := modeOf(t, path).Perm(); mode != want {
			t.Errorf("%s has mode %04o; want %04o", path, mode, want)
		}
	}
	run := runToEnd(t, pl, calcRequest(t))
	// calc.py keeps its bug: the checks fail, and the run says so.
	if run.Status != belay.StatusFailed || run.Reason != "checks_failed" {
		t.Errorf("run ended %s (%q); want failed, checks_failed (the sandbox ran its checks)", run.Status, run.Reason)
	}
}
