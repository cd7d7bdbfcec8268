package functions_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/sfn"
)

// taskInput reads a task input of the steps function's testdata for run id.
func taskInput(tb testing.TB, name, id string, change ...func(*sfn.TaskRequest)) []byte {
	tb.Helper()
	raw, err := os.ReadFile("steps/testdata/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	var req sfn.TaskRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		tb.Fatal(err)
	}
	req.RunID = id
	for _, c := range change {
		c(&req)
	}
	out, _ := json.Marshal(req)
	return out
}

const goodPatch = "diff --git a/calc.py b/calc.py\nindex 1111111..2222222 100644\n--- a/calc.py\n+++ b/calc.py\n" +
	"@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"

// putOutputs stores what a completed sandbox of the attempt uploads.
func putOutputs(tb testing.TB, p peers, runID string, attempt int) {
	tb.Helper()
	bundle, _ := json.Marshal(belay.ResultBundle{
		Version: belay.ResultBundleVersion, RunID: runID, Status: belay.StatusCompleted, Summary: "Fixed add.",
		ChangedFiles: []string{"calc.py"},
		Checks:       []belay.CheckResult{{Argv: []string{"python3", "-m", "pytest", "-q"}, DurationMs: 420, OutputTail: "1 passed"}},
		Usage:        belay.BundleUsage{ModelRequests: 3},
		BaseCommit:   strings.Repeat("a", 40), HeadCommit: strings.Repeat("b", 40),
	})
	for name, content := range map[string][]byte{
		"result.json": bundle, "patch.diff": []byte(goodPatch),
		"transcript.jsonl": []byte(`{"type":"model.response","step":1}` + "\n"),
	} {
		if err := p.artifacts.PutArtifact(tb.Context(), runID, belay.StagedOutputName(attempt, name), content); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestSteps(t *testing.T) {
	p := startPeers(t)
	cluster := awstest.New(t, awstest.ECS)
	cluster.Handle("StopTask", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"task": map[string]any{"taskArn": body["task"], "desiredStatus": "STOPPED"}}
	})
	fn := rie.Start(t, "steps", p.env(map[string]string{"BELAY_CLUSTER_ARN": clusterARN, "BELAY_ECS_ENDPOINT": cluster.URL}))

	run := newRunID()
	seedRun(t, p.store, run)
	var act sfn.ActivateResult
	t.Run("activate", func(t *testing.T) {
		fn.Result(t, taskInput(t, "activate.json", run), &act)
		if act.RunID != run || act.Attempt != 1 || act.TimeoutSeconds < 120 || act.TimeoutSeconds > 180 {
			t.Fatalf("activate = %+v, want attempt 1 and the wall time (120 s) plus grace", act)
		}
		hash, ok := belay.HashClaimCode(act.Claim)
		if !ok {
			t.Fatal("activate returned no claim code")
		}
		stored, err := p.store.GetRun(t.Context(), run)
		if err != nil || stored.Status != belay.StatusRunning || stored.Attempt != 1 {
			t.Fatalf("run after activate: %s attempt %d, %v", stored.Status, stored.Attempt, err)
		}
		if c, err := p.store.GetCapability(t.Context(), run); err != nil || c.State != belay.CapabilityActive || c.MaxRequests != 7 {
			t.Fatalf("capability after activate: %+v, %v", c, err)
		}
		// The code is stored hashed and admits this run's attempt.
		if c, err := p.store.ConsumeClaim(t.Context(), hash, run, stored.StartedAt); err != nil || c.Attempt != 1 {
			t.Fatalf("ConsumeClaim(activate's code) = %+v, %v", c, err)
		}
		// A second activate of a run that has claimed is refused.
		if err := p.store.RecordSandboxRef(t.Context(), run, 1, "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/abc"); err != nil {
			t.Fatal(err)
		}
		_, body := fn.Invoke(t, taskInput(t, "activate.json", run))
		if _, ok := rie.HandlerError(body); !ok {
			t.Fatalf("second activate answered %s, want a handler error", body)
		}
	})
	recordInit(t, fn)

	var out sfn.Outcome
	t.Run("validate", func(t *testing.T) {
		putOutputs(t, p, run, 1)
		fn.Result(t, taskInput(t, "validate.json", run), &out)
		if out.Status != belay.StatusCompleted || len(out.Artifacts) != 3 || out.ExitCode == nil || *out.ExitCode != 0 {
			t.Fatalf("validate = %+v, want completed with three artifacts", out)
		}
		list, err := p.artifacts.ListArtifacts(t.Context(), run)
		if err != nil {
			t.Fatal(err)
		}
		public := 0
		for _, a := range list {
			for _, n := range belay.ArtifactNames {
				if a.Name == n {
					public++
				}
			}
		}
		if public != 3 {
			t.Fatalf("artifacts %v: want the three public names stored", list)
		}
	})

	t.Run("finalize", func(t *testing.T) {
		var res sfn.FinalizeResult
		fn.Result(t, taskInput(t, "finalize.json", run, func(r *sfn.TaskRequest) { r.Outcome = &out }), &res)
		stored, _ := p.store.GetRun(t.Context(), run)
		if res.Status != belay.StatusCompleted || stored.Status != belay.StatusCompleted || len(stored.Artifacts) != 3 {
			t.Fatalf("finalize = %s, run %s %v", res.Status, stored.Status, stored.Artifacts)
		}
		if c, _ := p.store.GetCapability(t.Context(), run); c.State != belay.CapabilityRevoked {
			t.Fatalf("capability after finalize is %s, want revoked", c.State)
		}
		// Finalizing again changes nothing.
		before := runEvents(t, p.store, run)
		fn.Result(t, taskInput(t, "fail.json", run), &res)
		if res.Status != belay.StatusCompleted || len(runEvents(t, p.store, run)) != len(before) {
			t.Fatalf("fail after finalize: %s with %d events (was %d)", res.Status, len(runEvents(t, p.store, run)), len(before))
		}
	})

	t.Run("timeout", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		fn.Result(t, taskInput(t, "activate.json", id), nil)
		const task = "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/slow"
		if err := p.store.RecordSandboxRef(t.Context(), id, 1, task); err != nil {
			t.Fatal(err)
		}
		var o sfn.Outcome
		fn.Result(t, taskInput(t, "validate-timeout.json", id), &o)
		if o.Status != belay.StatusFailed || o.Reason != sfn.ReasonTimeout {
			t.Fatalf("validate after States.Timeout = %+v, want failed timeout", o)
		}
		stops := cluster.Calls("StopTask")
		if len(stops) == 0 || stops[len(stops)-1]["task"] != task {
			t.Fatalf("StopTask calls %v, want the timed-out run's task stopped", stops)
		}
	})

	t.Run("fail stops the task", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		fn.Result(t, taskInput(t, "activate.json", id), nil)
		const task = "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/fff"
		if err := p.store.RecordSandboxRef(t.Context(), id, 1, task); err != nil {
			t.Fatal(err)
		}
		var res sfn.FinalizeResult
		fn.Result(t, taskInput(t, "fail.json", id), &res)
		stored, _ := p.store.GetRun(t.Context(), id)
		if res.Status != belay.StatusFailed || stored.Reason != "orchestration failed: Lambda.ServiceException" {
			t.Fatalf("fail: %s %q", stored.Status, stored.Reason)
		}
		stops := cluster.Calls("StopTask")
		if len(stops) == 0 || stops[len(stops)-1]["task"] != task || stops[len(stops)-1]["cluster"] != clusterARN {
			t.Fatalf("StopTask calls %v, want the run's task", stops)
		}
	})

	t.Run("unknown step", func(t *testing.T) {
		status, body := fn.Invoke(t, taskInput(t, "unknown-step.json", run))
		e, ok := rie.HandlerError(body)
		if status != 200 || !ok || !strings.Contains(e.Message, "unknown step") {
			t.Fatalf("unknown step: %d %s, want a handler error naming it", status, body)
		}
	})
}

func statusEvent(tb testing.TB, name, runID string) []byte {
	tb.Helper()
	raw, err := os.ReadFile("cleanup/testdata/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	var ev events.CloudWatchEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		tb.Fatal(err)
	}
	var detail map[string]any
	_ = json.Unmarshal(ev.Detail, &detail)
	detail["name"] = runID
	detail["executionArn"] = sfn.ExecutionARN(stateMachine, runID)
	ev.Detail, _ = json.Marshal(detail)
	out, _ := json.Marshal(ev)
	return out
}

func TestCleanup(t *testing.T) {
	p := startPeers(t)
	cluster := awstest.New(t, awstest.ECS)
	cluster.Handle("StopTask", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"task": map[string]any{"taskArn": body["task"], "desiredStatus": "STOPPED"}}
	})
	fn := rie.Start(t, "cleanup", p.env(map[string]string{
		"BELAY_STATE_MACHINE_ARN": stateMachine, "BELAY_CLUSTER_ARN": clusterARN, "BELAY_ECS_ENDPOINT": cluster.URL,
	}))
	const task = "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/c1"

	snapshot := func(id string) (belay.Run, []belay.Event) {
		run, err := p.store.GetRun(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		run.UpdatedAt = run.UpdatedAt.UTC()
		return run, runEvents(t, p.store, id)
	}

	t.Run("aborted twice", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		startRun(t, p.store, id)
		if err := p.store.RecordSandboxRef(t.Context(), id, 1, task); err != nil {
			t.Fatal(err)
		}
		if _, err := p.store.RequestCancel(t.Context(), id, mustNow()); err != nil {
			t.Fatal(err)
		}
		fn.Result(t, statusEvent(t, "execution-aborted.json", id), nil)
		once, onceEvents := snapshot(id)
		if once.Status != belay.StatusCancelled || onceEvents[len(onceEvents)-1].Type != belay.EventRunCancelled {
			t.Fatalf("after cleanup: %s, last event %s; want cancelled", once.Status, onceEvents[len(onceEvents)-1].Type)
		}
		if c, _ := p.store.GetCapability(t.Context(), id); c.State != belay.CapabilityRevoked {
			t.Fatalf("capability %s after cleanup, want revoked", c.State)
		}
		stops := cluster.Calls("StopTask")
		if len(stops) != 1 || stops[0]["task"] != task || stops[0]["cluster"] != clusterARN {
			t.Fatalf("StopTask calls %v, want the run's recorded task stopped", stops)
		}
		fn.Result(t, statusEvent(t, "execution-aborted.json", id), nil)
		twice, twiceEvents := snapshot(id)
		if !sameRun(once, twice) || len(twiceEvents) != len(onceEvents) {
			t.Fatalf("a second cleanup changed the run: %+v -> %+v, %d -> %d events", once, twice, len(onceEvents), len(twiceEvents))
		}
	})
	recordInit(t, fn)

	t.Run("after a normal finalize", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		startRun(t, p.store, id)
		now := mustNow()
		if _, err := p.store.Transition(t.Context(), id, belay.Transition{To: belay.StatusCompleted, At: now,
			Events: []belay.EventInput{{Time: now, Type: belay.EventRunCompleted, Data: json.RawMessage(`{}`)}}}); err != nil {
			t.Fatal(err)
		}
		before, beforeEvents := snapshot(id)
		for _, ev := range []string{"execution-failed.json", "execution-timed-out.json", "execution-aborted.json"} {
			fn.Result(t, statusEvent(t, ev, id), nil)
		}
		after, afterEvents := snapshot(id)
		if !sameRun(before, after) || len(afterEvents) != len(beforeEvents) {
			t.Fatalf("cleanup after finalize changed the run: %s -> %s, %d -> %d events", before.Status, after.Status, len(beforeEvents), len(afterEvents))
		}
	})

	t.Run("timed out", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		startRun(t, p.store, id)
		fn.Result(t, statusEvent(t, "execution-timed-out.json", id), nil)
		run, _ := snapshot(id)
		if run.Status != belay.StatusFailed || run.Reason != sfn.ReasonTimeout {
			t.Fatalf("timed out: %s %q, want failed timeout", run.Status, run.Reason)
		}
	})

	t.Run("succeeded is ignored", func(t *testing.T) {
		id := newRunID()
		seedRun(t, p.store, id)
		startRun(t, p.store, id)
		fn.Result(t, statusEvent(t, "execution-succeeded.json", id), nil)
		if run, _ := snapshot(id); run.Status != belay.StatusRunning {
			t.Fatalf("a SUCCEEDED event moved the run to %s", run.Status)
		}
	})
}

// sameRun compares what cleanup could change.
func sameRun(a, b belay.Run) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
