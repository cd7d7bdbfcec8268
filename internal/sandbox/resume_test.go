package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// listenIn serves the control plane's internal routes on dir/api.sock too,
// for the sandbox of another attempt of the same run.
func (cp *controlPlane) listenIn(tb testing.TB, dir string) string {
	tb.Helper()
	socket := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: cp.api.InternalHandler()}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return socket
}

// startAttempt lays out a fresh workspace for the run's current attempt,
// as the launcher does (spec.json with the attempt and how the one before
// was lost, fresh token files), and starts the entry on it.
func startAttempt(t *testing.T, cp *controlPlane, runID string) *sandboxRun {
	t.Helper()
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	set, err := cp.signer.IssueSet(runID, run.Request.Model, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ws := worldReadableDir(t)
	spec := belay.SpecForRun(run)
	spec.APIBaseURL, spec.APISocket = "http://belay", cp.listenIn(t, ws)
	me := os.Geteuid()
	spec.APIPeerUID, spec.APIPeerSharesUID = &me, !isRoot()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, os.WriteFile(filepath.Join(ws, "spec.json"), b, 0o644))
	tokens := filepath.Join(ws, "tokens")
	mustDo(t, os.Mkdir(tokens, 0o700))
	for name, tok := range map[string]string{"model.token": set.Model, "events.token": set.Events, "approvals.token": set.Approvals} {
		mustDo(t, os.WriteFile(filepath.Join(tokens, name), []byte(tok+"\n"), 0o600))
		if isRoot() {
			mustDo(t, os.Lchown(filepath.Join(tokens, name), testUID, testUID))
		}
	}
	if isRoot() {
		for _, p := range []string{ws, tokens, spec.APISocket} {
			mustDo(t, os.Lchown(p, testUID, testUID))
		}
	}
	sr := &sandboxRun{cp: cp, ws: ws, runID: runID, tokens: set, req: run.Request}
	sr.cmd = helperCommand(t, helperBinary(t), "entry", "BELAY_TEST_WORKSPACE="+ws, "BELAY_TEST_SECRET="+envCanary)
	sr.cmd.Stdout, sr.cmd.Stderr = &sr.stdout, &sr.stderr
	t.Cleanup(func() {
		if sr.cmd.Process != nil && sr.cmd.ProcessState == nil {
			_ = sr.cmd.Process.Kill()
			_ = sr.cmd.Wait()
		}
	})
	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return sr
}

// killTree SIGKILLs the entry and every process working in its workspace
// (the commands it started, in process groups of their own), as the death
// of a whole sandbox does.
func (sr *sandboxRun) killTree(t *testing.T) {
	t.Helper()
	_ = sr.cmd.Process.Kill()
	procs, _ := os.ReadDir("/proc")
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", d.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, sr.ws+"/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	sr.wait(t)
}

// waitCheckpoint polls the run until its latest checkpoint satisfies ok,
// and returns it as stored.
func (cp *controlPlane) waitCheckpoint(t *testing.T, runID string, ok func(belay.CheckpointRef, wire.Checkpoint) bool) wire.Checkpoint {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		run, err := cp.store.GetRun(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Checkpoint != nil {
			b, err := cp.arts.GetArtifact(context.Background(), runID, run.Checkpoint.Name())
			var c wire.Checkpoint
			if err == nil && json.Unmarshal(b, &c) == nil && ok(*run.Checkpoint, c) {
				return c
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no checkpoint of run %s came as awaited", runID)
	return wire.Checkpoint{}
}

func changeOf(c wire.Checkpoint, path string) (string, bool) {
	for _, f := range c.Workspace.Files {
		if f.Path == path && !f.Deleted {
			return string(f.Content()), true
		}
	}
	return "", false
}

// TestEntryResumesFromItsCheckpoint kills a sandbox (the entry and its
// command) while an approved shell command sleeps after appending to a
// counter, and starts the next attempt's entry on a fresh workspace: it
// rebuilds the workspace from the checkpoint (the file written before the
// command and the counter line the command wrote), tells the model the
// command was interrupted, never runs it again, and finishes the run with
// one bundle holding both changes.
func TestEntryResumesFromItsCheckpoint(t *testing.T) {
	script := scriptedmodel.Script{Name: "resume", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "write_file", Arguments: []byte(`{"path":"calc.py","content":"def add(a, b):\n    return a + b\n"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "shell", Arguments: []byte(`{"command":"echo one >> tests/counter.txt && sleep 30"}`)}}},
		{Content: "Done.", ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: []byte(`{"summary":"Fixed add."}`)}}},
	}}
	first := startSandbox(t, script, runRequest(belay.PolicyAllowAll, 0))
	cp, runID := first.cp, first.runID
	// The counter line the command wrote is in a progress checkpoint,
	// with the command still pending.
	pending := cp.waitCheckpoint(t, runID, func(ref belay.CheckpointRef, c wire.Checkpoint) bool {
		counter, ok := changeOf(c, "tests/counter.txt")
		return ref.Pending == "shell" && ok && counter == "one\n"
	})
	first.killTree(t)

	if _, err := cp.store.ResumeRun(context.Background(), runID, belay.Resume{From: 1, At: time.Now(), Reason: "sandbox killed"}); err != nil {
		t.Fatal(err)
	}
	second := startAttempt(t, cp, runID)
	if code := second.wait(t); code != 0 {
		t.Fatalf("the resumed entry exited %d: %s", code, second.stderr.String())
	}
	out := second.outputs(t)
	var bundle belay.ResultBundle
	if err := json.Unmarshal(out["result.json"], &bundle); err != nil {
		t.Fatal(err)
	}
	if bundle.Status != belay.StatusCompleted {
		t.Fatalf("resumed run's bundle: %s (%s), want completed; stderr: %s", bundle.Status, bundle.Reason, second.stderr.String())
	}
	patch := string(out["patch.diff"])
	if !strings.Contains(patch, "+    return a + b") || strings.Count(patch, "+one") != 1 || !strings.Contains(patch, "tests/counter.txt") {
		t.Fatalf("the final patch lacks the file written before the kill or has the counter line other than once:\n%s", patch)
	}

	// The model's first request after the resume answers the command as
	// interrupted; it was the only request at that step.
	var interrupted []scriptedmodel.Request
	for _, r := range cp.model.Requests() {
		if r.Step == 2 {
			interrupted = append(interrupted, r)
		}
	}
	if len(interrupted) != 1 {
		t.Fatalf("%d model requests at step 2, want 1 (after the resume)", len(interrupted))
	}
	last := interrupted[0].Messages[len(interrupted[0].Messages)-1]
	var got agent.Interrupted
	if last.Role != "tool" || json.Unmarshal([]byte(last.Content), &got) != nil || !got.Interrupted ||
		!strings.Contains(got.Reason, "sandbox killed") || !strings.Contains(got.Reason, "attempt 2") {
		t.Fatalf("the shell call came back to the model as %+v; want interrupted, naming the loss and the attempt", last)
	}
	if !bytes.Contains(out["transcript.jsonl"], []byte(`"interrupted\":true`)) || !bytes.Contains(out["transcript.jsonl"], []byte("resumed on a new sandbox")) {
		t.Errorf("the transcript does not show the resume and the interrupted call")
	}
	second.assertNoSecrets(t)
	// The resumed attempt's own checkpoints continue the sequence.
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Checkpoint == nil || run.Checkpoint.Attempt != 2 {
		t.Fatalf("the run's latest checkpoint %+v; want one of attempt 2", run.Checkpoint)
	}
	// No checkpoint holds a token of either attempt, or the provider key.
	latest, err := cp.arts.GetArtifact(context.Background(), runID, run.Checkpoint.Name())
	if err != nil {
		t.Fatal(err)
	}
	during, _ := json.Marshal(pending)
	for _, secret := range []string{first.tokens.Model, first.tokens.Events, first.tokens.Approvals,
		second.tokens.Model, second.tokens.Events, second.tokens.Approvals, providerKeyCanary, envCanary} {
		if bytes.Contains(latest, []byte(secret)) || bytes.Contains(during, []byte(secret)) {
			t.Errorf("a checkpoint holds a secret")
		}
	}
}
