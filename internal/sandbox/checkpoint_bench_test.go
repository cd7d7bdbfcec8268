package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/agent"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// moduleRoot is the directory of belay's go.mod.
func moduleRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if parent := filepath.Dir(dir); parent != dir {
			dir = parent
			continue
		}
		tb.Fatal("no go.mod above the working directory")
	}
}

// demoTree is the demo's upload, examples/calc.
func demoTree(tb testing.TB) []belay.File {
	tb.Helper()
	root := filepath.Join(moduleRoot(tb), "examples", "calc")
	var files []belay.File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if d != nil && d.IsDir() && (d.Name() == "__pycache__" || d.Name() == ".pytest_cache") {
				return filepath.SkipDir
			}
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files = append(files, belay.File{Path: filepath.ToSlash(rel), Content: string(b)})
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// demoStates runs the demo's scripted session (examples/sessions/
// fix-calc.json) through the real agent loop and tools on the demo tree,
// and returns the states the loop checkpointed, and the workspace as the
// demo left it.
func demoStates(tb testing.TB) ([]agent.State, workspace) {
	tb.Helper()
	script, err := scriptedmodel.LoadScript(filepath.Join(moduleRoot(tb), "examples", "sessions", "fix-calc.json"))
	if err != nil {
		tb.Fatal(err)
	}
	model := httptest.NewServer(scriptedmodel.New(script))
	tb.Cleanup(model.Close)
	w := newWorkspace(tb, demoTree(tb))
	tools := newTools(tb, w, func(c *sandbox.ToolsConfig) {
		c.AllowedPaths = []string{"calc.py"}
		c.Checks = [][]string{{"python3", "-m", "pytest", "-q"}}
	})
	var states []agent.State
	out, err := agent.Run(context.Background(), agent.Config{
		BaseURL: model.URL + "/v1", Token: "bt1.bench-model-token-0123456789", Model: "bench",
		Instruction: "Fix the failing test in calc.py", MaxSteps: 12, Tools: tools,
		Checkpoint: func(_ context.Context, s agent.State) { states = append(states, s) },
	})
	if err != nil || !out.Finished {
		tb.Fatalf("demo session: %+v, %v", out, err)
	}
	return states, w
}

// BenchmarkCheckpoint measures what checkpoints cost a run, per step (one
// tool call: the checkpoint before it runs and the one after its result),
// through the real control plane (httpapi over the sandbox's Unix socket,
// SQLite, the artifact folder): computing the workspace's change, encoding,
// uploading, storing, pointing the run at it and pruning the one before.
// The conversation is the demo's after its last tool call (the largest it
// gets); the trees are the demo's (examples/calc, calc.py edited) and one
// at the reference limits (32 files, 512 KiB) with one file changed, and
// with every file changed. The baseline, measured in the same run, is what
// each step sends already: one batch of its two events (tool.call,
// tool.result) through the same socket. Each reports bytes/checkpoint, and
// the log has the ratio to the baseline.
func BenchmarkCheckpoint(b *testing.B) {
	states, demo := demoStates(b)
	pending, after := states[len(states)-3], states[len(states)-2] // the last tool call before finish
	if pending.Pending == nil || after.Pending != nil {
		b.Fatalf("demo states %d: pending %v, after %v", len(states), pending.Pending, after.Pending)
	}
	// The baseline appends far more events than a run may; the caps are
	// raised so every batch is sent and stored.
	cp := newControlPlaneWith(b, worldReadableDir(b), scriptedmodel.Script{}, func(c *httpapi.Config) {
		c.SandboxEventLimits = belay.SandboxEventLimits{MaxEvents: 1 << 30, MaxBytes: 1 << 40}
	})
	runID, set := cp.startRun(b, runRequest(belay.PolicyDenyAll, 0))
	client := cp.apiClient(b)

	var baseline time.Duration
	b.Run("baseline_step_events", func(b *testing.B) {
		events, err := sandbox.NewEventClient(sandbox.EventsConfig{BaseURL: "http://belay", HTTPClient: client, RunID: runID, Token: set.Events,
			OnCapped: func(msg string) { b.Errorf("events capped: %s", msg) }})
		if err != nil {
			b.Fatal(err)
		}
		defer events.Close(context.Background())
		for b.Loop() {
			events.Emit(belay.EventToolCall, map[string]any{"step": 5, "callId": "call_4_0", "name": "run_check", "arguments": `{"argv":["python3","-m","pytest","-q"]}`})
			events.Emit(belay.EventToolResult, map[string]any{"step": 5, "callId": "call_4_0", "name": "run_check", "result": "exit code 0 after 0.4s\n1 passed"})
			if err := events.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		baseline = b.Elapsed() / time.Duration(b.N)
	})

	refOne := newWorkspace(b, benchTree())
	mustDo(b, os.WriteFile(filepath.Join(refOne.repo, "pkg/mod_07.py"), []byte("def f(x):\n    return x + 2\n"), 0o644))
	refAll := newWorkspace(b, benchTree())
	for i := range 32 {
		p := filepath.Join(refAll.repo, fmt.Sprintf("pkg/mod_%02d.py", i))
		old, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		mustDo(b, os.WriteFile(p, []byte(strings.ReplaceAll(string(old), "x + 1", "x + 2")), 0o644))
	}
	trees := []struct {
		name string
		w    workspace
		base []belay.File
	}{
		{"demo", demo, demoTree(b)},
		{"reference_limits_one_file_changed", refOne, benchTree()},
		{"reference_limits_every_file_changed", refAll, benchTree()},
	}
	var seq int64
	for _, tree := range trees {
		b.Run(tree.name, func(b *testing.B) {
			run, err := cp.store.GetRun(context.Background(), runID)
			if err != nil {
				b.Fatal(err)
			}
			if run.Checkpoint != nil {
				seq = run.Checkpoint.Seq
			}
			ckpt := sandbox.NewCheckpointer(sandbox.CheckpointerConfig{
				BaseURL: "http://belay", HTTPClient: client, RunID: runID, Attempt: 1, Token: set.Events,
				RepoDir: tree.w.repo, Base: tree.base, NextSeq: seq + 1, ProgressInterval: time.Hour,
			})
			defer ckpt.Close()
			for b.Loop() {
				ckpt.Save(context.Background(), pending)
				ckpt.Save(context.Background(), after)
			}
			saved, size, _ := ckpt.Stats()
			if saved != 2*b.N {
				b.Fatalf("%d checkpoints saved of %d", saved, 2*b.N)
			}
			perStep := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(size)/float64(saved), "bytes/checkpoint")
			b.ReportMetric(float64(perStep.Microseconds())/1000, "ms/step")
			if baseline > 0 {
				b.ReportMetric(float64(perStep)/float64(baseline), "x-baseline")
			}
			stored := cp.latest(b, runID)
			b.Logf("%s: %d bytes a checkpoint (%d changed files), %v a step, %.1fx the step's events (%v)",
				tree.name, size/int64(saved), len(stored.Workspace.Files), perStep, float64(perStep)/float64(baseline), baseline)
		})
	}
}

// latest reads the run's latest checkpoint as stored.
func (cp *controlPlane) latest(tb testing.TB, runID string) wire.Checkpoint {
	tb.Helper()
	run, err := cp.store.GetRun(context.Background(), runID)
	if err != nil || run.Checkpoint == nil {
		tb.Fatalf("the run points at no checkpoint (%v)", err)
	}
	b, err := cp.arts.GetArtifact(context.Background(), runID, run.Checkpoint.Name())
	if err != nil {
		tb.Fatal(err)
	}
	var c wire.Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		tb.Fatal(err)
	}
	return c
}
