package embedded_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// The end-to-end tests in this package run the whole embedded control
// plane: embedded.Main on 127.0.0.1:0, the real sandbox entry built from
// ./sandbox-task, started by the real local launcher (as root: its own uid
// and namespaces), real git and Debian's python3 -m pytest inside it, and
// the scripted model behind a loopback server as the provider. The caller
// is httpapi.Client.

// e2eModel is the model the end-to-end control planes are configured with.
const e2eModel = "belay-e2e-model"

// providerKey is the provider key the end-to-end control planes hold: a
// canary that must reach the scripted provider and nothing else.
const providerKey = "sk-e2e-canary-provider-key-0123456789"

// runDeadline bounds how long a test follows one run; far above what a
// run takes, it only keeps a broken run from hanging the package.
const runDeadline = 90 * time.Second

// entryBuild is the sandbox entry, built once for the package's tests.
var entryBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if entryBuild.dir != "" {
		_ = os.RemoveAll(entryBuild.dir)
	}
	os.Exit(code)
}

// realEntry returns the sandbox entry built from ./sandbox-task, once per
// test binary (embeddedtest.RealSandbox builds per test), in a directory
// the sandbox user may search, so a test can also start it from a wrapper.
func realEntry(tb testing.TB) string {
	tb.Helper()
	root := embeddedtest.ModuleRoot(tb)
	if m, _ := filepath.Glob(filepath.Join(root, "sandbox-task", "*.go")); len(m) == 0 {
		// Skips outside CI, fails in CI, as the helper does.
		return embeddedtest.RealSandbox(tb)
	}
	entryBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "belay-e2e-entry")
		if err != nil {
			entryBuild.err = err
			return
		}
		entryBuild.dir = dir
		if err := os.Chmod(dir, 0o711); err != nil {
			entryBuild.err = err
			return
		}
		path := filepath.Join(dir, embedded.SandboxBinName)
		cmd := exec.Command("go", "build", "-o", path, "./sandbox-task")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			entryBuild.err = errors.New("go build ./sandbox-task: " + err.Error() + "\n" + string(out))
			return
		}
		entryBuild.path = path
	})
	if entryBuild.err != nil {
		tb.Fatalf("build the sandbox entry: %v", entryBuild.err)
	}
	return entryBuild.path
}

// provider is the scripted model behind a loopback HTTP server, as the
// control plane's upstream. It can hold one request (by its number,
// counting from 1) until the test releases it, so the test can look at a
// live sandbox at a known point of its script without sleeping.
type provider struct {
	model   *scriptedmodel.Server
	srv     *httptest.Server
	holdAt  int64
	n       atomic.Int64
	arrived chan struct{}
	release chan struct{}
	freeOne sync.Once
	// hook, when set, sees each request's number as it arrives, before
	// it is answered.
	hook func(n int64)
}

// newProvider serves script; with holdAt > 0 the holdAt-th request waits
// for Release (or for its client to go away).
func newProvider(tb testing.TB, script scriptedmodel.Script, holdAt int) *provider {
	tb.Helper()
	if err := script.Validate(); err != nil {
		tb.Fatalf("script %s: %v", script.Name, err)
	}
	p := &provider{
		model:   scriptedmodel.New(script),
		holdAt:  int64(holdAt),
		arrived: make(chan struct{}),
		release: make(chan struct{}),
	}
	p.srv = httptest.NewServer(p)
	tb.Cleanup(func() {
		p.Release()
		p.srv.Close()
	})
	return p
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.n.Add(1)
	if p.hook != nil {
		p.hook(n)
	}
	if n == p.holdAt {
		close(p.arrived)
		select {
		case <-p.release:
		case <-r.Context().Done():
		}
	}
	p.model.ServeHTTP(w, r)
}

// Held is closed when the held request has arrived.
func (p *provider) Held() <-chan struct{} { return p.arrived }

// Release lets the held request through.
func (p *provider) Release() { p.freeOne.Do(func() { close(p.release) }) }

// Calls is how many chat-completions requests reached the provider.
func (p *provider) Calls() int { return int(p.n.Load()) }

// plane is a running control plane of an end-to-end test.
type plane struct {
	m   *embedded.Main
	c   *httpapi.Client
	cfg embedded.Config
}

// startWith starts a control plane whose upstream is p and whose sandbox
// is the real entry (or sandboxBin when not empty), logging into logs
// (when not nil).
func startWith(tb testing.TB, p *provider, logs *embeddedtest.Logs, sandboxBin string, edits ...func(*embedded.Config)) plane {
	tb.Helper()
	cfg := embeddedtest.Config(tb, logs)
	cfg.ScriptedModel = ""
	cfg.Model = e2eModel
	cfg.ModelAPIURL = p.srv.URL + "/v1/chat/completions"
	cfg.ModelAPIKey = providerKey
	cfg.SandboxBin = sandboxBin
	if cfg.SandboxBin == "" {
		cfg.SandboxBin = realEntry(tb)
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	m := embeddedtest.Start(tb, cfg)
	// Registered after Start, so it runs before Close: a request still held
	// must not keep the shutdown waiting, and a model call still in flight
	// (the proxy lets a paid-for call run on after its sandbox is gone)
	// must not keep the provider's Close waiting for its scripted delay.
	tb.Cleanup(func() {
		p.Release()
		p.srv.CloseClientConnections()
	})
	return plane{m: m, c: clientOf(tb, m), cfg: cfg}
}

// finished follows the run to its terminal event and returns its events
// and the run as it ended.
func (pl plane) finished(tb testing.TB, runID string) ([]belay.Event, wire.RunView) {
	tb.Helper()
	events := follow(tb, pl.c, runID)
	run, err := pl.c.GetRun(context.Background(), runID)
	if err != nil {
		tb.Fatalf("get run %s: %v", runID, err)
	}
	return events, run
}

// calcDir is the example project with the failing pytest test.
func calcDir(tb testing.TB) string {
	tb.Helper()
	return filepath.Join(embeddedtest.ModuleRoot(tb), "examples", "calc")
}

// treeFiles reads the uploadable files under dir (skipping hidden folders
// and bytecode a local pytest run may have left).
func treeFiles(tb testing.TB, dir string) []belay.File {
	tb.Helper()
	var files []belay.File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != dir && (strings.HasPrefix(name, ".") || name == "__pycache__") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".pyc") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, belay.File{Path: filepath.ToSlash(rel), Content: string(b)})
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// calcRequest asks to fix the calc example, proved by pytest.
func calcRequest(tb testing.TB) belay.RunRequest {
	tb.Helper()
	return belay.RunRequest{
		Instruction:     "Fix the failing test in calc.py",
		Files:           treeFiles(tb, calcDir(tb)),
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        12,
		WallTimeSeconds: 120,
	}
}

// follow streams the run's events until its terminal event.
func follow(tb testing.TB, c *httpapi.Client, runID string) []belay.Event {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	var events []belay.Event
	if err := c.StreamEvents(ctx, runID, 0, func(e belay.Event) error {
		events = append(events, e)
		return nil
	}); err != nil {
		tb.Fatalf("follow run %s: %v (after %d events: %s)", runID, err, len(events), eventTypes(events))
	}
	return events
}

// errFound stops a stream once the awaited event is seen.
var errFound = errors.New("found")

// awaitEvent streams the run's events until one matches, and returns it.
func awaitEvent(tb testing.TB, c *httpapi.Client, runID string, match func(belay.Event) bool) belay.Event {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	var found belay.Event
	var seen []belay.Event
	err := c.StreamEvents(ctx, runID, 0, func(e belay.Event) error {
		seen = append(seen, e)
		if match(e) {
			found = e
			return errFound
		}
		return nil
	})
	if !errors.Is(err, errFound) {
		tb.Fatalf("run %s: the awaited event never came (%v); events: %s", runID, err, eventTypes(seen))
	}
	return found
}

func eventTypes(events []belay.Event) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString("\n  ")
		b.WriteString(e.Type)
		b.WriteString(" ")
		b.Write(e.Data)
	}
	return b.String()
}

// toolResult is the data of a tool.result event.
type toolResult struct {
	Step    int    `json:"step"`
	CallID  string `json:"callId"`
	Name    string `json:"name"`
	IsError bool   `json:"isError"`
	Result  string `json:"result"`
}

// toolCall is the data of a tool.call event.
type toolCall struct {
	Step      int    `json:"step"`
	CallID    string `json:"callId"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// toolResults returns the tool.result events' data, in order.
func toolResults(tb testing.TB, events []belay.Event) []toolResult {
	tb.Helper()
	var out []toolResult
	for _, e := range events {
		if e.Type != belay.EventToolResult {
			continue
		}
		var r toolResult
		if err := json.Unmarshal(e.Data, &r); err != nil {
			tb.Fatalf("tool.result %d: %v", e.Seq, err)
		}
		out = append(out, r)
	}
	return out
}

// resultOfStep returns the result of the step's only tool call.
func resultOfStep(tb testing.TB, events []belay.Event, step int) toolResult {
	tb.Helper()
	var got []toolResult
	for _, r := range toolResults(tb, events) {
		if r.Step == step {
			got = append(got, r)
		}
	}
	if len(got) != 1 {
		tb.Fatalf("step %d has %d tool results; want 1; events: %s", step, len(got), eventTypes(events))
	}
	return got[0]
}

func call(name string, args any) scriptedmodel.ToolCall {
	b, err := json.Marshal(args)
	if err != nil {
		panic(err)
	}
	return scriptedmodel.ToolCall{Name: name, Arguments: b}
}

// step is a scripted reply with one tool call.
func step(name string, args any) scriptedmodel.Step {
	return scriptedmodel.Step{ToolCalls: []scriptedmodel.ToolCall{call(name, args)}}
}

func finish(summary string) scriptedmodel.Step {
	return scriptedmodel.Step{Content: summary, ToolCalls: []scriptedmodel.ToolCall{call("finish", map[string]string{"summary": summary})}}
}

// TestEndToEndFixesTheExample is issue 4's main path through Main: the
// example session reads the failing test, edits calc.py and runs pytest;
// the run completes, its patch fixes a fresh copy of the example, and the
// event log tells the story in the order it happened.
func TestEndToEndFixesTheExample(t *testing.T) {
	t.Parallel()
	script, err := scriptedmodel.LoadScript(filepath.Join(embeddedtest.ModuleRoot(t), "examples", "sessions", "fix-calc.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, script, 0)
	logs := &embeddedtest.Logs{}
	pl := startWith(t, p, logs, "")
	ctx := context.Background()

	created, err := pl.c.CreateRun(ctx, calcRequest(t), "")
	if err != nil {
		t.Fatal(err)
	}
	events, run := pl.finished(t, created.RunID)
	if run.Status != belay.StatusCompleted || run.ExitCode == nil || *run.ExitCode != 0 {
		t.Fatalf("run ended %s (reason %q, exit code %v); want completed with exit code 0; events: %s",
			run.Status, run.Reason, run.ExitCode, eventTypes(events))
	}
	if len(run.Checks) != 1 || !slices.Equal(run.Checks[0].Argv, []string{"python3", "-m", "pytest", "-q"}) || run.Checks[0].ExitCode != 0 {
		t.Errorf("checks %+v; want python3 -m pytest -q, exit code 0", run.Checks)
	}
	if !slices.Equal(run.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changed files %q; want [calc.py]", run.ChangedFiles)
	}
	if run.Usage.ModelRequests != p.Calls() || p.Calls() != len(script.Steps) {
		t.Errorf("usage counts %d model requests, the provider got %d; want one per scripted step (%d)",
			run.Usage.ModelRequests, p.Calls(), len(script.Steps))
	}
	if got := p.model.Authorization(); got != "Bearer "+providerKey {
		t.Error("the provider did not get the provider key from the proxy")
	}

	checkCausalOrder(t, events)

	patch, err := pl.c.GetArtifact(ctx, created.RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	applyAndTest(t, calcRequest(t).Files, patch)

	// No secret anywhere a user or operator can read.
	var seen strings.Builder
	seen.WriteString(logs.String())
	seen.Write(patch)
	for _, name := range []string{"result.json", "transcript.jsonl"} {
		b, err := pl.c.GetArtifact(ctx, created.RunID, name)
		if err != nil {
			t.Fatal(err)
		}
		seen.Write(b)
	}
	for _, e := range events {
		seen.Write(e.Data)
	}
	for what, secret := range map[string]string{"provider key": providerKey, "control-plane token": pl.m.Token(), "run token": "bt1."} {
		if strings.Contains(seen.String(), secret) {
			t.Errorf("the %s shows up in the logs, an artifact or an event", what)
		}
	}
}

// checkCausalOrder checks that the log is gapless and in the order things
// happened: run.queued, run.started, sandbox.ready, then step by step the
// model call (model.request, model.response) and its tool calls
// (tool.call, tool.result, check.finished), then the final check and
// run.completed last. The control plane appends the model events itself,
// the sandbox sends the rest in batches: a batch held back past the next
// model call would put a step's tool calls after the next step's request.
func checkCausalOrder(tb testing.TB, events []belay.Event) {
	tb.Helper()
	for i, e := range events {
		if e.Seq != int64(i+1) {
			tb.Fatalf("event %d has seq %d; want gapless seqs from 1: %s", i, e.Seq, eventTypes(events))
		}
	}
	n := len(events)
	if n < 4 || events[0].Type != belay.EventRunQueued || events[1].Type != belay.EventRunStarted ||
		events[n-1].Type != belay.EventRunCompleted {
		tb.Fatalf("the log does not go run.queued, run.started … run.completed: %s", eventTypes(events))
	}
	first := map[string]int{}
	var requests, responses []int
	for i, e := range events {
		if _, ok := first[e.Type]; !ok {
			first[e.Type] = i
		}
		switch e.Type {
		case belay.EventModelRequest:
			requests = append(requests, i)
		case belay.EventModelResponse:
			responses = append(responses, i)
		}
		if belay.IsTerminalEvent(e.Type) && i != n-1 {
			tb.Errorf("terminal event %s at seq %d is not the last", e.Type, e.Seq)
		}
	}
	chain := []string{belay.EventRunQueued, belay.EventRunStarted, belay.EventSandboxReady, belay.EventModelRequest,
		belay.EventModelResponse, belay.EventToolCall, belay.EventToolResult, belay.EventCheckFinished, belay.EventRunCompleted}
	for i := 1; i < len(chain); i++ {
		a, aok := first[chain[i-1]]
		b, bok := first[chain[i]]
		if !aok || !bok || a >= b {
			tb.Errorf("the first %s (seq %d) does not come before the first %s (seq %d)", chain[i-1], a+1, chain[i], b+1)
		}
	}
	if len(requests) != len(responses) {
		tb.Fatalf("%d model requests but %d responses: %s", len(requests), len(responses), eventTypes(events))
	}
	for k := range requests {
		if requests[k] > responses[k] || (k+1 < len(requests) && responses[k] > requests[k+1]) {
			tb.Errorf("model call %d: request at seq %d, response at seq %d, next request after it; want them in turn",
				k+1, requests[k]+1, responses[k]+1)
		}
	}
	for i, e := range events {
		if e.Type != belay.EventToolCall && e.Type != belay.EventToolResult {
			continue
		}
		var tc toolCall
		if err := json.Unmarshal(e.Data, &tc); err != nil || tc.Step < 1 || tc.Step > len(responses) {
			tb.Errorf("%s at seq %d has step %d; want one of the %d model calls", e.Type, e.Seq, tc.Step, len(responses))
			continue
		}
		if i < responses[tc.Step-1] || (tc.Step < len(requests) && i > requests[tc.Step]) {
			tb.Errorf("%s of step %d is at seq %d: not between model.response %d (seq %d) and the next model.request; log: %s",
				e.Type, tc.Step, e.Seq, tc.Step, responses[tc.Step-1]+1, eventTypes(events))
		}
	}
}

// applyAndTest checks the patch against a fresh copy of the uploaded
// tree: pytest fails there first, the patch applies cleanly (git apply
// --check, then git apply), and pytest passes after.
func applyAndTest(tb testing.TB, files []belay.File, patch []byte) {
	tb.Helper()
	dir := tb.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.Content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	patchFile := filepath.Join(tb.TempDir(), "patch.diff")
	if err := os.WriteFile(patchFile, patch, 0o600); err != nil {
		tb.Fatal(err)
	}
	run := func(argv ...string) (int, string) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return ee.ExitCode(), string(out)
		case err != nil:
			tb.Fatalf("%v: %v", argv, err)
		}
		return 0, string(out)
	}
	pytest := []string{"/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"}
	if code, out := run(pytest...); code == 0 {
		tb.Fatalf("pytest passes on the original tree, so it proves nothing:\n%s", out)
	}
	if code, out := run("git", "apply", "--check", patchFile); code != 0 {
		tb.Fatalf("git apply --check: exit code %d\n%s\npatch:\n%s", code, out, patch)
	}
	if code, out := run("git", "apply", patchFile); code != 0 {
		tb.Fatalf("git apply: exit code %d\n%s", code, out)
	}
	if code, out := run(pytest...); code != 0 {
		tb.Fatalf("pytest fails on the patched tree: exit code %d\n%s\npatch:\n%s", code, out, patch)
	}
}

// noResumes turns resumes off: a lost sandbox fails its run.
func noResumes(c *embedded.Config) {
	zero := 0
	c.MaxResumes = &zero
}
