//go:build linux

package localsandbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
)

// realEntryPkg is the sandbox entry's main package.
const realEntryPkg = "github.com/belay-dev/belay/sandbox-task"

// TestRealEntryFixesTheExample is the happy path with every real part: the
// entry built from ./sandbox-task, launched by this package as an
// unprivileged uid in its namespaces, talking over api.sock to the real
// internal routes (httpapi over a SQLite store), whose model proxy forwards
// to the scripted model of the offline demo; the in-process orchestrator
// sequences the run. The example's failing test must pass after the run,
// and the provider key and run tokens must stay where they belong.
func TestRealEntryFixesTheExample(t *testing.T) {
	requireRoot(t)
	if realEntryErr != nil {
		t.Fatalf("build the sandbox entry: %v", realEntryErr)
	}
	ctx := t.Context()
	dir := shortTempDir(t)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

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
	script, err := scriptedmodel.LoadScript("../../examples/sessions/fix-calc.json")
	if err != nil {
		t.Fatal(err)
	}
	model := scriptedmodel.New(script)
	upstream := httptest.NewServer(model)
	t.Cleanup(upstream.Close)
	providerKey := "canary-provider-key-" + randomHex(t, 8)

	// The launcher needs the internal handler, which needs the
	// orchestrator, which needs the launcher: the launcher gets a handler
	// that forwards to the API server once it exists.
	var api *httpapi.Server
	internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { api.InternalHandler().ServeHTTP(w, r) })
	launcher, err := localsandbox.New(localsandbox.Config{
		EntryPath: realEntry, WorkRoot: filepath.Join(dir, "w"), Internal: internal, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	orch, err := orchestrator.New(orchestrator.Config{Store: store, Artifacts: artifacts, Launcher: launcher, Signer: signer, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orch.Close(ctx) })
	control := randomHex(t, 16)
	api, err = httpapi.New(httpapi.Config{
		Store: store, Artifacts: artifacts, Orchestrator: orch, Signer: signer,
		Limits:        belay.DefaultLimits("test-model"),
		ControlTokens: []string{control},
		Upstream: httpapi.Upstream{
			URL: upstream.URL + "/v1/chat/completions", AllowLoopbackHTTP: true,
			Key: func(ctxKey context.Context) (string, error) { return providerKey, nil },
		},
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	public := httptest.NewServer(api)
	t.Cleanup(public.Close)
	client, err := httpapi.NewClient(public.URL, control)
	if err != nil {
		t.Fatal(err)
	}

	var files []belay.File
	for _, p := range []string{"calc.py", "tests/test_calc.py", "tests/conftest.py"} {
		b, err := os.ReadFile(filepath.Join("../../examples/calc", p))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, belay.File{Path: p, Content: string(b)})
	}
	created, err := client.CreateRun(ctx, belay.RunRequest{
		Instruction:     "Fix the failing test in calc.py",
		Files:           files,
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        8,
		WallTimeSeconds: 120,
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	var events []belay.Event
	if err := client.StreamEvents(ctx, created.RunID, 0, func(e belay.Event) error {
		events = append(events, e)
		return nil
	}); err != nil {
		t.Fatalf("stream events: %v", err)
	}
	run, err := client.GetRun(ctx, created.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != belay.StatusCompleted {
		t.Fatalf("run ended %s (%s); log:\n%s", run.Status, run.Reason, logs.String())
	}
	if !slices.Equal(run.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changed files %v, want [calc.py]", run.ChangedFiles)
	}
	patch, err := client.GetArtifact(ctx, created.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(patch), "+    return a + b") {
		t.Errorf("patch does not fix add:\n%s", patch)
	}
	if got := model.Authorization(); got != "Bearer "+providerKey {
		t.Error("the scripted model did not get the provider key from the proxy")
	}

	var seen strings.Builder
	seen.WriteString(logs.String())
	seen.Write(patch)
	for _, name := range []string{"transcript.jsonl", "result.json"} {
		b, err := client.GetArtifact(ctx, created.RunID, name)
		if err != nil {
			t.Fatal(err)
		}
		seen.Write(b)
	}
	for _, e := range events {
		seen.Write(e.Data)
	}
	if strings.Contains(seen.String(), providerKey) {
		t.Error("the provider key shows up in the log, an artifact or an event")
	}
	if strings.Contains(seen.String(), "bt1.") {
		t.Error("a run token (bt1.…) shows up in the log, an artifact or an event")
	}
	// The run's goroutine removes the workspace after it records the
	// outcome; Close waits for it.
	if err := orch.Close(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(filepath.Join(dir, "w"))
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
