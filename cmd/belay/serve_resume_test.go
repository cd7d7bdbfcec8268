package main

// belay serve killed and started again: the built binary in a process of
// its own, SIGKILLed in the middle of a run, and started again on the same
// data directory and address.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// buildServeBinaries builds belay and belay-sandbox (beside it, where
// belay serve looks) into a fresh directory the sandbox user can search.
func buildServeBinaries(tb testing.TB) string {
	tb.Helper()
	root := embeddedtest.ModuleRoot(tb)
	dir, err := os.MkdirTemp("", "belay-bin")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for _, b := range []struct{ out, pkg string }{
		{filepath.Join(dir, "belay"), "./cmd/belay"},
		{filepath.Join(dir, embedded.SandboxBinName), "./sandbox-task"},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return filepath.Join(dir, "belay")
}

// servedProcess is one `belay serve` process.
type servedProcess struct {
	cmd    *exec.Cmd
	out    lockedBuffer
	exited chan error
}

// startServeBinary starts `belay serve args...` and waits until it serves.
// The test's cleanup stops it with SIGTERM if it still runs.
func startServeBinary(tb testing.TB, bin string, args ...string) *servedProcess {
	tb.Helper()
	p := &servedProcess{cmd: exec.Command(bin, append([]string{"serve"}, args...)...), exited: make(chan error, 1)}
	p.cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + tb.TempDir(), "LANG=C.UTF-8"}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			_ = p.cmd.Process.Kill()
			tb.Errorf("belay serve did not stop within 60 s of SIGTERM")
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; {
		if strings.Contains(p.out.String(), "serving on ") {
			return p
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			tb.Fatalf("belay serve exited (%v):\n%s", err, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("belay serve did not start within 60 s:\n%s", p.out.String())
		}
	}
}

// kill SIGKILLs the process and waits for it.
func (p *servedProcess) kill(tb testing.TB) {
	tb.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	err := <-p.exited
	p.exited <- err
}

func unusedPort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeKilledMidRunResumes is issue 12's restart proof: the built
// belay serve is SIGKILLed while a run's approved shell command sleeps
// (its sandbox dies with it), and started again on the same data directory
// and address: the run resumes on a new sandbox, the command comes back to
// the model as interrupted, and the run completes. One client follows the
// run's events across both processes (reconnecting with Last-Event-ID),
// and the log it read has no gap and no duplicate.
func TestServeKilledMidRunResumes(t *testing.T) {
	bin := buildServeBinaries(t)
	// belay serve's default launcher (OCI: the image make test builds,
	// under runc), and the process launcher.
	t.Run("oci", func(t *testing.T) {
		testServeKilledMidRunResumes(t, bin, "--sandbox-image", ocisandboxtest.Image(t), "--image-cache", ocisandboxtest.Cache(t))
	})
	t.Run("process", func(t *testing.T) {
		testServeKilledMidRunResumes(t, bin, "--launcher", "process", "--allow-weak-isolation")
	})
}

func testServeKilledMidRunResumes(t *testing.T, bin string, launcher ...string) {
	data := filepath.Join(t.TempDir(), "data")
	sandboxes := embeddedtest.SandboxDir(t)
	script := scriptedmodel.Script{Name: "restart", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "edit_file", Arguments: json.RawMessage(`{"path":"calc.py","old":"return a - b","new":"return a + b"}`)}}},
		{ToolCalls: []scriptedmodel.ToolCall{{Name: "shell", Arguments: json.RawMessage(`{"command":"echo ran >> counter.txt && sleep 300"}`)}}},
		{Content: "Fixed add.", ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: json.RawMessage(`{"summary":"Fixed add."}`)}}},
	}}
	scriptFile := filepath.Join(t.TempDir(), "script.json")
	b, err := json.Marshal(script)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(scriptFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := unusedPort(t)
	args := append([]string{"--addr", addr, "--data-dir", data, "--sandbox-dir", sandboxes, "--scripted-model", scriptFile}, launcher...)
	first := startServeBinary(t, bin, args...)
	if launcher[0] == "--sandbox-image" && !strings.Contains(first.out.String(), "launcher:   oci") {
		t.Fatalf("belay serve does not say it runs the OCI launcher:\n%s", first.out.String())
	}

	tok, err := os.ReadFile(filepath.Join(data, embedded.ControlTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := httpapi.NewClient("http://"+addr, strings.TrimSpace(string(tok)), httpapi.WithReconnectBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	files, err := readTree(filepath.Join(embeddedtest.ModuleRoot(t), "examples", "calc"), belay.DefaultLimits("any"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, belay.File{Path: "counter.txt", Content: "start\n"})
	created, err := c.CreateRun(ctx, belay.RunRequest{
		Instruction: "Fix the failing test in calc.py", Files: files,
		AllowedPaths: []string{"calc.py", "counter.txt"}, Checks: [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps: 6, WallTimeSeconds: 180,
		Approval: belay.ApprovalConfig{Policy: belay.PolicyAllowList, Allow: []string{"shell"}},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := created.RunID
	followed := make(chan error, 1)
	var events []belay.Event
	go func() {
		followed <- c.StreamEvents(ctx, id, 0, func(e belay.Event) error {
			events = append(events, e)
			return nil
		})
	}()

	// Kill belay serve once the command's line is in a checkpoint.
	arts, err := localdir.New(filepath.Join(data, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	defer arts.Close()
	for {
		run, err := c.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status.Terminal() {
			t.Fatalf("run ended %s (%s) before the kill:\n%s", run.Status, run.Reason, first.out.String())
		}
		if ck := run.Checkpoint; ck != nil && ck.Pending == "shell" {
			if body, err := arts.GetArtifact(ctx, id, ck.Name()); err == nil {
				var cp wire.Checkpoint
				if json.Unmarshal(body, &cp) == nil && hasFile(cp, "counter.txt", "start\nran\n") {
					break
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%v killing belay serve", time.Now().Format(time.TimeOnly))
	first.kill(t)

	second := startServeBinary(t, bin, args...)
	t.Logf("%v started again", time.Now().Format(time.TimeOnly))
	err = <-followed
	t.Logf("%v followed to the end", time.Now().Format(time.TimeOnly))
	if err != nil {
		t.Fatalf("follow the run across the restart: %v\nfirst:\n%s\nsecond:\n%s", err, first.out.String(), second.out.String())
	}
	run, err := c.GetRun(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != belay.StatusCompleted {
		t.Fatalf("run ended %s (%q); want completed after the restart\nsecond:\n%s", run.Status, run.Reason, second.out.String())
	}
	if run.Attempt != 2 || len(run.Attempts) != 2 || run.Attempts[0].Lost != orchestrator.ReasonRestarted {
		t.Errorf("attempts %d %+v; want 2, the first lost to the restart", run.Attempt, run.Attempts)
	}
	// The log as the follower read it: every seq once, in order; each
	// tool call once, with one result.
	calls, results := map[string]int{}, map[string]int{}
	var interrupted bool
	for i, e := range events {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: a gap or a duplicate across the restart", i, e.Seq)
		}
		var d struct {
			Step        int    `json:"step"`
			CallID      string `json:"callId"`
			Name        string `json:"name"`
			Interrupted bool   `json:"interrupted"`
			Result      string `json:"result"`
		}
		_ = json.Unmarshal(e.Data, &d)
		key := fmt.Sprintf("%d/%s", d.Step, d.CallID)
		switch e.Type {
		case belay.EventToolCall:
			calls[key]++
		case belay.EventToolResult:
			results[key]++
			if d.Name == "shell" && d.Interrupted {
				var r agent.Interrupted
				interrupted = json.Unmarshal([]byte(d.Result), &r) == nil && strings.Contains(r.Reason, orchestrator.ReasonRestarted)
			}
		}
	}
	for k, n := range calls {
		if n != 1 || results[k] != 1 {
			t.Errorf("tool call %s: %d tool.call and %d tool.result events; want one each", k, n, results[k])
		}
	}
	if !interrupted {
		t.Errorf("no interrupted result for the shell command naming the restart")
	}
	if last := events[len(events)-1]; last.Type != belay.EventRunCompleted {
		t.Errorf("the log ends with %s", last.Type)
	}
	patch, err := c.GetArtifact(ctx, id, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(patch), "+    return a + b") || strings.Count(string(patch), "\n+ran\n") != 1 {
		t.Errorf("the final patch:\n%s", patch)
	}
}

func hasFile(c wire.Checkpoint, path, content string) bool {
	for _, f := range c.Workspace.Files {
		if f.Path == path && string(f.Content()) == content {
			return true
		}
	}
	return false
}
