package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/token"
)

func init() {
	helpers["entry"] = func() int {
		ws := os.Getenv("BELAY_TEST_WORKSPACE")
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		return sandbox.Main(ctx, ws)
	}
}

// sandboxRun is one run of the entry as a subprocess, as the local launcher
// starts it: a workspace with spec.json and the token files, the control
// plane's internal routes on ws/api.sock, and a non-root user.
type sandboxRun struct {
	cp     *controlPlane
	ws     string
	runID  string
	tokens token.Set
	req    belay.RunRequest
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
}

// prepareSandbox lays out the workspace and the control plane and returns
// the entry's command, not yet started.
func prepareSandbox(t *testing.T, script scriptedmodel.Script, req map[string]any, opts ...scriptedmodel.Option) *sandboxRun {
	t.Helper()
	ws := worldReadableDir(t)
	cp := newControlPlane(t, ws, script, opts...)
	runID, set := cp.startRun(t, req)
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	spec := belay.SpecForRun(run)
	spec.APIBaseURL = "http://belay"
	spec.APISocket = filepath.Join(ws, "api.sock")
	spec.Attempt = run.Attempt
	// The listener is this test process; without root the entry runs as
	// the same user (the weak tier).
	me := os.Geteuid()
	spec.APIPeerUID, spec.APIPeerSharesUID = &me, !isRoot()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), set.Model) {
		t.Fatal("spec.json would hold a token")
	}
	mustDo(t, os.WriteFile(filepath.Join(ws, "spec.json"), b, 0o644))
	tokens := filepath.Join(ws, "tokens")
	mustDo(t, os.Mkdir(tokens, 0o700))
	for name, tok := range map[string]string{"model.token": set.Model, "events.token": set.Events, "approvals.token": set.Approvals} {
		mustDo(t, os.WriteFile(filepath.Join(tokens, name), []byte(tok+"\n"), 0o600))
	}
	if isRoot() {
		for _, p := range []string{ws, tokens, spec.APISocket, filepath.Join(tokens, "model.token"), filepath.Join(tokens, "events.token"), filepath.Join(tokens, "approvals.token")} {
			mustDo(t, os.Lchown(p, testUID, testUID))
		}
	}
	sr := &sandboxRun{cp: cp, ws: ws, runID: runID, tokens: set, req: run.Request}
	sr.cmd = helperCommand(t, helperBinary(t), "entry", "BELAY_TEST_WORKSPACE="+ws,
		"BELAY_TEST_SECRET="+envCanary)
	sr.cmd.Stdout, sr.cmd.Stderr = &sr.stdout, &sr.stderr
	t.Cleanup(func() {
		if sr.cmd.Process != nil && sr.cmd.ProcessState == nil {
			_ = sr.cmd.Process.Kill()
			_ = sr.cmd.Wait()
		}
	})
	return sr
}

func startSandbox(t *testing.T, script scriptedmodel.Script, req map[string]any, opts ...scriptedmodel.Option) *sandboxRun {
	t.Helper()
	sr := prepareSandbox(t, script, req, opts...)
	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return sr
}

// wait waits for the entry and returns its exit code.
func (sr *sandboxRun) wait(t *testing.T) int {
	t.Helper()
	err := sr.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0
}

// outputs returns what the entry uploaded, as the orchestrator reads it
// from the artifact store; each of the three must be there.
func (sr *sandboxRun) outputs(t *testing.T) map[string][]byte {
	t.Helper()
	files := sr.cp.staged(t, sr.runID)
	for _, name := range belay.ArtifactNames {
		if _, ok := files[name]; !ok {
			t.Fatalf("the entry uploaded no %s (stderr: %s)", name, sr.stderr.String())
		}
	}
	return files
}

// assertNoSecrets checks that no token, key or test secret appears in what
// the entry printed or left in the workspace.
func (sr *sandboxRun) assertNoSecrets(t *testing.T) {
	t.Helper()
	secrets := map[string]string{
		"model token": sr.tokens.Model, "events token": sr.tokens.Events, "approvals token": sr.tokens.Approvals,
		"provider key": providerKeyCanary, "environment secret": envCanary,
	}
	places := map[string][]byte{"stdout": sr.stdout.Bytes(), "stderr": sr.stderr.Bytes(),
		"the control plane's log": []byte(sr.cp.logs.String())}
	_ = filepath.Walk(sr.ws, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && p == filepath.Join(sr.ws, "tokens") {
			return filepath.SkipDir // where the launcher put them; see the token tests
		}
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			places[p] = b
		}
		return nil
	})
	for _, e := range sr.cp.events(t, sr.runID) {
		places[fmt.Sprintf("event %d", e.Seq)] = e.Data
	}
	for where, b := range places {
		for what, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("the %s appears in %s", what, where)
			}
		}
	}
	if strings.Contains(sr.stderr.String(), "CANARY") {
		t.Error("stderr holds a canary")
	}
}

func fixScript() scriptedmodel.Script {
	return scriptedmodel.Script{Name: "fix-calc", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"calc.py"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: []byte(`{"path":"calc.py","old":"a - b","new":"a + b"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "write_file", Arguments: []byte(`{"path":"README.md","content":"pwned"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "run_check", Arguments: []byte(`{"argv":["python3","-c","import calc; assert calc.add(2, 3) == 5"]}`)}}},
		{Content: "Done.", ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: []byte(`{"summary":"Fixed add: it subtracted."}`)}}},
	}}
}

func TestEntryRunsTheAgentAndWritesAValidBundle(t *testing.T) {
	sr := startSandbox(t, fixScript(), runRequest(belay.PolicyDenyAll, 0))
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	files := sr.outputs(t)
	bundle, err := belay.ValidateResult(sr.runID, sr.req, files)
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v\n%s", err, files["result.json"])
	}
	if bundle.Status != belay.StatusCompleted || bundle.ExitCode != 0 || bundle.Reason != "" {
		t.Errorf("bundle status %s, exit %d, reason %q", bundle.Status, bundle.ExitCode, bundle.Reason)
	}
	if !slices.Equal(bundle.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changedFiles %q", bundle.ChangedFiles)
	}
	if bundle.Summary != "Fixed add: it subtracted." {
		t.Errorf("summary %q", bundle.Summary)
	}
	if bundle.Usage.ModelRequests != 5 {
		t.Errorf("usage %+v; want 5 model requests", bundle.Usage)
	}
	for _, c := range bundle.Checks {
		if c.ExitCode != 0 {
			t.Errorf("check %q exited %d: %s", c.Argv, c.ExitCode, c.OutputTail)
		}
	}
	// The token files are gone; the repository holds the fix.
	if entries, _ := os.ReadDir(filepath.Join(sr.ws, "tokens")); len(entries) != 0 {
		t.Errorf("token files left: %v", entries)
	}
	if b, _ := os.ReadFile(filepath.Join(sr.ws, "repo", "calc.py")); !strings.Contains(string(b), "a + b") {
		t.Errorf("calc.py = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(sr.ws, "repo", "README.md")); string(b) != testFiles[2].Content {
		t.Errorf("README.md was changed: %q", b)
	}
	// The control plane heard from the sandbox, and the provider got its
	// key, never a run token.
	types := map[string]int{}
	for _, e := range sr.cp.events(t, sr.runID) {
		types[e.Type]++
	}
	// The final checks are the control plane's to report, from the
	// bundle it validates: the sandbox sends only its run_check.
	if types[belay.EventSandboxReady] != 1 || types[belay.EventCheckFinished] != 1 || types[belay.EventToolCall] == 0 {
		t.Errorf("event types %v; want sandbox.ready once, check.finished once (the run_check, no final one), tool calls", types)
	}
	for _, r := range sr.cp.model.Requests() {
		if r.Authorization != "Bearer "+providerKeyCanary {
			t.Errorf("the provider saw Authorization %q", r.Authorization)
		}
	}
	sr.assertNoSecrets(t)
}

func TestEntryReportsFailingChecks(t *testing.T) {
	script := scriptedmodel.Script{Name: "give-up", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: []byte(`{"path":"calc.py","old":"a - b","new":"a - b "}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: []byte(`{"summary":"Touched calc.py."}`)}}},
	}}
	sr := startSandbox(t, script, runRequest(belay.PolicyDenyAll, 0))
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	bundle, err := belay.ValidateResult(sr.runID, sr.req, sr.outputs(t))
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v", err)
	}
	if bundle.Status != belay.StatusFailed || bundle.ExitCode != 1 || bundle.Reason != sandbox.ReasonChecksFailed {
		t.Errorf("bundle status %s, exit %d, reason %q; want failed, 1, %s", bundle.Status, bundle.ExitCode, bundle.Reason, sandbox.ReasonChecksFailed)
	}
	// git diff --check fails on the trailing space; the import check fails
	// because add still subtracts.
	for i, c := range bundle.Checks {
		if c.ExitCode == 0 || c.OutputTail == "" {
			t.Errorf("checks[%d] %q: exit %d, output %q; want a failure with its output", i, c.Argv, c.ExitCode, c.OutputTail)
		}
	}
	if !slices.Equal(bundle.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changedFiles %q", bundle.ChangedFiles)
	}
	sr.assertNoSecrets(t)
}

func TestEntryStopsOnSIGTERMAndStillWritesTheBundle(t *testing.T) {
	inFlight := make(chan struct{}, 8)
	script := scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: []byte(`{"path":"calc.py","old":"a - b","new":"a + b"}`)}}},
		{DelayMs: 600_000, Content: "never answered"},
	}}
	sr := startSandbox(t, script, runRequest(belay.PolicyDenyAll, 0), scriptedmodel.WithRequestHook(func(r scriptedmodel.Request) {
		if r.Step == 1 {
			inFlight <- struct{}{}
		}
	}))
	<-inFlight // the agent is waiting on the model, after one edit
	mustDo(t, sr.cmd.Process.Signal(syscall.SIGTERM))
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d after SIGTERM\nstderr:\n%s", code, sr.stderr.String())
	}
	bundle, err := belay.ValidateResult(sr.runID, sr.req, sr.outputs(t))
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v", err)
	}
	if bundle.Status != belay.StatusFailed || bundle.Reason != sandbox.ReasonTerminated {
		t.Errorf("bundle status %s, reason %q; want failed, %s", bundle.Status, bundle.Reason, sandbox.ReasonTerminated)
	}
	for i, c := range bundle.Checks {
		if c.ExitCode != -1 || !strings.Contains(c.OutputTail, "not run") {
			t.Errorf("checks[%d]: exit %d, output %q; want not run", i, c.ExitCode, c.OutputTail)
		}
	}
	// The edit made before the signal is in the patch.
	if !slices.Equal(bundle.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changedFiles %q", bundle.ChangedFiles)
	}
	sr.assertNoSecrets(t)
}

func TestEntryStopsWhenTheRunIsCancelled(t *testing.T) {
	var sr *sandboxRun
	cancelled := make(chan struct{})
	script := scriptedmodel.Script{Name: "long", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"calc.py"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"README.md"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"docs/guide.md"}`)}}},
	}}
	ready := make(chan struct{})
	sr = startSandbox(t, script, runRequest(belay.PolicyDenyAll, 0), scriptedmodel.WithRequestHook(func(r scriptedmodel.Request) {
		if r.Step != 1 {
			return
		}
		// While the second model call is in flight, the run is cancelled
		// as the control plane does it: terminal state, capability revoked.
		<-ready
		ctx := context.Background()
		if _, err := sr.cp.store.Transition(ctx, sr.runID, belay.Transition{To: belay.StatusCancelled, At: time.Now(),
			Events: []belay.EventInput{{Time: time.Now(), Type: belay.EventRunCancelled}}}); err != nil {
			t.Error(err)
		}
		if err := sr.cp.store.RevokeCapability(ctx, sr.runID); err != nil {
			t.Error(err)
		}
		close(cancelled)
	}))
	close(ready)
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	<-cancelled
	// The entry wound down and offered its bundle; the control plane,
	// which decided the outcome already, took none of it.
	if files := sr.cp.staged(t, sr.runID); len(files) != 0 {
		t.Errorf("a cancelled run took outputs: %d files", len(files))
	}
	if !strings.Contains(sr.stderr.String(), "the control plane takes no outputs: the run is over") ||
		!strings.Contains(sr.stderr.String(), `"reason":"`+sandbox.ReasonRunInactive+`"`) {
		t.Errorf("the entry does not say it stopped because the run is over:\n%s", sr.stderr.String())
	}
	if n := sr.cp.model.Calls(); n > 2 {
		t.Errorf("the model was called %d times; the cancelled run should stop after the call in flight", n)
	}
}

func TestEntryRefusesToStart(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, sr *sandboxRun)
		root  bool
		want  string
	}{
		{"token file readable by others", func(t *testing.T, sr *sandboxRun) {
			mustDo(t, os.Chmod(filepath.Join(sr.ws, "tokens", "events.token"), 0o644))
		}, false, "events.token: refused: mode 0644"},
		{"running as root", func(t *testing.T, sr *sandboxRun) {
			sr.cmd.SysProcAttr = nil
		}, true, "refusing to run as root"},
		{"spec without a deadline", func(t *testing.T, sr *sandboxRun) {
			sr.rewriteSpec(t, func(spec *belay.SandboxSpec) { spec.Deadline = time.Time{} })
		}, false, "deadline is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				requireRoot(t, "to start the entry as root")
			}
			sr := prepareSandbox(t, fixScript(), runRequest(belay.PolicyDenyAll, 0))
			tt.setup(t, sr)
			if err := sr.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if code := sr.wait(t); code == 0 {
				t.Fatal("the entry ran")
			}
			if !strings.Contains(sr.stderr.String(), tt.want) || !strings.HasPrefix(sr.stderr.String(), "belay-sandbox: ") {
				t.Errorf("stderr %q does not say %q", sr.stderr.String(), tt.want)
			}
			if _, ok := sr.cp.staged(t, sr.runID)["result.json"]; ok {
				t.Error("a result was written")
			}
			if sr.cp.model.Calls() != 0 {
				t.Error("the model was called")
			}
			sr.assertNoSecrets(t)
		})
	}
}

func TestEntryEndsTheAgentLoopAtTheWallTime(t *testing.T) {
	script := scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{
		{DelayMs: 600_000, Content: "never answered"},
	}}
	req := runRequest(belay.PolicyDenyAll, 0)
	// The final checks get a quarter of the wall time: 1.5 s of 6 leaves
	// pytest room on a loaded 2-core machine, where 0.5 s of 2 did not.
	req["wallTimeSeconds"] = 6
	sr := startSandbox(t, script, req)
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	files := sr.outputs(t)
	var bundle belay.ResultBundle
	if err := json.Unmarshal(files["result.json"], &bundle); err != nil {
		t.Fatal(err)
	}
	if bundle.Status != belay.StatusFailed || bundle.Reason != sandbox.ReasonWallTime {
		t.Errorf("bundle status %s, reason %q; want failed, %s", bundle.Status, bundle.Reason, sandbox.ReasonWallTime)
	}
	// The final checks still ran, in the time kept for them.
	if len(bundle.Checks) != len(sr.req.Checks) {
		t.Fatalf("%d check results, want %d", len(bundle.Checks), len(sr.req.Checks))
	}
	for i, c := range bundle.Checks {
		if c.ExitCode == -1 {
			t.Errorf("checks[%d] did not run: %s", i, c.OutputTail)
		}
	}
}

// rewriteSpec changes the spec.json the entry will read.
func (sr *sandboxRun) rewriteSpec(t *testing.T, edit func(*belay.SandboxSpec)) {
	t.Helper()
	path := filepath.Join(sr.ws, "spec.json")
	b, err := os.ReadFile(path)
	mustDo(t, err)
	var spec belay.SandboxSpec
	mustDo(t, json.Unmarshal(b, &spec))
	edit(&spec)
	b, err = json.Marshal(spec)
	mustDo(t, err)
	mustDo(t, os.WriteFile(path, b, 0o644))
}

// TestEntryKeepsToTheRunDeadline starts the entry for a run with 60 s of
// wall time of which only 6 s are left (a late launch): the entry keeps to
// the run's deadline, not to 60 s from its own start. The agent loop ends
// a quarter of the time left before it (wall_time_exceeded), the final
// checks still run in that quarter, the entry is done by the deadline, and
// its sandbox.ready event names the deadline it kept to.
func TestEntryKeepsToTheRunDeadline(t *testing.T) {
	script := scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{
		{DelayMs: 600_000, Content: "never answered"},
	}}
	req := runRequest(belay.PolicyDenyAll, 0)
	req["wallTimeSeconds"] = 60
	sr := prepareSandbox(t, script, req)
	deadline := time.Now().Add(6 * time.Second).UTC()
	sr.rewriteSpec(t, func(spec *belay.SandboxSpec) { spec.Deadline = deadline })
	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	// The final check ends by the deadline, writing the bundle takes a
	// moment more; 60 s from the start would be far later.
	if over := time.Since(deadline); over > 5*time.Second {
		t.Errorf("the entry ended %v after the run's deadline", over)
	}
	bundle, err := belay.ValidateResult(sr.runID, sr.req, sr.outputs(t))
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v", err)
	}
	if bundle.Status != belay.StatusFailed || bundle.Reason != sandbox.ReasonWallTime {
		t.Errorf("bundle status %s, reason %q; want failed, %s", bundle.Status, bundle.Reason, sandbox.ReasonWallTime)
	}
	for i, c := range bundle.Checks {
		if c.ExitCode == -1 {
			t.Errorf("checks[%d] did not run in the time kept for them: %s", i, c.OutputTail)
		}
	}
	page, err := sr.cp.store.ListEvents(context.Background(), sr.runID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ready struct {
		Deadline time.Time `json:"deadline"`
	}
	found := false
	for _, e := range page.Events {
		if e.Type == belay.EventSandboxReady {
			found = json.Unmarshal(e.Data, &ready) == nil
		}
	}
	if !found || !ready.Deadline.Equal(deadline) {
		t.Errorf("sandbox.ready names deadline %v (found %v); want the spec's, %v", ready.Deadline, found, deadline)
	}
}

func TestEntryReportsAnUnfinishedAgent(t *testing.T) {
	// The model fixes the code but never calls finish: the checks pass,
	// and the run still fails, for the agent's reason.
	script := scriptedmodel.Script{Name: "no-finish", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: []byte(`{"path":"calc.py","old":"a - b","new":"a + b"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "read_file", Arguments: []byte(`{"path":"calc.py"}`)}}},
	}}
	req := runRequest(belay.PolicyDenyAll, 0)
	req["maxSteps"] = 2
	sr := startSandbox(t, script, req)
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	var bundle belay.ResultBundle
	if err := json.Unmarshal(sr.outputs(t)["result.json"], &bundle); err != nil {
		t.Fatal(err)
	}
	if bundle.Status != belay.StatusFailed || bundle.ExitCode != 1 || bundle.Reason != "max_steps" {
		t.Errorf("bundle status %s, exit %d, reason %q; want failed, 1, max_steps", bundle.Status, bundle.ExitCode, bundle.Reason)
	}
	if len(bundle.Checks) != len(sr.req.Checks) {
		t.Fatalf("%d check results, want %d", len(bundle.Checks), len(sr.req.Checks))
	}
	for i, c := range bundle.Checks {
		if c.ExitCode != 0 {
			t.Errorf("checks[%d] exited %d: %s", i, c.ExitCode, c.OutputTail)
		}
	}
}
