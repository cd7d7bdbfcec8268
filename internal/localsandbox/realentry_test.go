//go:build linux

package localsandbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// realEntryPkg is the sandbox entry's main package.
const realEntryPkg = "github.com/belay-dev/belay/sandbox-task"

// realPlane is the control plane around the real entry: the entry built
// from ./sandbox-task, launched by this package (as root: an unprivileged
// uid in its namespaces), talking over api.sock to the real internal
// routes (httpapi over a SQLite store), whose model proxy forwards to a
// scripted model; the in-process orchestrator sequences the runs.
type realPlane struct {
	client      *httpapi.Client
	launcher    *localsandbox.Launcher
	orch        *orchestrator.Orchestrator
	model       *scriptedmodel.Server
	logs        *syncBuffer
	workRoot    string
	providerKey string
}

// newRealPlane starts a plane whose model plays script.
func newRealPlane(t *testing.T, script scriptedmodel.Script) *realPlane {
	t.Helper()
	requireRoot(t)
	if realEntryErr != nil {
		t.Fatalf("build the sandbox entry: %v", realEntryErr)
	}
	ctx := t.Context()
	dir := shortTempDir(t)
	p := &realPlane{logs: &syncBuffer{}, workRoot: filepath.Join(dir, "w"), providerKey: "canary-provider-key-" + randomHex(t, 8)}
	logger := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	store, err := sqlite.Open(ctx, filepath.Join(dir, "belay.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	artifacts, err := localdir.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { artifacts.Close() })
	signer, err := token.NewSigner([]byte(randomHex(t, 32)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	p.model = scriptedmodel.New(script)
	upstream := httptest.NewServer(p.model)
	t.Cleanup(upstream.Close)

	// The launcher needs the internal handler, which needs the
	// orchestrator, which needs the launcher: the launcher gets a handler
	// that forwards to the API server once it exists.
	var api *httpapi.Server
	internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { api.InternalHandler().ServeHTTP(w, r) })
	p.launcher, err = localsandbox.New(localsandbox.Config{
		EntryPath: realEntry, WorkRoot: p.workRoot, Internal: internal, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	p.orch, err = orchestrator.New(orchestrator.Config{Store: store, Artifacts: artifacts, Launcher: p.launcher, Signer: signer, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.orch.Close(context.Background()) })
	control := randomHex(t, 16)
	api, err = httpapi.New(httpapi.Config{
		Store: store, Artifacts: artifacts, Orchestrator: p.orch, Signer: signer,
		Limits:        belay.DefaultLimits("test-model"),
		ControlTokens: []string{control},
		Upstream: httpapi.Upstream{
			URL: upstream.URL + "/v1/chat/completions", AllowLoopbackHTTP: true,
			Key: func(context.Context) (string, error) { return p.providerKey, nil },
		},
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	public := httptest.NewServer(api)
	t.Cleanup(public.Close)
	if p.client, err = httpapi.NewClient(public.URL, control); err != nil {
		t.Fatal(err)
	}
	return p
}

// run submits req, follows the run to its end and returns its events and
// the run as stored.
func (p *realPlane) run(t *testing.T, req belay.RunRequest) ([]belay.Event, wire.RunView) {
	t.Helper()
	ctx := t.Context()
	created, err := p.client.CreateRun(ctx, req, "")
	if err != nil {
		t.Fatal(err)
	}
	var events []belay.Event
	if err := p.client.StreamEvents(ctx, created.RunID, 0, func(e belay.Event) error {
		events = append(events, e)
		return nil
	}); err != nil {
		t.Fatalf("stream events: %v", err)
	}
	run, err := p.client.GetRun(ctx, created.RunID)
	if err != nil {
		t.Fatal(err)
	}
	return events, run
}

// calcFiles are the files of examples/calc, whose test fails until add
// adds.
func calcFiles(t *testing.T) []belay.File {
	t.Helper()
	var files []belay.File
	for _, p := range []string{"calc.py", "tests/test_calc.py", "tests/conftest.py"} {
		b, err := os.ReadFile(filepath.Join("../../examples/calc", p))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, belay.File{Path: p, Content: string(b)})
	}
	return files
}

// finishAtOnce is a model that finishes without changing anything, so a
// run's outcome is its checks' on the uploaded files.
var finishAtOnce = scriptedmodel.Script{Name: "finish", Steps: []scriptedmodel.Step{
	{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: json.RawMessage(`{"summary":"nothing to do"}`)}}},
}}

// pytestRequest runs files with pytest as the only check.
func pytestRequest(files []belay.File) belay.RunRequest {
	return belay.RunRequest{
		Instruction:     "Run the checks",
		Files:           files,
		AllowedPaths:    []string{files[0].Path},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        3,
		WallTimeSeconds: 120,
	}
}

// TestRealEntryFixesTheExample is the happy path with every real part (see
// realPlane), the model playing the offline demo's session. The example's
// failing test must pass after the run, and the provider key and run
// tokens must stay where they belong.
func TestRealEntryFixesTheExample(t *testing.T) {
	script, err := scriptedmodel.LoadScript("../../examples/sessions/fix-calc.json")
	if err != nil {
		t.Fatal(err)
	}
	p := newRealPlane(t, script)
	ctx := t.Context()
	events, run := p.run(t, belay.RunRequest{
		Instruction:     "Fix the failing test in calc.py",
		Files:           calcFiles(t),
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        8,
		WallTimeSeconds: 120,
	})
	if run.Status != belay.StatusCompleted {
		t.Fatalf("run ended %s (%s); log:\n%s", run.Status, run.Reason, p.logs.String())
	}
	if !slices.Equal(run.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changed files %v, want [calc.py]", run.ChangedFiles)
	}
	patch, err := p.client.GetArtifact(ctx, run.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(patch), "+    return a + b") {
		t.Errorf("patch does not fix add:\n%s", patch)
	}
	if got := p.model.Authorization(); got != "Bearer "+p.providerKey {
		t.Error("the scripted model did not get the provider key from the proxy")
	}

	var seen strings.Builder
	seen.WriteString(p.logs.String())
	seen.Write(patch)
	for _, name := range []string{"transcript.jsonl", "result.json"} {
		b, err := p.client.GetArtifact(ctx, run.RunID, name)
		if err != nil {
			t.Fatal(err)
		}
		seen.Write(b)
	}
	for _, e := range events {
		seen.Write(e.Data)
	}
	if strings.Contains(seen.String(), p.providerKey) {
		t.Error("the provider key shows up in the log, an artifact or an event")
	}
	if strings.Contains(seen.String(), "bt1.") {
		t.Error("a run token (bt1.…) shows up in the log, an artifact or an event")
	}
	// The run's goroutine removes the workspace after it records the
	// outcome; Close waits for it.
	if err := p.orch.Close(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(p.workRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if e.Name() != "bin" {
			t.Errorf("the run's workspace %s is still there", e.Name())
		}
	}
}

func randomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}
