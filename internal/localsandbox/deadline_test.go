//go:build linux

package localsandbox_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/token"
)

// lateLauncher sleeps before it asks the launcher it wraps for a sandbox:
// a launch that takes its time, as pulling an image or placing a Fargate
// task does.
type lateLauncher struct {
	next  belay.Launcher
	delay time.Duration
}

func (l lateLauncher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return l.next.Launch(ctx, spec)
}

// TestLateLaunchKeepsTheRunDeadline runs the real entry, launched a second
// late, for a run of 2 s whose model never answers in time, under the
// orchestrator with the embedded server's stop grace. Both keep to the
// run's one deadline (its start plus 2 s): the entry names that deadline in
// sandbox.ready, ends its agent loop before it and its final check by it,
// and the run is recorded as the sandbox's bundle says — the same status,
// reason (wall_time_exceeded), exit code and check results — rather than
// as a timeout of a clock the sandbox did not keep.
func TestLateLaunchKeepsTheRunDeadline(t *testing.T) {
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
	model := scriptedmodel.New(scriptedmodel.Script{Name: "slow", Steps: []scriptedmodel.Step{
		{DelayMs: 600_000, Content: "too late"},
	}})
	upstream := httptest.NewServer(model)
	t.Cleanup(upstream.Close)

	var api *httpapi.Server
	internal := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { api.InternalHandler().ServeHTTP(w, r) })
	launcher, err := localsandbox.New(localsandbox.Config{
		EntryPath: realEntry, WorkRoot: filepath.Join(dir, "w"), Internal: internal, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	orch, err := orchestrator.New(orchestrator.Config{
		Store: store, Artifacts: artifacts, Signer: signer, Logger: logger,
		Launcher:  lateLauncher{next: launcher, delay: time.Second},
		StopGrace: 5 * time.Second, // as belay serve gives
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orch.Close(context.Background()) })
	control := randomHex(t, 16)
	api, err = httpapi.New(httpapi.Config{
		Store: store, Artifacts: artifacts, Orchestrator: orch, Signer: signer,
		Limits: belay.DefaultLimits("test-model"), ControlTokens: []string{control},
		Upstream: httpapi.Upstream{
			URL: upstream.URL + "/v1/chat/completions", AllowLoopbackHTTP: true,
			Key: func(context.Context) (string, error) { return "sk-test", nil },
		},
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Closing the handler ends the model call still waiting upstream, so
	// the upstream's own Close (registered earlier, run later) returns.
	t.Cleanup(func() { _ = api.Close(context.Background()) })
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
		Instruction: "Fix the failing test in calc.py", Files: files, AllowedPaths: []string{"calc.py"},
		Checks: [][]string{{"python3", "-m", "pytest", "-q"}}, MaxSteps: 4, WallTimeSeconds: 2,
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var events []belay.Event
	if err := client.StreamEvents(sctx, created.RunID, 0, func(e belay.Event) error {
		events = append(events, e)
		return nil
	}); err != nil {
		t.Fatalf("stream events: %v\nlog:\n%s", err, logs.String())
	}
	run, err := store.GetRun(ctx, created.RunID)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := artifacts.GetArtifact(ctx, run.ID, "result.json")
	if err != nil {
		t.Fatalf("the sandbox left no result (run %s, %q): %v\nlog:\n%s", run.Status, run.Reason, err, logs.String())
	}
	var bundle belay.ResultBundle
	if err := json.Unmarshal(raw, &bundle); err != nil {
		t.Fatal(err)
	}

	// One deadline: the run's start plus its wall time, and the entry says
	// it kept to that one.
	deadline := run.StartedAt.Add(2 * time.Second)
	var ready struct {
		Deadline time.Time `json:"deadline"`
	}
	for _, e := range events {
		if e.Type == belay.EventSandboxReady {
			if err := json.Unmarshal(e.Data, &ready); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !ready.Deadline.Equal(deadline) {
		t.Errorf("sandbox.ready names deadline %v; want the run's, %v (started %v plus 2 s)", ready.Deadline, deadline, run.StartedAt)
	}

	// Recorded the same way by both.
	if bundle.Status != belay.StatusFailed || bundle.Reason != sandbox.ReasonWallTime {
		t.Errorf("the sandbox says %s (%q); want failed (%s)", bundle.Status, bundle.Reason, sandbox.ReasonWallTime)
	}
	if run.Status != bundle.Status || run.Reason != bundle.Reason || run.ExitCode == nil || *run.ExitCode != bundle.ExitCode {
		t.Errorf("the run is %s (%q, exit %v); the sandbox said %s (%q, exit %d)\nlog:\n%s",
			run.Status, run.Reason, run.ExitCode, bundle.Status, bundle.Reason, bundle.ExitCode, logs.String())
	}
	if !reflect.DeepEqual(run.Checks, bundle.Checks) {
		t.Errorf("the run's checks %+v differ from the sandbox's %+v", run.Checks, bundle.Checks)
	}
	var terminal struct {
		Reason string `json:"reason"`
	}
	if last := events[len(events)-1]; last.Type != belay.EventRunFailed || json.Unmarshal(last.Data, &terminal) != nil || terminal.Reason != bundle.Reason {
		t.Errorf("the run's last event %s %s; want run.failed with the sandbox's reason", last.Type, last.Data)
	}
}
