package embedded_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/wire"
)

// The runs of this file lose their sandbox for real: the test SIGKILLs
// every process of it (the entry, and the commands it runs), and the
// control plane resumes the run on a new sandbox from its latest
// checkpoint (DESIGN.md "Checkpoints and resume").

// startResume starts a control plane whose upstream is p and whose
// sandboxes run under launcher: the OCI launcher (belay serve's default:
// the image under runc, as make test builds it) or the process launcher.
func startResume(tb testing.TB, p *provider, launcher string, edits ...func(*embedded.Config)) plane {
	tb.Helper()
	use := func(c *embedded.Config) {
		if launcher == embedded.LauncherOCI {
			embeddedtest.OCI(tb, c)
		}
	}
	pl := startWith(tb, p, nil, "", append([]func(*embedded.Config){use}, edits...)...)
	if kind, _ := pl.m.Launcher(); kind != launcher {
		tb.Fatalf("the control plane runs the %s launcher, want %s", kind, launcher)
	}
	return pl
}

// sandboxEntry finds the live sandbox entry of the run on the host: the
// container's init (its pid file) under the OCI launcher, the process
// started with the run's workspace under the process launcher. It waits
// for one to be there.
func sandboxEntry(tb testing.TB, pl plane, runID string) liveEntry {
	tb.Helper()
	if pl.cfg.Launcher != embedded.LauncherOCI {
		return findEntry(tb, pl.cfg.SandboxDir, runID)
	}
	for deadline := time.Now().Add(runDeadline); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		files, _ := filepath.Glob(filepath.Join(pl.cfg.SandboxDir, runID+"-*", "pid"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				continue
			}
			if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(stat), ") Z ") {
				return liveEntry{pid: pid}
			}
		}
	}
	tb.Fatalf("no live sandbox of run %s under %s", runID, pl.cfg.SandboxDir)
	return liveEntry{}
}

// killSandbox SIGKILLs the whole process tree of the run's live sandbox:
// every process in the entry's PID namespace when it has one of its own
// (the entry is the namespace's init, under runc and under the process
// launcher as root), and otherwise the entry and every process working in
// its workspace.
func killSandbox(tb testing.TB, pl plane, runID string) {
	tb.Helper()
	entry := sandboxEntry(tb, pl, runID)
	ns := func(pid int) string {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		return l
	}
	own, theirs := ns(os.Getpid()), ns(entry.pid)
	procs, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	_ = syscall.Kill(entry.pid, syscall.SIGKILL)
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == entry.pid {
			continue
		}
		inWorkspace := false
		if cwd, err := os.Readlink(filepath.Join("/proc", d.Name(), "cwd")); err == nil && entry.workspace != "" {
			inWorkspace = strings.HasPrefix(cwd, entry.workspace+"/")
		}
		if (theirs != own && theirs != "" && ns(pid) == theirs) || inWorkspace {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Dead, or a zombie its launcher has yet to reap: either way it reads
	// and answers nothing more.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", entry.pid))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
	}
	tb.Fatalf("the sandbox entry %d outlived its SIGKILL", entry.pid)
}

// waitView polls the run until ok says so.
func waitView(tb testing.TB, pl plane, runID string, what string, ok func(wire.RunView) bool) wire.RunView {
	tb.Helper()
	deadline := time.Now().Add(runDeadline)
	for {
		run, err := pl.c.GetRun(context.Background(), runID)
		if err != nil {
			tb.Fatal(err)
		}
		if ok(run) {
			return run
		}
		if run.Status.Terminal() || time.Now().After(deadline) {
			tb.Fatalf("run %s is %s (%s) and never came to %s; checkpoint %+v", runID, run.Status, run.Reason, what, run.Checkpoint)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkpointHolds reads the run's latest checkpoint from the data
// directory's artifact folder and reports whether the workspace change in
// it gives path the content want.
func checkpointHolds(tb testing.TB, dataDir, runID string, ref *belay.CheckpointRef, path, want string) bool {
	tb.Helper()
	if ref == nil {
		return false
	}
	arts, err := localdir.New(filepath.Join(dataDir, "artifacts"))
	if err != nil {
		tb.Fatal(err)
	}
	defer arts.Close()
	b, err := arts.GetArtifact(context.Background(), runID, ref.Name())
	if err != nil {
		return false // pruned by a newer one meanwhile
	}
	var c wire.Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		tb.Fatalf("checkpoint %d: %v", ref.Seq, err)
	}
	for _, f := range c.Workspace.Files {
		if f.Path == path && string(f.Content()) == want {
			return true
		}
	}
	return false
}

// requestsAt returns the provider's requests that asked for script step i.
func requestsAt(p *provider, i int) []scriptedmodel.Request {
	var out []scriptedmodel.Request
	for _, r := range p.model.Requests() {
		if r.Step == i {
			out = append(out, r)
		}
	}
	return out
}

// assertLogWhole checks a run's event log: gapless from 1, and no tool
// call reported twice (each call id has one tool.call and at most one
// tool.result), one run.started, one terminal event.
func assertLogWhole(tb testing.TB, events []belay.Event) {
	tb.Helper()
	calls, results := map[string]int{}, map[string]int{}
	counts := map[string]int{}
	for i, e := range events {
		if e.Seq != int64(i+1) {
			tb.Fatalf("event %d has seq %d: the log has a gap or a duplicate; events: %s", i, e.Seq, eventTypes(events))
		}
		counts[e.Type]++
		switch e.Type {
		case belay.EventToolCall, belay.EventToolResult:
			var d struct {
				Step   int    `json:"step"`
				CallID string `json:"callId"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				tb.Fatal(err)
			}
			key := fmt.Sprintf("%d/%s", d.Step, d.CallID)
			if e.Type == belay.EventToolCall {
				calls[key]++
			} else {
				results[key]++
			}
		}
	}
	for k, n := range calls {
		if n != 1 {
			tb.Errorf("tool call %s reported %d times", k, n)
		}
	}
	for k, n := range results {
		if n != 1 || calls[k] != 1 {
			tb.Errorf("tool call %s has %d results and %d calls", k, n, calls[k])
		}
	}
	if counts[belay.EventRunStarted] != 1 || counts[belay.EventRunCompleted]+counts[belay.EventRunFailed]+counts[belay.EventRunCancelled] != 1 {
		tb.Errorf("events %v: want one run.started and one terminal event", counts)
	}
}

// resumeRequest is the calc example with a counter file the agent may
// change, and shell commands that need a person's approval.
func resumeRequest(tb testing.TB, maxSteps int) belay.RunRequest {
	tb.Helper()
	req := calcRequest(tb)
	req.Files = append(req.Files, belay.File{Path: "counter.txt", Content: "start\n"})
	req.AllowedPaths = []string{"calc.py", "counter.txt"}
	req.MaxSteps = maxSteps
	req.Approval = belay.ApprovalConfig{Policy: belay.PolicyAsk, TimeoutSeconds: 120}
	return req
}

// TestResumeAfterSandboxKilledMidCommand is issue 12's first proof: the
// agent writes calc.py, then runs an approved shell command that appends a
// line to a counter file and sleeps; the sandbox's whole process tree is
// SIGKILLed while the command sleeps. The run resumes on a new sandbox
// (attempt 2): the model's next request answers the command as
// interrupted, the command is not run again (the counter holds its line
// once, and no second approval is asked), the file written before the kill
// and the counter line are in the final patch, and the run completes.
func TestResumeAfterSandboxKilledMidCommand(t *testing.T) {
	for _, launcher := range []string{embedded.LauncherOCI, embedded.LauncherProcess} {
		t.Run(launcher, func(t *testing.T) {
			t.Parallel()
			testResumeAfterSandboxKilledMidCommand(t, launcher)
		})
	}
}

func testResumeAfterSandboxKilledMidCommand(t *testing.T, launcher string) {
	script := scriptedmodel.Script{Name: "killed mid-command", Steps: []scriptedmodel.Step{
		step("edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
		step("shell", map[string]string{"command": "echo ran >> counter.txt && sleep 300"}),
		finish("Fixed add; the long command was interrupted."),
	}}
	p := newProvider(t, script, 0)
	pl := startResume(t, p, launcher)
	ctx := context.Background()
	created, err := pl.c.CreateRun(ctx, resumeRequest(t, 8), "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	asked := awaitEvent(t, pl.c, id, func(e belay.Event) bool { return e.Type == belay.EventApprovalRequested })
	var ask struct {
		ApprovalID string `json:"approvalId"`
	}
	if err := json.Unmarshal(asked.Data, &ask); err != nil || ask.ApprovalID == "" {
		t.Fatalf("approval.requested %s: %v", asked.Data, err)
	}
	if _, err := pl.c.Decide(ctx, id, ask.ApprovalID, belay.DecisionAllowOnce, "go ahead"); err != nil {
		t.Fatal(err)
	}
	// The command's line is in a checkpoint saved while it runs.
	waitView(t, pl, id, "a checkpoint holding the counter line", func(r wire.RunView) bool {
		return r.Checkpoint != nil && r.Checkpoint.Pending == "shell" &&
			checkpointHolds(t, pl.cfg.DataDir, id, r.Checkpoint, "counter.txt", "start\nran\n")
	})
	killSandbox(t, pl, id)

	events, run := pl.finished(t, id)
	if run.Status != belay.StatusCompleted {
		t.Fatalf("run ended %s (%q); want completed after the resume; events: %s", run.Status, run.Reason, eventTypes(events))
	}
	if run.Attempt != 2 || len(run.Attempts) != 2 || run.Attempts[0].Lost != orchestrator.ReasonKilled || run.Attempts[1].Lost != "" {
		t.Errorf("attempts %d %+v; want 2, the first lost to the kill", run.Attempt, run.Attempts)
	}
	reqs := requestsAt(p, 2)
	if len(reqs) != 1 {
		t.Fatalf("%d model requests after the command; want 1", len(reqs))
	}
	last := reqs[0].Messages[len(reqs[0].Messages)-1]
	var interrupted agent.Interrupted
	if last.Role != "tool" || json.Unmarshal([]byte(last.Content), &interrupted) != nil || !interrupted.Interrupted || !strings.Contains(interrupted.Reason, "sandbox killed") {
		t.Fatalf("the model's next request answers the command with %+v; want {interrupted: true} naming the kill", last)
	}
	approvals, err := pl.c.ListApprovals(ctx, id)
	if err != nil || len(approvals) != 1 {
		t.Errorf("approvals %+v (%v); want the one, never asked again", approvals, err)
	}
	patch, err := pl.c.GetArtifact(ctx, id, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(patch), "+    return a + b") || strings.Count(string(patch), "\n+ran\n") != 1 {
		t.Fatalf("the final patch lacks calc.py's fix or has the counter line other than once:\n%s", patch)
	}
	if !slicesEqual(run.ChangedFiles, []string{"calc.py", "counter.txt"}) {
		t.Errorf("changed files %v", run.ChangedFiles)
	}
	var lost []belay.SandboxLostData
	var resumed []belay.RunResumedData
	for _, e := range events {
		switch e.Type {
		case belay.EventSandboxLost:
			var d belay.SandboxLostData
			_ = json.Unmarshal(e.Data, &d)
			lost = append(lost, d)
		case belay.EventRunResumed:
			var d belay.RunResumedData
			_ = json.Unmarshal(e.Data, &d)
			resumed = append(resumed, d)
		}
	}
	if len(lost) != 1 || lost[0].Attempt != 1 || !lost[0].Resumes || len(resumed) != 1 || resumed[0].Attempt != 2 ||
		resumed[0].Checkpoint == nil || resumed[0].Checkpoint.Pending != "shell" {
		t.Errorf("sandbox.lost %+v, run.resumed %+v", lost, resumed)
	}
	assertLogWhole(t, events)
	transcript, err := pl.c.GetArtifact(ctx, id, "transcript.jsonl")
	if err != nil || !strings.Contains(string(transcript), "resumed on a new sandbox") {
		t.Errorf("the transcript does not tell of the resume (%v)", err)
	}
}

// TestSandboxLostOnEveryAttempt: a sandbox killed on every attempt is
// replaced twice (the default); the run then fails with a reason naming
// its attempts, its capability revoked, within its model budget.
func TestSandboxLostOnEveryAttempt(t *testing.T) {
	t.Parallel()
	sleeps := step("shell", map[string]string{"command": "sleep 300"})
	script := scriptedmodel.Script{Name: "killed each time", Steps: []scriptedmodel.Step{sleeps, sleeps, sleeps, sleeps, finish("never reached")}}
	p := newProvider(t, script, 0)
	pl := startResume(t, p, embedded.LauncherOCI)
	ctx := context.Background()
	req := resumeRequest(t, 6)
	req.Approval = belay.ApprovalConfig{Policy: belay.PolicyAllowList, Allow: []string{"shell"}}
	created, err := pl.c.CreateRun(ctx, req, "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	for attempt := 1; attempt <= belay.DefaultMaxResumes+1; attempt++ {
		// Each sandbox is killed while its command sleeps.
		waitView(t, pl, id, fmt.Sprintf("a checkpoint of attempt %d", attempt), func(r wire.RunView) bool {
			return r.Checkpoint != nil && r.Checkpoint.Attempt == attempt && r.Checkpoint.Pending == "shell"
		})
		killSandbox(t, pl, id)
	}
	events, run := pl.finished(t, id)
	want := "sandbox killed on attempt 3; gave up after 3 attempts (2 resumes, the limit)"
	if run.Status != belay.StatusFailed || run.Reason != want {
		t.Fatalf("run ended %s (%q); want failed (%q); events: %s", run.Status, run.Reason, want, eventTypes(events))
	}
	if reason := terminalEvent(t, events, belay.StatusFailed); reason != want {
		t.Errorf("run.failed says %q", reason)
	}
	if run.Attempt != 3 || len(run.Attempts) != 3 {
		t.Errorf("attempts %d %+v; want 3", run.Attempt, run.Attempts)
	}
	if n := p.Calls(); n > req.MaxRequests() {
		t.Errorf("the provider got %d calls over the attempts; the budget is %d", n, req.MaxRequests())
	}
	assertLogWhole(t, events)
	if err := pl.m.Close(); err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(pl.cfg.DataDir, "belay.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := store.GetCapability(ctx, id)
	if err != nil || c.State != belay.CapabilityRevoked {
		t.Errorf("capability %+v (%v); want revoked", c, err)
	}
}

// TestResumedTwiceStaysInBudget: a run whose sandbox is killed twice in
// the middle of a model call (each call spent and lost) resumes twice and
// completes, and the provider saw no more than maxSteps + 2 calls in all:
// the capability spans the attempts.
func TestResumedTwiceStaysInBudget(t *testing.T) {
	t.Parallel()
	const maxSteps = 3
	script := scriptedmodel.Script{Name: "budget", Steps: []scriptedmodel.Step{
		step("read_file", map[string]string{"path": "calc.py"}),
		step("edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
		finish("Fixed add."),
	}}
	p := newProvider(t, script, 0)
	var (
		mu     sync.Mutex
		kill   func()
		killed = make(chan struct{}, 4)
	)
	// The step-1 call of attempt 1 and of attempt 2 (requests 2 and 3):
	// their sandbox dies before it gets the answer.
	p.hook = func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		if (n == 2 || n == 3) && kill != nil {
			kill()
			killed <- struct{}{}
		}
	}
	pl := startResume(t, p, embedded.LauncherOCI)
	ctx := context.Background()
	req := resumeRequest(t, maxSteps)
	created, err := pl.c.CreateRun(ctx, req, "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	mu.Lock()
	kill = func() { killSandbox(t, pl, id) }
	mu.Unlock()

	events, run := pl.finished(t, id)
	if run.Status != belay.StatusCompleted || run.Attempt != 3 {
		t.Fatalf("run ended %s (%q) at attempt %d; want completed at 3; events: %s", run.Status, run.Reason, run.Attempt, eventTypes(events))
	}
	if len(killed) != 2 {
		t.Fatalf("%d sandboxes killed, want 2", len(killed))
	}
	if n := p.Calls(); n > maxSteps+2 {
		t.Fatalf("the provider got %d calls; a run resumed twice may make at most maxSteps + 2 = %d", n, maxSteps+2)
	}
	if run.Usage.ModelRequests > maxSteps+2 {
		t.Errorf("usage %+v", run.Usage)
	}
	assertLogWhole(t, events)
}

// TestCancelDuringAResume cancels a run the moment it resumes on a new
// sandbox: it ends cancelled, and the provider gets no call after the
// cancel.
func TestCancelDuringAResume(t *testing.T) {
	t.Parallel()
	script := scriptedmodel.Script{Name: "cancel on resume", Steps: []scriptedmodel.Step{
		step("read_file", map[string]string{"path": "calc.py"}),
		step("read_file", map[string]string{"path": "test_calc.py"}),
		finish("never reached"),
	}}
	p := newProvider(t, script, 0)
	pl := startResume(t, p, embedded.LauncherOCI)
	ctx := context.Background()
	created, err := pl.c.CreateRun(ctx, resumeRequest(t, 6), "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	waitView(t, pl, id, "a checkpoint", func(r wire.RunView) bool { return r.Checkpoint != nil && r.Checkpoint.Pending == "" })
	killSandbox(t, pl, id)
	awaitEvent(t, pl.c, id, func(e belay.Event) bool { return e.Type == belay.EventRunResumed })
	if _, err := pl.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	calls := p.Calls()
	events, run := pl.finished(t, id)
	if run.Status != belay.StatusCancelled {
		t.Fatalf("run ended %s (%q); want cancelled; events: %s", run.Status, run.Reason, eventTypes(events))
	}
	if n := p.Calls(); n != calls {
		t.Fatalf("the provider got %d calls after the cancel", n-calls)
	}
	assertLogWhole(t, events)
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResumeAfterAnOOMKill: the kernel's OOM killer ends the sandbox at its
// memory limit (the OCI launcher's cgroup, as Fargate stops a task that
// goes past its memory): a command allocates past the limit while the
// entry is the process the killer picks. The test arranges that from the
// host, as root, by raising the entry's OOM score to the most once the
// command's shell has started (so the allocation the shell starts does not
// inherit it), and the kill takes the whole sandbox rather than the
// command alone. The run resumes, the command comes back interrupted, and the run
// completes; the lost attempt says "sandbox out of memory".
func TestResumeAfterAnOOMKill(t *testing.T) {
	t.Parallel()
	alloc := fmt.Sprintf("sleep 6 && python3 -c 'b = bytearray(%d << 20); print(len(b))'", hardening.Sandbox.MemoryMiB+512)
	script := scriptedmodel.Script{Name: "out of memory", Steps: []scriptedmodel.Step{
		step("edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
		step("shell", map[string]string{"command": alloc}),
		finish("Fixed add; the command ran out of memory."),
	}}
	p := newProvider(t, script, 0)
	pl := startResume(t, p, embedded.LauncherOCI)
	ctx := context.Background()
	req := resumeRequest(t, 4)
	req.Approval = belay.ApprovalConfig{Policy: belay.PolicyAllowList, Allow: []string{"shell"}}
	created, err := pl.c.CreateRun(ctx, req, "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	waitView(t, pl, id, "the command running", func(r wire.RunView) bool { return r.Checkpoint != nil && r.Checkpoint.Pending == "shell" })
	entry := sandboxEntry(t, pl, id)
	setScore := func(pid int, score string) {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(score), 0o644); err != nil {
			t.Fatalf("set the OOM score of %d: %v", pid, err)
		}
	}
	entryNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", entry.pid))
	shells := 0
	for deadline := time.Now().Add(4 * time.Second); shells == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		procs, _ := os.ReadDir("/proc")
		for _, d := range procs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil || pid == entry.pid {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
			if l, _ := os.Readlink(filepath.Join("/proc", d.Name(), "ns", "pid")); l == entryNS && strings.Contains(string(cmdline), "bytearray") {
				shells++
			}
		}
	}
	if shells == 0 {
		t.Fatal("the command's shell never ran in the sandbox")
	}
	// Raising a score needs no privilege beyond writing the file.
	setScore(entry.pid, "1000")

	events, run := pl.finished(t, id)
	if run.Status != belay.StatusCompleted || run.Attempt != 2 || len(run.Attempts) != 2 || run.Attempts[0].Lost != orchestrator.ReasonOutOfMemory {
		t.Fatalf("run ended %s (%q) at attempt %d, attempts %+v; want completed on attempt 2, the first lost to the OOM killer; events: %s",
			run.Status, run.Reason, run.Attempt, run.Attempts, eventTypes(events))
	}
	reqs := requestsAt(p, 2)
	if len(reqs) != 1 {
		t.Fatalf("%d model requests after the command; want 1", len(reqs))
	}
	last := reqs[0].Messages[len(reqs[0].Messages)-1]
	var interrupted agent.Interrupted
	if json.Unmarshal([]byte(last.Content), &interrupted) != nil || !interrupted.Interrupted || !strings.Contains(interrupted.Reason, orchestrator.ReasonOutOfMemory) {
		t.Fatalf("the model's next request answers the command with %+v; want interrupted, out of memory", last)
	}
	assertLogWhole(t, events)
}
