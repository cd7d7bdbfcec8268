package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// definition returns the synthesized state machine's definition with its
// substitutions left in, parsed.
func definition(tb testing.TB, st *synthStack) map[string]any {
	tb.Helper()
	for _, r := range st.resources("AWS::StepFunctions::StateMachine") {
		var def map[string]any
		if err := json.Unmarshal([]byte(props(r)["DefinitionString"].(string)), &def); err != nil {
			tb.Fatal(err)
		}
		return def
	}
	tb.Fatal("no state machine in the template")
	return nil
}

func TestStateMachineDefinition(t *testing.T) {
	st := synthesized(t).token
	def := definition(t, st)
	states := def["States"].(map[string]any)
	// Every Task's errors end in Fail, except RunSandbox's, which Resume
	// and Validate decide; Fail itself has no Catch (if it fails, the
	// execution fails and cleanup runs).
	for name, s := range states {
		s := s.(map[string]any)
		if s["Type"] != "Task" {
			continue
		}
		want := stateFail
		switch name {
		case stateRun:
			want = stateResume
		case stateFail:
			if s["Catch"] != nil {
				t.Errorf("Fail has a Catch: %v", s["Catch"])
			}
			continue
		}
		catches := listOf(s["Catch"])
		if len(catches) != 1 || catches[0].(map[string]any)["Next"] != want ||
			!slices.Equal(stringsOf(catches[0].(map[string]any)["ErrorEquals"]), []string{"States.ALL"}) {
			t.Errorf("%s: Catch %v, want States.ALL → %s", name, s["Catch"], want)
		}
		if s["TimeoutSeconds"] == nil && s["TimeoutSecondsPath"] == nil {
			t.Errorf("%s has no timeout", name)
		}
	}
	run := states[stateRun].(map[string]any)
	if run["Resource"] != runTaskSync || run["TimeoutSecondsPath"] != "$.activate.timeoutSeconds" {
		t.Errorf("RunSandbox: %v with timeout %v", run["Resource"], run["TimeoutSecondsPath"])
	}
	params := run["Parameters"].(map[string]any)
	if params["EnableExecuteCommand"] != false || params["LaunchType"] != "FARGATE" {
		t.Errorf("RunSandbox parameters: %v", params)
	}
	// The resume loop: RunSandbox → Resume → (resume) NextAttempt, which
	// puts the new claim and timeout where RunSandbox reads them, →
	// PrepareSandbox; otherwise Validate, told what Resume decided.
	if run["Next"] != stateResume {
		t.Errorf("RunSandbox goes on to %v, want %s", run["Next"], stateResume)
	}
	resume := states[stateResume].(map[string]any)
	rp := resume["Parameters"].(map[string]any)
	if rp["step"] != "resume" || rp["attempt.$"] != "$.activate.attempt" || rp["task.$"] != "$.sandbox.task" ||
		rp["error.$"] != "$.sandbox.error" || resume["ResultPath"] != "$.resume" || resume["Next"] != stateChoose {
		t.Errorf("Resume: %v", resume)
	}
	choose := states[stateChoose].(map[string]any)
	choices := listOf(choose["Choices"])
	if choose["Type"] != "Choice" || choose["Default"] != stateValidate || len(choices) != 1 ||
		choices[0].(map[string]any)["Variable"] != "$.resume.resume" || choices[0].(map[string]any)["BooleanEquals"] != true ||
		choices[0].(map[string]any)["Next"] != stateNext {
		t.Errorf("ResumeOrValidate: %v", choose)
	}
	next := states[stateNext].(map[string]any)
	np := next["Parameters"].(map[string]any)
	if next["Type"] != "Pass" || next["ResultPath"] != "$.activate" || next["Next"] != statePrepare ||
		np["claim.$"] != "$.resume.claim" || np["timeoutSeconds.$"] != "$.resume.timeoutSeconds" || np["attempt.$"] != "$.resume.attempt" {
		t.Errorf("NextAttempt: %v", next)
	}
	if vp := states[stateValidate].(map[string]any)["Parameters"].(map[string]any); vp["resume.$"] != "$.resume" {
		t.Errorf("Validate is not told what Resume decided: %v", vp)
	}
	check(t, "state machine", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::StepFunctions::StateMachine"), like(&map[string]any{
			"StateMachineType": "STANDARD",
			// States are logged, their data (which holds the claim) is not.
			"LoggingConfiguration": like(&map[string]any{"Level": "ALL", "IncludeExecutionData": false}),
			"TracingConfiguration": map[string]any{"Enabled": true},
		}))
	})
	// The status-change rule runs cleanup, through a dead-letter queue.
	machine := st.logicalID(t, "Runs/Resource")
	cleanup := st.logicalID(t, "Cleanup/Resource")
	check(t, "execution status rule", func() {
		st.tpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), like(&map[string]any{
			"EventPattern": map[string]any{
				"source":      []any{"aws.states"},
				"detail-type": []any{"Step Functions Execution Status Change"},
				"detail":      map[string]any{"status": []any{"ABORTED", "TIMED_OUT", "FAILED"}, "stateMachineArn": []any{ref(machine)}},
			},
			"Targets": []any{like(&map[string]any{
				"Arn":              getAtt(cleanup, "Arn"),
				"DeadLetterConfig": like(&map[string]any{"Arn": assertions.Match_AnyValue()}),
				"RetryPolicy":      assertions.Match_AnyValue(),
			})},
		}))
	})
}

// TestStateMachineValidates runs asl-validator on the definition, its
// substitutions resolved to ARNs as CloudFormation would.
func TestStateMachineValidates(t *testing.T) {
	st := synthesized(t).token
	l := &localAWS{t: t, st: st, table: "belay", bucket: "belay-artifacts"}
	l.resolveValues()
	l.writeDefinition()
	cmd := exec.Command(node22(t), "../node_modules/asl-validator/dist/bin/asl-validator.js", "--json-path", l.def)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("asl-validator refused the definition: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "✓") && !strings.Contains(strings.ToLower(string(out)), "valid") {
		t.Fatalf("asl-validator said: %s", out)
	}
	// And it refuses a broken one: the check can fail.
	b, _ := os.ReadFile(l.def)
	broken := filepath.Join(t.TempDir(), "broken.json")
	_ = os.WriteFile(broken, []byte(strings.Replace(string(b), `"Next": "`+stateResume+`"`, `"Next": "Nowhere"`, 1)), 0o644)
	if out, err := exec.Command(node22(t), "../node_modules/asl-validator/dist/bin/asl-validator.js", "--json-path", broken).CombinedOutput(); err == nil {
		t.Errorf("asl-validator accepted a definition with a missing state: %s", out)
	}
}

// calcRun is the examples/calc run: a calculator whose add subtracts, the
// pytest check, calc.py the one path the agent may change.
func calcRun(tb testing.TB, extra ...belay.File) belay.RunRequest {
	tb.Helper()
	var files []belay.File
	for _, p := range []string{"calc.py", "tests/test_calc.py"} {
		b, err := os.ReadFile(filepath.Join("..", "examples", "calc", p))
		if err != nil {
			tb.Fatal(err)
		}
		files = append(files, belay.File{Path: p, Content: string(b)})
	}
	return belay.RunRequest{
		Instruction:  "Fix the failing test in calc.py",
		Files:        append(files, extra...),
		AllowedPaths: []string{"calc.py"},
		Checks:       [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:     12, WallTimeSeconds: 120,
		Approval: belay.ApprovalConfig{Policy: "deny_all"},
	}
}

func fixCalcScript(tb testing.TB) string {
	b, err := os.ReadFile("../examples/sessions/fix-calc.json")
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// client is the CLI's client of the local public API.
func (l *localAWS) client(tb testing.TB) *httpapi.Client {
	c, err := httpapi.NewClient(l.public.URL(), l.controlToken)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// capability reads the run's capability from the table.
func (l *localAWS) capability(tb testing.TB, runID string) belay.Capability {
	c, err := l.store.GetCapability(tb.Context(), runID)
	if err != nil {
		tb.Fatalf("capability of %s: %v", runID, err)
	}
	return c
}

func TestLocalExecution(t *testing.T) {
	l := startLocalAWS(t)
	ctx := t.Context()
	c := l.client(t)
	happy := []string{stateActivate, statePrepare, stateRun, stateResume, stateChoose, stateValidate, stateFinalize}

	t.Run("completes with its patch", func(t *testing.T) {
		model := l.upstream.session(t, fixCalcScript(t), nil)
		created, err := c.CreateRun(ctx, calcRun(t), "")
		if err != nil {
			t.Fatal(err)
		}
		e := l.wait(t, created.RunID, 4*time.Minute)
		if e.result.Status != "SUCCEEDED" || !slices.Equal(e.states(), happy) {
			t.Fatalf("execution %s through %v (%s %s); driver:\n%s", e.result.Status, e.states(), e.result.Error, e.result.Cause, e.stderr.String())
		}
		run, err := c.GetRun(ctx, created.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != belay.StatusCompleted {
			t.Fatalf("run %s: %s (%s)", run.RunID, run.Status, run.Reason)
		}
		patch, err := c.GetArtifact(ctx, created.RunID, "patch.diff")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(patch), "+    return a + b") {
			t.Errorf("patch.diff does not fix add:\n%s", patch)
		}
		if capab := l.capability(t, created.RunID); capab.State != belay.CapabilityRevoked {
			t.Errorf("capability after completion: %s", capab.State)
		}
		if model.Calls() == 0 {
			t.Error("the scripted model was never called")
		}
		// The provider key reached the provider, through modelproxy only.
		l.upstream.mu.Lock()
		auths := slices.Clone(l.upstream.auths)
		l.upstream.mu.Unlock()
		for _, a := range auths {
			if a != "Bearer "+l.providerKey {
				t.Errorf("the upstream got Authorization %q", a)
			}
		}
	})

	t.Run("a sandbox killed once resumes on a new task and completes", func(t *testing.T) {
		var runID string
		var once sync.Once
		var active belay.CapabilityState
		model := l.upstream.session(t, fixCalcScript(t), func(r scriptedmodel.Request) {
			// The second model call: the run is under way; the task dies
			// as the OOM killer would kill it. Once: the next attempt's
			// second call goes through.
			if r.Step == 1 {
				once.Do(func() {
					active = l.capability(t, runID).State
					l.runner.kill(runID)
				})
			}
		})
		req := calcRun(t)
		created, err := c.CreateRun(ctx, req, "")
		if err != nil {
			t.Fatal(err)
		}
		runID = created.RunID
		e := l.wait(t, runID, 4*time.Minute)
		resumed := []string{stateActivate, statePrepare, stateRun, stateResume, stateChoose, stateNext,
			statePrepare, stateRun, stateResume, stateChoose, stateValidate, stateFinalize}
		if e.result.Status != "SUCCEEDED" || !slices.Equal(e.states(), resumed) {
			t.Fatalf("execution %s through %v (%s %s), want %v", e.result.Status, e.states(), e.result.Error, e.result.Cause, resumed)
		}
		in := e.stateInput(stateResume)
		sb, _ := json.Marshal(in["sandbox"])
		if !strings.Contains(string(sb), `"Error":"States.TaskFailed"`) || !strings.Contains(string(sb), `\"ExitCode\":137`) {
			t.Errorf("Resume got %s, want the TaskFailed error of exit code 137", sb)
		}
		run, err := c.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != belay.StatusCompleted || run.Attempt != 2 || len(run.Attempts) != 2 || run.Attempts[0].Lost != "sandbox exited with code 137" {
			t.Fatalf("run %s: %s (%s) at attempt %d, attempts %+v; want completed on attempt 2, the first lost",
				runID, run.Status, run.Reason, run.Attempt, run.Attempts)
		}
		patch, err := c.GetArtifact(ctx, runID, "patch.diff")
		if err != nil || !strings.Contains(string(patch), "+    return a + b") {
			t.Errorf("patch.diff (%v):\n%s", err, patch)
		}
		if active != belay.CapabilityActive {
			t.Errorf("capability while the sandbox ran: %q, want active", active)
		}
		capab := l.capability(t, runID)
		if capab.State != belay.CapabilityRevoked || capab.UsedRequests > req.MaxRequests() {
			t.Errorf("capability after the run: %+v; want revoked, at most %d requests over both attempts", capab, req.MaxRequests())
		}
		if n := model.Calls(); n > req.MaxRequests() {
			t.Errorf("the provider got %d calls; the run's budget is %d", n, req.MaxRequests())
		}
		events, err := l.store.ListEvents(ctx, runID, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var lost, resumedEvents int
		var from *belay.CheckpointRef
		readyFrom := -1
		for i, ev := range events.Events {
			if ev.Seq != int64(i+1) {
				t.Fatalf("event %d has seq %d", i, ev.Seq)
			}
			switch ev.Type {
			case belay.EventSandboxLost:
				lost++
			case belay.EventRunResumed:
				resumedEvents++
				var d belay.RunResumedData
				_ = json.Unmarshal(ev.Data, &d)
				from = d.Checkpoint
			case belay.EventSandboxReady:
				var d struct {
					Attempt int   `json:"attempt"`
					From    int64 `json:"resumedFromCheckpoint"`
				}
				if json.Unmarshal(ev.Data, &d) == nil && d.Attempt == 2 {
					readyFrom = int(d.From)
				}
			}
		}
		if lost != 1 || resumedEvents != 1 {
			t.Errorf("%d sandbox.lost and %d run.resumed events, want one each", lost, resumedEvents)
		}
		// The first task's checkpoints went through the private API to
		// sandboxapi, and the second task continued from the last of them.
		if from == nil || from.Attempt != 1 || readyFrom != int(from.Seq) {
			t.Errorf("run.resumed from checkpoint %+v, the second task resumed from %d; want the first task's last checkpoint", from, readyFrom)
		}
	})

	t.Run("a result that fails validation ends failed", func(t *testing.T) {
		// The entry commits only allowed changes, so an honest sandbox
		// cannot produce this: a compromised one uploads a bundle whose
		// patch also changes notes.txt, outside allowedPaths. The runner
		// forges that upload in S3 after the task exits; the control plane
		// must refuse it.
		l.upstream.session(t, fixCalcScript(t), nil)
		l.runner.afterExit = func(runID string) { l.forgeOutputs(t, runID) }
		defer func() { l.runner.afterExit = nil }()
		req := calcRun(t, belay.File{Path: "notes.txt", Content: "nothing to see\n"})
		created, err := c.CreateRun(ctx, req, "")
		if err != nil {
			t.Fatal(err)
		}
		e := l.wait(t, created.RunID, 4*time.Minute)
		if e.result.Status != "SUCCEEDED" || !slices.Equal(e.states(), happy) {
			t.Fatalf("execution %s through %v (%s %s)", e.result.Status, e.states(), e.result.Error, e.result.Cause)
		}
		run, err := c.GetRun(ctx, created.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != belay.StatusFailed || !strings.Contains(run.Reason, "notes.txt") {
			t.Errorf("run %s: %s (%s), want failed for notes.txt, outside allowedPaths", created.RunID, run.Status, run.Reason)
		}
		if slices.Contains(run.ChangedFiles, "notes.txt") {
			t.Errorf("the run reports the refused change: changedFiles %v", run.ChangedFiles)
		}
		if capab := l.capability(t, created.RunID); capab.State != belay.CapabilityRevoked {
			t.Errorf("capability: %s", capab.State)
		}
		t.Logf("reason: %s", run.Reason)
	})

	t.Run("cancelling ends cancelled", func(t *testing.T) {
		release := make(chan struct{})
		blocked := make(chan struct{}, 1)
		defer close(release)
		l.upstream.session(t, fixCalcScript(t), func(r scriptedmodel.Request) {
			if r.Step == 1 {
				blocked <- struct{}{}
				select {
				case <-release:
				case <-time.After(2 * time.Minute):
				}
			}
		})
		created, err := c.CreateRun(ctx, calcRun(t), "")
		if err != nil {
			t.Fatal(err)
		}
		runID := created.RunID
		select {
		case <-blocked:
		case <-time.After(3 * time.Minute):
			t.Fatal("the run never reached its second model call")
		}
		if _, err := c.Cancel(ctx, runID); err != nil {
			t.Fatal(err)
		}
		e := l.wait(t, runID, time.Minute)
		if e.result.Status != "ABORTED" {
			t.Fatalf("execution %s after StopExecution, want ABORTED", e.result.Status)
		}
		// EventBridge: the status change, matched by the stack's rule,
		// goes to cleanup.
		event := l.statusChange(t, runID, "ABORTED")
		var res any
		l.fns[fnCleanup].Result(t, event, &res)
		run, err := c.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != belay.StatusCancelled {
			t.Errorf("run %s: %s (%s), want cancelled", runID, run.Status, run.Reason)
		}
		if capab := l.capability(t, runID); capab.State != belay.CapabilityRevoked {
			t.Errorf("capability after cancel: %s", capab.State)
		}
		deadline := time.Now().Add(30 * time.Second)
		for l.runner.running(runID) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if l.runner.running(runID) {
			t.Error("the sandbox task still runs after the cancel")
		}
		// Cleanup is idempotent: a second delivery changes nothing.
		l.fns[fnCleanup].Result(t, event, &res)
		if again, _ := c.GetRun(ctx, runID); again.Status != belay.StatusCancelled {
			t.Errorf("after a second cleanup: %s", again.Status)
		}
	})
}

// statusChange is the EventBridge event Step Functions emits when an
// execution ends with status, checked against the stack's rule pattern.
func (l *localAWS) statusChange(tb testing.TB, runID, status string) []byte {
	tb.Helper()
	raw, err := os.ReadFile("../functions/cleanup/testdata/execution-aborted.json")
	if err != nil {
		tb.Fatal(err)
	}
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		tb.Fatal(err)
	}
	d := ev["detail"].(map[string]any)
	d["executionArn"], d["stateMachineArn"], d["name"], d["status"] = executionARN(runID), localMachine, runID, status
	d["input"] = fmt.Sprintf(`{"runId":%q}`, runID)
	ev["resources"] = []any{executionARN(runID)}
	ev["region"], ev["account"] = localRegion, localAccount
	// The stack's rule must match it.
	for _, r := range l.st.resources("AWS::Events::Rule") {
		p := props(r)["EventPattern"].(map[string]any)
		if !slices.Contains(stringsOf(p["source"]), "aws.states") {
			continue // the repository-event rules (triggers.go)
		}
		dp := p["detail"].(map[string]any)
		ok := slices.Contains(stringsOf(p["source"]), ev["source"].(string)) &&
			slices.Contains(stringsOf(p["detail-type"]), ev["detail-type"].(string)) &&
			slices.Contains(stringsOf(dp["status"]), status)
		for _, m := range listOf(dp["stateMachineArn"]) {
			ok = ok && l.resolve(m) == localMachine
		}
		if !ok {
			tb.Fatalf("the stack's rule %v does not match the %s event", p, status)
		}
	}
	out, _ := json.Marshal(ev)
	return out
}

// forgeOutputs replaces the run's uploaded outputs (attempt 1) with a
// bundle whose patch also changes notes.txt.
func (l *localAWS) forgeOutputs(tb testing.TB, runID string) {
	ctx := context.Background()
	name := func(n string) string { return belay.StagedOutputName(1, n) }
	raw, err := l.artifacts.GetArtifact(ctx, runID, name("result.json"))
	if err != nil {
		tb.Errorf("forge: read the uploaded result.json: %v", err)
		return
	}
	var bundle belay.ResultBundle
	if err := json.Unmarshal(raw, &bundle); err != nil {
		tb.Errorf("forge: %v", err)
		return
	}
	patch, err := l.artifacts.GetArtifact(ctx, runID, name("patch.diff"))
	if err != nil {
		tb.Errorf("forge: read the uploaded patch.diff: %v", err)
		return
	}
	patch = append(patch, []byte("diff --git a/notes.txt b/notes.txt\nindex 1111111..2222222 100644\n--- a/notes.txt\n+++ b/notes.txt\n"+
		"@@ -1 +1 @@\n-nothing to see\n+exfiltrated\n")...)
	bundle.ChangedFiles = append(bundle.ChangedFiles, "notes.txt")
	forged, _ := json.Marshal(bundle)
	for n, content := range map[string][]byte{"patch.diff": patch, "result.json": forged} {
		if err := l.artifacts.PutArtifact(ctx, runID, name(n), content); err != nil {
			tb.Errorf("forge %s: %v", n, err)
		}
	}
}
