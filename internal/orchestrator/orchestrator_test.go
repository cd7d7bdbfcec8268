package orchestrator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localdir"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/token"
)

const testModel = "test-model-1"

// clock is the orchestrator's fixed clock: expiries are exact, and the
// wall time still runs on real timers.
var clock = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

func testRequest(tb testing.TB, wallTimeSeconds int) belay.RunRequest {
	tb.Helper()
	req, err := belay.DefaultLimits(testModel).Validate(belay.RunRequest{
		Instruction: "Fix the failing test in calc.py",
		Files: []belay.File{
			{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"},
			{Path: "tests/test_calc.py", Content: "import calc\n\ndef test_add():\n    assert calc.add(1, 2) == 3\n"},
		},
		AllowedPaths:    []string{"calc.py"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        5,
		WallTimeSeconds: wallTimeSeconds,
	})
	if err != nil {
		tb.Fatalf("Validate: %v", err)
	}
	return req
}

const goodPatch = `diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
`

// bundleFiles is a sandbox's output: result.json for the bundle, the patch
// and a transcript.
func bundleFiles(tb testing.TB, b belay.ResultBundle, patch string) map[string][]byte {
	tb.Helper()
	raw, err := json.Marshal(b)
	if err != nil {
		tb.Fatalf("marshal bundle: %v", err)
	}
	return map[string][]byte{
		"result.json":      raw,
		"patch.diff":       []byte(patch),
		"transcript.jsonl": []byte(`{"type":"model.response","step":1}` + "\n"),
	}
}

func completedBundle(runID string) belay.ResultBundle {
	return belay.ResultBundle{
		Version:      belay.ResultBundleVersion,
		RunID:        runID,
		Status:       belay.StatusCompleted,
		Summary:      "Fixed add.",
		ChangedFiles: []string{"calc.py"},
		Checks: []belay.CheckResult{
			{Argv: []string{"python3", "-m", "pytest", "-q"}, ExitCode: 0, DurationMs: 420, OutputTail: "1 passed in 0.01s"},
		},
		Usage:      belay.BundleUsage{ModelRequests: 2},
		BaseCommit: strings.Repeat("a", 40),
		HeadCommit: strings.Repeat("b", 40),
	}
}

// script is what a sandbox double does once launched. It runs in its own
// goroutine; its exit ends the sandbox, and sb.stopped closes on Stop.
type script func(sb *fakeSandbox) belay.SandboxExit

// plan is how the double answers one run's Launch.
type plan struct {
	script      script
	launchErr   error
	panicInWait bool  // Wait panics, quoting the run's model token
	waitErr     error // Wait fails on its own (the sandbox is lost)
}

// fakeLauncher is the Launcher test double: it plays a scripted sandbox per
// run. The real local launcher is tested end to end in its own package.
type fakeLauncher struct {
	h        *harness
	mu       sync.Mutex
	plans    map[string]plan
	launched map[string]*fakeSandbox
	launches atomic.Int32
	onLaunch chan *fakeSandbox
}

func (l *fakeLauncher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	l.launches.Add(1)
	l.mu.Lock()
	p, ok := l.plans[spec.RunID]
	l.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("sandbox double: no plan for run %s", spec.RunID)
	}
	if p.launchErr != nil {
		return nil, p.launchErr
	}
	ws, err := os.MkdirTemp(l.h.workspaces, spec.RunID+"-")
	if err != nil {
		return nil, err
	}
	sb := &fakeSandbox{
		h: l.h, spec: spec, plan: p, workspace: ws,
		stopped: make(chan struct{}), exited: make(chan struct{}), waitCut: make(chan struct{}),
	}
	l.mu.Lock()
	l.launched[spec.RunID] = sb
	l.mu.Unlock()
	if p.script != nil {
		go func() {
			sb.exit = p.script(sb)
			close(sb.exited)
		}()
	}
	select {
	case l.onLaunch <- sb:
	default:
	}
	return sb, nil
}

func (l *fakeLauncher) sandbox(runID string) *fakeSandbox {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.launched[runID]
}

// fakeSandbox is one scripted sandbox. Its workspace is a real folder, so
// Cleanup is seen to remove it.
type fakeSandbox struct {
	h         *harness
	spec      belay.SandboxSpec
	plan      plan
	workspace string

	stopOnce sync.Once
	stopped  chan struct{}
	exited   chan struct{}
	exit     belay.SandboxExit
	// waitCut closes when a Wait first returns because its context ended
	// (the wall time, a cancel, a shutdown).
	waitCutOnce sync.Once
	waitCut     chan struct{}

	stops    atomic.Int32
	cleanups atomic.Int32
}

func (s *fakeSandbox) Wait(ctx context.Context) (belay.SandboxExit, error) {
	if s.plan.panicInWait {
		panic("sandbox double: scripted panic holding " + s.spec.Tokens.Model)
	}
	if s.plan.waitErr != nil {
		return belay.SandboxExit{}, s.plan.waitErr
	}
	select {
	case <-s.exited:
		return s.exit, nil
	case <-ctx.Done():
		s.waitCutOnce.Do(func() { close(s.waitCut) })
		return belay.SandboxExit{}, ctx.Err()
	}
}

func (s *fakeSandbox) Stop(context.Context) error {
	s.stops.Add(1)
	s.stopOnce.Do(func() { close(s.stopped) })
	return nil
}

func (s *fakeSandbox) Cleanup() error {
	s.cleanups.Add(1)
	return os.RemoveAll(s.workspace)
}

// upload does what the sandbox entry does at its end: it puts files in the
// artifact store under the names staged for its attempt, as the outputs
// route would, and returns exit.
func (s *fakeSandbox) upload(exit belay.SandboxExit, files map[string][]byte) belay.SandboxExit {
	for name, b := range files {
		if err := s.h.artifacts.PutArtifact(context.Background(), s.spec.RunID, belay.StagedOutputName(s.spec.Attempt, name), b); err != nil {
			s.h.t.Errorf("sandbox double: upload %s: %v", name, err)
		}
	}
	return exit
}

// The scripts.

// exitWith leaves files and exits with code.
func exitWith(code int, files func(tb testing.TB, runID string) map[string][]byte) script {
	return func(sb *fakeSandbox) belay.SandboxExit {
		return sb.upload(belay.SandboxExit{ExitCode: code}, files(sb.h.t, sb.spec.RunID))
	}
}

// blockUntilStopped runs until stopped, then dies by signal leaving files.
func blockUntilStopped(files map[string][]byte) script {
	return func(sb *fakeSandbox) belay.SandboxExit {
		<-sb.stopped
		return sb.upload(belay.SandboxExit{ExitCode: -1, Signaled: true}, files)
	}
}

// harness is one orchestrator on a real SQLite store and a real artifact
// folder, with the sandbox double and a captured log.
type harness struct {
	t          testing.TB
	store      *sqlite.Store
	artifacts  *localdir.Store
	signer     *token.Signer
	launcher   *fakeLauncher
	orch       *orchestrator.Orchestrator
	logs       *syncBuffer
	workspaces string
}

type harnessOption func(*orchestrator.Config)

func newHarness(tb testing.TB, opts ...harnessOption) *harness {
	tb.Helper()
	dir := tb.TempDir()
	store, err := sqlite.Open(tb.Context(), filepath.Join(dir, "belay.db"), sqlite.Options{})
	if err != nil {
		tb.Fatalf("sqlite.Open: %v", err)
	}
	tb.Cleanup(func() { store.Close() })
	arts, err := localdir.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		tb.Fatalf("localdir.New: %v", err)
	}
	tb.Cleanup(func() { arts.Close() })
	signer, err := token.NewSigner(bytes.Repeat([]byte("k"), 32), nil)
	if err != nil {
		tb.Fatalf("NewSigner: %v", err)
	}
	h := &harness{
		t: tb, store: store, artifacts: arts, signer: signer,
		logs: &syncBuffer{}, workspaces: filepath.Join(dir, "workspaces"),
	}
	if err := os.Mkdir(h.workspaces, 0o700); err != nil {
		tb.Fatal(err)
	}
	h.launcher = &fakeLauncher{
		h: h, plans: map[string]plan{}, launched: map[string]*fakeSandbox{},
		onLaunch: make(chan *fakeSandbox, 16),
	}
	cfg := orchestrator.Config{
		Store: store, Artifacts: arts, Launcher: h.launcher, Signer: signer,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:    func() time.Time { return clock },
	}
	for _, o := range opts {
		o(&cfg)
	}
	h.orch, err = orchestrator.New(cfg)
	if err != nil {
		tb.Fatalf("orchestrator.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := h.orch.Close(context.Background()); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return h
}

// createRun stores a queued run with plan p for its sandbox.
func (h *harness) createRun(tb testing.TB, id string, req belay.RunRequest, p plan) {
	tb.Helper()
	h.launcher.mu.Lock()
	h.launcher.plans[id] = p
	h.launcher.mu.Unlock()
	_, created, err := h.store.CreateRun(tb.Context(), belay.Run{
		ID: id, Status: belay.StatusQueued, Request: req, RequestHash: belay.RequestHash(req),
		CreatedAt: clock.Add(-time.Minute), Usage: belay.Usage{MaxRequests: req.MaxRequests()},
	}, "")
	if err != nil || !created {
		tb.Fatalf("CreateRun(%s) = %v, %v", id, created, err)
	}
}

// waitTerminal polls the store until the run is terminal. The bound only
// keeps a broken orchestrator from hanging the test.
func (h *harness) waitTerminal(tb testing.TB, id string) belay.Run {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		run, err := h.store.GetRun(tb.Context(), id)
		if err != nil {
			tb.Fatalf("GetRun(%s): %v", id, err)
		}
		if run.Status.Terminal() {
			return run
		}
		if time.Now().After(deadline) {
			tb.Fatalf("run %s is still %s", id, run.Status)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// settle waits until the run is terminal and its goroutine has finished
// (Close waits for it), and returns the stored run.
func (h *harness) settle(tb testing.TB, id string) belay.Run {
	tb.Helper()
	h.waitTerminal(tb, id)
	if err := h.orch.Close(tb.Context()); err != nil {
		tb.Fatalf("Close: %v", err)
	}
	run, err := h.store.GetRun(tb.Context(), id)
	if err != nil {
		tb.Fatalf("GetRun(%s): %v", id, err)
	}
	return run
}

func (h *harness) waitLaunched(tb testing.TB) *fakeSandbox {
	tb.Helper()
	select {
	case sb := <-h.launcher.onLaunch:
		return sb
	case <-time.After(20 * time.Second):
		tb.Fatal("no sandbox was launched")
		return nil
	}
}

func (h *harness) events(tb testing.TB, id string) []belay.Event {
	tb.Helper()
	page, err := h.store.ListEvents(tb.Context(), id, 0, 1000)
	if err != nil {
		tb.Fatalf("ListEvents(%s): %v", id, err)
	}
	return page.Events
}

// assertEnded checks what every ended run must show: the capability is
// revoked (a model call now answers inactive), the log ends with the one
// terminal event matching the state, and a launched sandbox was stopped and
// its workspace removed.
func (h *harness) assertEnded(tb testing.TB, run belay.Run) {
	tb.Helper()
	ctx := tb.Context()
	res, err := h.store.ConsumeModelRequest(ctx, run.ID, testModel, clock)
	if err != nil {
		tb.Fatalf("ConsumeModelRequest: %v", err)
	}
	if res.Outcome != belay.ConsumeInactive {
		tb.Errorf("after the run: ConsumeModelRequest = %q, want inactive", res.Outcome)
	}
	if c, err := h.store.GetCapability(ctx, run.ID); err == nil && c.State != belay.CapabilityRevoked {
		tb.Errorf("capability state = %q, want revoked", c.State)
	}

	evs := h.events(tb, run.ID)
	var terminal []string
	for _, e := range evs {
		if belay.IsTerminalEvent(e.Type) {
			terminal = append(terminal, e.Type)
		}
	}
	if want := belay.TerminalEventType(run.Status); len(terminal) != 1 || terminal[0] != want || evs[len(evs)-1].Type != want {
		tb.Errorf("terminal events %v (last %q), want exactly one %q at the end", terminal, evs[len(evs)-1].Type, want)
	}
	var data struct {
		Reason   string `json:"reason"`
		ExitCode *int   `json:"exitCode"`
	}
	if err := json.Unmarshal(evs[len(evs)-1].Data, &data); err != nil {
		tb.Errorf("terminal event data %s: %v", evs[len(evs)-1].Data, err)
	}
	if data.Reason != run.Reason || !equalIntPtr(data.ExitCode, run.ExitCode) {
		tb.Errorf("terminal event data %s, want reason %q and exit code %v", evs[len(evs)-1].Data, run.Reason, ptrString(run.ExitCode))
	}

	if sb := h.launcher.sandbox(run.ID); sb != nil {
		if sb.stops.Load() == 0 {
			tb.Errorf("sandbox of %s was never stopped", run.ID)
		}
		if sb.cleanups.Load() == 0 {
			tb.Errorf("sandbox of %s was never cleaned up", run.ID)
		}
		if _, err := os.Stat(sb.workspace); !errors.Is(err, os.ErrNotExist) {
			tb.Errorf("workspace of %s still exists (stat: %v)", run.ID, err)
		}
	}
	h.assertNoTokens(tb, run.ID)
}

// assertNoTokens checks that none of the run's tokens reached the log, the
// events or the artifacts.
func (h *harness) assertNoTokens(tb testing.TB, runID string) {
	tb.Helper()
	sb := h.launcher.sandbox(runID)
	if sb == nil {
		return
	}
	toks := []string{sb.spec.Tokens.Model, sb.spec.Tokens.Events, sb.spec.Tokens.Approvals, sb.spec.Claim.Reveal()}
	logs := h.logs.String()
	var evs bytes.Buffer
	for _, e := range h.events(tb, runID) {
		evs.Write(e.Data)
	}
	arts := map[string][]byte{}
	for _, name := range belay.ArtifactNames {
		if b, err := h.artifacts.GetArtifact(tb.Context(), runID, name); err == nil {
			arts[name] = b
		}
	}
	for _, tok := range toks {
		if tok == "" {
			tb.Fatalf("run %s: the sandbox got an empty token", runID)
		}
		if strings.Contains(logs, tok) {
			tb.Errorf("run %s: a token is in the log", runID)
		}
		if strings.Contains(evs.String(), tok) {
			tb.Errorf("run %s: a token is in the events", runID)
		}
		for name, b := range arts {
			if bytes.Contains(b, []byte(tok)) {
				tb.Errorf("run %s: a token is in artifact %s", runID, name)
			}
		}
	}
}

func equalIntPtr(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func ptrString(p *int) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

func intPtr(n int) *int { return &n }

// syncBuffer is a log sink safe for the orchestrator's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestHappyPath(t *testing.T) {
	h := newHarness(t)
	const id = "run-happy"
	req := testRequest(t, 60)

	type seen struct {
		consume belay.ConsumeResult
		cap     belay.Capability
		claim   belay.Claim
		err     error
	}
	during := make(chan seen, 1)
	h.createRun(t, id, req, plan{script: func(sb *fakeSandbox) belay.SandboxExit {
		// While the sandbox runs, its capability answers model calls, and
		// its claim code is good once, within belay.ClaimTTL.
		var s seen
		s.consume, s.err = h.store.ConsumeModelRequest(context.Background(), id, testModel, clock)
		if s.err == nil {
			s.cap, s.err = h.store.GetCapability(context.Background(), id)
		}
		if hash, ok := belay.HashClaimCode(sb.spec.Claim.Reveal()); s.err == nil && ok {
			s.claim, s.err = h.store.ConsumeClaim(context.Background(), hash, id, clock.Add(belay.ClaimTTL-time.Second))
		}
		during <- s
		files := bundleFiles(h.t, completedBundle(id), goodPatch)
		// An agent that leaked its model token into the transcript: the
		// control plane must not publish it.
		files["transcript.jsonl"] = append(files["transcript.jsonl"], `{"leak":"`+sb.spec.Tokens.Model+`"}`+"\n"...)
		return sb.upload(belay.SandboxExit{ExitCode: 0}, files)
	}})

	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("second Submit: %v", err)
	}
	run := h.settle(t, id)

	if run.Status != belay.StatusCompleted || run.Reason != "" || !equalIntPtr(run.ExitCode, intPtr(0)) {
		t.Fatalf("run = %s reason %q exit %s, want completed, no reason, exit 0", run.Status, run.Reason, ptrString(run.ExitCode))
	}
	if n := h.launcher.launches.Load(); n != 1 {
		t.Errorf("%d launches, want 1 (Submit twice starts one sandbox)", n)
	}
	wantChecks := completedBundle(id).Checks
	if len(run.Checks) != 1 || !slices.Equal(run.Checks[0].Argv, wantChecks[0].Argv) || run.Checks[0].OutputTail != wantChecks[0].OutputTail {
		t.Errorf("checks = %+v, want %+v", run.Checks, wantChecks)
	}
	if !slices.Equal(run.ChangedFiles, []string{"calc.py"}) {
		t.Errorf("changedFiles = %v, want [calc.py]", run.ChangedFiles)
	}
	if !slices.Equal(run.Artifacts, belay.ArtifactNames) {
		t.Errorf("artifacts = %v, want %v", run.Artifacts, belay.ArtifactNames)
	}
	patch, err := h.artifacts.GetArtifact(t.Context(), id, "patch.diff")
	if err != nil || string(patch) != goodPatch {
		t.Errorf("patch.diff artifact = %q, %v; want the sandbox's patch", patch, err)
	}
	transcript, err := h.artifacts.GetArtifact(t.Context(), id, "transcript.jsonl")
	if err != nil || !bytes.Contains(transcript, []byte(`{"leak":"[redacted]"}`)) {
		// Not printed: it may hold the token.
		t.Errorf("transcript artifact (%d bytes, err %v) does not hold the leaked token redacted", len(transcript), err)
	}

	s := <-during
	if s.err != nil {
		t.Fatalf("during the run: %v", s.err)
	}
	if s.claim.RunID != id || s.claim.Attempt != 1 || !s.claim.ExpiresAt.Equal(clock.Add(belay.ClaimTTL)) {
		t.Errorf("during the run: claim = %+v, want run %s attempt 1 expiring %v", s.claim, id, clock.Add(belay.ClaimTTL))
	}
	if s.consume.Outcome != belay.ConsumeOK || s.consume.Remaining != req.MaxRequests()-1 {
		t.Errorf("during the run: consume = %+v, want ok with %d left", s.consume, req.MaxRequests()-1)
	}
	wantExpiry := clock.Add(60*time.Second + orchestrator.DefaultTokenGrace)
	if !s.cap.ExpiresAt.Equal(wantExpiry) || s.cap.MaxRequests != req.MaxRequests() || s.cap.Model != testModel {
		t.Errorf("capability = %+v, want model %s, %d requests, expiring %v", s.cap, testModel, req.MaxRequests(), wantExpiry)
	}

	// The sandbox got three working tokens, one per audience, and a spec
	// for its run.
	sb := h.launcher.sandbox(id)
	if sb.spec.RunID != id || sb.spec.Instruction != req.Instruction || !slices.Equal(sb.spec.AllowedPaths, req.AllowedPaths) {
		t.Errorf("spec names run %q, instruction %q, allowedPaths %v; want the run's", sb.spec.RunID, sb.spec.Instruction, sb.spec.AllowedPaths)
	}
	for aud, tok := range map[token.Audience]string{
		token.AudienceModel: sb.spec.Tokens.Model, token.AudienceEvents: sb.spec.Tokens.Events, token.AudienceApprovals: sb.spec.Tokens.Approvals,
	} {
		if _, err := h.signer.Verify(tok, token.Expect{Audience: aud, RunID: id, Model: testModel}); err != nil {
			t.Errorf("%s token: %v", aud, err)
		}
	}
	// And a claim code for its attempt, good once, for a launcher that
	// starts the entry in claim mode.
	if sb.spec.Attempt != 1 || run.Attempt != 1 {
		t.Errorf("spec attempt %d, run attempt %d; want 1", sb.spec.Attempt, run.Attempt)
	}
	hash, _ := belay.HashClaimCode(sb.spec.Claim.Reveal())
	if _, err := h.store.ConsumeClaim(t.Context(), hash, id, clock.Add(time.Second)); !belay.IsCode(err, belay.CodeUnauthorized) {
		t.Errorf("a second ConsumeClaim = %v, want unauthorized", err)
	}

	var types []string
	evs := h.events(t, id)
	for _, e := range evs {
		types = append(types, e.Type+"/"+e.Source)
	}
	// The final check is the control plane's own event, from the bundle
	// it validated, right before the terminal one.
	if want := []string{"run.queued/control", "run.started/control", "check.finished/control", "run.completed/control"}; !slices.Equal(types, want) {
		t.Errorf("events = %v, want %v", types, want)
	}
	if len(evs) == 4 {
		var fc orchestrator.FinalCheck
		if err := json.Unmarshal(evs[2].Data, &fc); err != nil || !fc.Final || fc.ExitCode != 0 || fc.DurationMs != 420 ||
			!slices.Equal(fc.Argv, []string{"python3", "-m", "pytest", "-q"}) {
			t.Errorf("final check event %s (%v), want the bundle's check, final", evs[2].Data, err)
		}
	}
	h.assertEnded(t, run)
	if !strings.Contains(h.logs.String(), `"msg":"run finished","run_id":"`+id+`"`) {
		t.Errorf("log has no \"run finished\" line with run_id:\n%s", h.logs.String())
	}
}

func TestRunOutcomes(t *testing.T) {
	failedBundle := func(tb testing.TB, runID string) map[string][]byte {
		b := completedBundle(runID)
		b.Status, b.ExitCode, b.Reason = belay.StatusFailed, 1, "checks failed"
		b.Checks[0].ExitCode = 1
		return bundleFiles(tb, b, goodPatch)
	}
	outsideAllowed := func(tb testing.TB, runID string) map[string][]byte {
		b := completedBundle(runID)
		b.ChangedFiles = []string{"tests/test_calc.py"}
		return bundleFiles(tb, b, strings.ReplaceAll(goodPatch, "calc.py", "tests/test_calc.py"))
	}
	good := func(tb testing.TB, runID string) map[string][]byte {
		return bundleFiles(tb, completedBundle(runID), goodPatch)
	}
	onlyTranscript := func(tb testing.TB, runID string) map[string][]byte {
		return map[string][]byte{"transcript.jsonl": []byte(`{"step":1}` + "\n")}
	}

	tests := []struct {
		name       string
		wallTime   int
		plan       plan
		preActive  bool // the run already has a capability, so activation fails
		status     belay.RunStatus
		reason     string // exact, or a prefix when it ends in "..."
		exitCode   *int
		checks     int
		artifacts  []string
		noLaunched bool
	}{
		{name: "failing check", plan: plan{script: exitWith(1, failedBundle)},
			status: belay.StatusFailed, reason: "checks failed", exitCode: intPtr(1), checks: 1, artifacts: belay.ArtifactNames},
		{name: "bundle claims a file outside allowedPaths", plan: plan{script: exitWith(0, outsideAllowed)},
			status: belay.StatusFailed, reason: `result validation: result.json: changedFiles[0]: path "tests/test_calc.py" is outside allowedPaths`,
			artifacts: belay.ArtifactNames},
		{name: "no result", plan: plan{script: exitWith(0, onlyTranscript)},
			status: belay.StatusFailed, reason: "result validation: result.json: is missing...", artifacts: []string{"transcript.jsonl"}},
		{name: "crash without a bundle", plan: plan{script: exitWith(3, onlyTranscript)},
			status: belay.StatusFailed, reason: "sandbox exited with code 3", exitCode: intPtr(3), artifacts: []string{"transcript.jsonl"}},
		{name: "completed bundle from a crashed sandbox", plan: plan{script: exitWith(2, good)},
			status: belay.StatusFailed, reason: "sandbox exited with code 2", exitCode: intPtr(2), artifacts: belay.ArtifactNames},
		{name: "killed mid-run", plan: plan{script: func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: -1, Signaled: true}, onlyTranscript(sb.h.t, sb.spec.RunID))
		}}, status: belay.StatusFailed, reason: orchestrator.ReasonKilled, artifacts: []string{"transcript.jsonl"}},
		{name: "killed at the memory limit", plan: plan{script: func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: 137, Signaled: true, OOMKilled: true}, onlyTranscript(sb.h.t, sb.spec.RunID))
		}}, status: belay.StatusFailed, reason: orchestrator.ReasonOutOfMemory, artifacts: []string{"transcript.jsonl"}},
		{name: "a check killed at the memory limit", plan: plan{script: func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: 0, OOMKilled: true}, failedBundle(sb.h.t, sb.spec.RunID))
		}}, status: belay.StatusFailed, reason: orchestrator.ReasonOutOfMemory, exitCode: intPtr(1), checks: 1, artifacts: belay.ArtifactNames},
		{name: "crashed after an OOM kill", plan: plan{script: func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: 2, OOMKilled: true}, onlyTranscript(sb.h.t, sb.spec.RunID))
		}}, status: belay.StatusFailed, reason: orchestrator.ReasonOutOfMemory, exitCode: intPtr(2), artifacts: []string{"transcript.jsonl"}},
		{name: "completed despite an OOM kill it recovered from", plan: plan{script: func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: 0, OOMKilled: true}, good(sb.h.t, sb.spec.RunID))
		}}, status: belay.StatusCompleted, exitCode: intPtr(0), checks: 1, artifacts: belay.ArtifactNames},
		{name: "wall time exceeded", wallTime: 1, plan: plan{script: blockUntilStopped(map[string][]byte{"transcript.jsonl": []byte("{}\n")})},
			status: belay.StatusFailed, reason: orchestrator.ReasonTimeout, artifacts: []string{"transcript.jsonl"}},
		{name: "sandbox panics", plan: plan{panicInWait: true},
			status: belay.StatusFailed, reason: orchestrator.ReasonInternal},
		{name: "sandbox lost", plan: plan{waitErr: errors.New("task vanished")},
			status: belay.StatusFailed, reason: orchestrator.ReasonLost},
		{name: "launch fails", plan: plan{launchErr: errors.New("no capacity")},
			status: belay.StatusFailed, reason: orchestrator.ReasonLaunch, noLaunched: true},
		{name: "activation fails", preActive: true, plan: plan{script: exitWith(0, good)},
			status: belay.StatusFailed, reason: orchestrator.ReasonActivation, noLaunched: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			id := "run-" + strings.ReplaceAll(tt.name, " ", "-")
			h.createRun(t, id, testRequest(t, cmpOr(tt.wallTime, 60)), tt.plan)
			if tt.preActive {
				if err := h.store.ActivateCapability(t.Context(), belay.Capability{
					RunID: id, Model: testModel, State: belay.CapabilityActive, ExpiresAt: clock.Add(time.Hour), MaxRequests: 1,
				}); err != nil {
					t.Fatalf("ActivateCapability: %v", err)
				}
			}
			if err := h.orch.Submit(t.Context(), id); err != nil {
				t.Fatalf("Submit: %v", err)
			}
			run := h.settle(t, id)

			if run.Status != tt.status {
				t.Errorf("status = %s, want %s", run.Status, tt.status)
			}
			if p, ok := strings.CutSuffix(tt.reason, "..."); ok {
				if !strings.HasPrefix(run.Reason, p) {
					t.Errorf("reason = %q, want it to start %q", run.Reason, p)
				}
			} else if run.Reason != tt.reason {
				t.Errorf("reason = %q, want %q", run.Reason, tt.reason)
			}
			if !equalIntPtr(run.ExitCode, tt.exitCode) {
				t.Errorf("exit code = %s, want %s", ptrString(run.ExitCode), ptrString(tt.exitCode))
			}
			if len(run.Checks) != tt.checks {
				t.Errorf("checks = %+v, want %d", run.Checks, tt.checks)
			}
			if tt.checks == 0 && len(run.ChangedFiles) != 0 {
				t.Errorf("changedFiles = %v recorded from a bundle that was not believed", run.ChangedFiles)
			}
			if !slices.Equal(run.Artifacts, tt.artifacts) {
				t.Errorf("artifacts = %v, want %v", run.Artifacts, tt.artifacts)
			}
			if launched := h.launcher.sandbox(id) != nil; launched == tt.noLaunched {
				t.Errorf("sandbox launched = %v, want %v", launched, !tt.noLaunched)
			}
			h.assertEnded(t, run)
		})
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func TestCancelWhileRunning(t *testing.T) {
	h := newHarness(t)
	const id = "run-cancel-running"
	// On Stop the sandbox still leaves a completed bundle behind: a late
	// completion that must not win over the cancel.
	h.createRun(t, id, testRequest(t, 60), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
		<-sb.stopped
		return sb.upload(belay.SandboxExit{ExitCode: 0}, bundleFiles(sb.h.t, completedBundle(id), goodPatch))
	}})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	sb := h.waitLaunched(t)
	if res, err := h.store.ConsumeModelRequest(t.Context(), id, testModel, clock); err != nil || res.Outcome != belay.ConsumeOK {
		t.Fatalf("before cancel: consume = %+v, %v; want ok", res, err)
	}

	start := time.Now()
	if err := h.orch.Cancel(t.Context(), id); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	// Model calls fail from the moment Cancel returns.
	if res, err := h.store.ConsumeModelRequest(t.Context(), id, testModel, clock); err != nil || res.Outcome != belay.ConsumeInactive {
		t.Errorf("right after Cancel: consume = %+v, %v; want inactive", res, err)
	}
	if sb.stops.Load() == 0 {
		t.Error("Cancel returned before stopping the sandbox")
	}
	h.waitTerminal(t, id)
	t.Logf("cancelled %v after the request", time.Since(start))
	run := h.settle(t, id)
	if run.Status != belay.StatusCancelled || run.Reason != orchestrator.ReasonCancelled {
		t.Fatalf("run = %s (%q), want cancelled", run.Status, run.Reason)
	}
	if len(run.Checks) != 0 || len(run.ChangedFiles) != 0 {
		t.Errorf("a cancelled run recorded the late bundle's checks %v and files %v", run.Checks, run.ChangedFiles)
	}
	h.assertEnded(t, run)

	// Cancel is idempotent, also once the run is over.
	if err := h.orch.Cancel(t.Context(), id); err != nil {
		t.Errorf("Cancel of a cancelled run: %v", err)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	h := newHarness(t)
	const id = "run-cancel-queued"
	h.createRun(t, id, testRequest(t, 60), plan{script: exitWith(0, func(tb testing.TB, runID string) map[string][]byte {
		return bundleFiles(tb, completedBundle(runID), goodPatch)
	})})
	if err := h.orch.Cancel(t.Context(), id); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	run, err := h.store.GetRun(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != belay.StatusCancelled {
		t.Fatalf("right after Cancel: run is %s, want cancelled", run.Status)
	}
	// A Submit that comes late starts nothing.
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	run = h.settle(t, id)
	if run.Status != belay.StatusCancelled {
		t.Errorf("run is %s, want cancelled", run.Status)
	}
	if n := h.launcher.launches.Load(); n != 0 {
		t.Errorf("%d sandboxes launched for a cancelled run", n)
	}
	h.assertEnded(t, run)

	if err := h.orch.Cancel(t.Context(), "run-unknown"); !belay.IsCode(err, belay.CodeNotFound) {
		t.Errorf("Cancel of an unknown run = %v, want not_found", err)
	}
}

// TestLateCompletionAfterCancel finishes a sandbox with a completed bundle
// after the run's cancel was recorded by someone else: the cancel stands.
func TestLateCompletionAfterCancel(t *testing.T) {
	tests := []struct {
		name   string
		cancel func(tb testing.TB, h *harness, id string)
	}{
		{"cancel requested", func(tb testing.TB, h *harness, id string) {
			// What the API does when the orchestrator's Cancel never arrives.
			if _, err := h.store.RequestCancel(tb.Context(), id, clock); err != nil {
				tb.Fatalf("RequestCancel: %v", err)
			}
		}},
		{"already cancelled", func(tb testing.TB, h *harness, id string) {
			if _, err := h.store.Transition(tb.Context(), id, belay.Transition{
				To: belay.StatusCancelled, At: clock, Reason: "cancelled elsewhere",
				Events: []belay.EventInput{{Type: belay.EventRunCancelled, Data: json.RawMessage(`{"reason":"cancelled elsewhere"}`)}},
			}); err != nil {
				tb.Fatalf("Transition: %v", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			id := "run-late-" + strings.ReplaceAll(tt.name, " ", "-")
			release := make(chan struct{})
			h.createRun(t, id, testRequest(t, 60), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
				<-release
				return sb.upload(belay.SandboxExit{ExitCode: 0}, bundleFiles(sb.h.t, completedBundle(id), goodPatch))
			}})
			if err := h.orch.Submit(t.Context(), id); err != nil {
				t.Fatalf("Submit: %v", err)
			}
			h.waitLaunched(t)
			tt.cancel(t, h, id)
			close(release)
			run := h.settle(t, id)
			if run.Status != belay.StatusCancelled {
				t.Fatalf("run = %s (%q), want cancelled", run.Status, run.Reason)
			}
			if len(run.ChangedFiles) != 0 || len(run.Checks) != 0 {
				t.Errorf("cancelled run took the late bundle's files %v and checks %v", run.ChangedFiles, run.Checks)
			}
			h.assertEnded(t, run)
		})
	}
}

func TestRecover(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	good := exitWith(0, func(tb testing.TB, runID string) map[string][]byte {
		return bundleFiles(tb, completedBundle(runID), goodPatch)
	})
	// A run a dead control plane left running, with its capability active.
	const orphan = "run-orphan"
	h.createRun(t, orphan, testRequest(t, 60), plan{script: good})
	if _, err := h.store.Transition(ctx, orphan, belay.Transition{
		To: belay.StatusRunning, At: clock, Events: []belay.EventInput{{Type: belay.EventRunStarted}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.store.ActivateCapability(ctx, belay.Capability{
		RunID: orphan, Model: testModel, State: belay.CapabilityActive, ExpiresAt: clock.Add(time.Hour), MaxRequests: 7,
	}); err != nil {
		t.Fatal(err)
	}
	// A run it left running whose cancel was requested, one it never
	// started, and one never started whose cancel was requested.
	const orphanCancelled, waiting, waitingCancelled = "run-orphan-cancelled", "run-waiting", "run-waiting-cancelled"
	h.createRun(t, orphanCancelled, testRequest(t, 60), plan{script: good})
	if _, err := h.store.Transition(ctx, orphanCancelled, belay.Transition{To: belay.StatusRunning, At: clock}); err != nil {
		t.Fatal(err)
	}
	h.createRun(t, waiting, testRequest(t, 60), plan{script: good})
	h.createRun(t, waitingCancelled, testRequest(t, 60), plan{script: good})
	for _, id := range []string{orphanCancelled, waitingCancelled} {
		if _, err := h.store.RequestCancel(ctx, id, clock); err != nil {
			t.Fatal(err)
		}
	}

	if err := h.orch.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	for _, id := range []string{orphan, orphanCancelled, waiting, waitingCancelled} {
		h.waitTerminal(t, id)
	}
	if err := h.orch.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status belay.RunStatus
		reason string
	}{
		orphan:           {belay.StatusFailed, orchestrator.ReasonInterrupted},
		orphanCancelled:  {belay.StatusCancelled, orchestrator.ReasonCancelled},
		waiting:          {belay.StatusCompleted, ""},
		waitingCancelled: {belay.StatusCancelled, orchestrator.ReasonCancelled},
	}
	for id, w := range want {
		run, err := h.store.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != w.status || run.Reason != w.reason {
			t.Errorf("%s = %s (%q), want %s (%q)", id, run.Status, run.Reason, w.status, w.reason)
		}
		h.assertEnded(t, run)
	}
	if n := h.launcher.launches.Load(); n != 1 {
		t.Errorf("%d launches, want 1 (only the waiting run)", n)
	}
}

func TestCloseWithRunInFlight(t *testing.T) {
	h := newHarness(t)
	const id = "run-shutdown"
	h.createRun(t, id, testRequest(t, 60), plan{script: blockUntilStopped(map[string][]byte{"transcript.jsonl": []byte("{}\n")})})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	h.waitLaunched(t)
	if err := h.orch.Close(t.Context()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Close has waited: the run is already written whole.
	run, err := h.store.GetRun(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != belay.StatusFailed || run.Reason != orchestrator.ReasonShutdown {
		t.Fatalf("after Close: run = %s (%q), want failed (%q)", run.Status, run.Reason, orchestrator.ReasonShutdown)
	}
	if !slices.Equal(run.Artifacts, []string{"transcript.jsonl"}) {
		t.Errorf("artifacts = %v, want the transcript the sandbox left", run.Artifacts)
	}
	h.assertEnded(t, run)

	const late = "run-after-close"
	h.createRun(t, late, testRequest(t, 60), plan{})
	if err := h.orch.Submit(t.Context(), late); !belay.IsCode(err, belay.CodeUnavailable) {
		t.Errorf("Submit after Close = %v, want unavailable", err)
	}
}

// TestStopGrace lets a sandbox past its wall time exit on its own within
// StopGrace: what it leaves is kept, it is not killed first, and the run
// still fails with reason timeout.
func TestStopGrace(t *testing.T) {
	h := newHarness(t, func(c *orchestrator.Config) { c.StopGrace = time.Minute })
	const id = "run-stop-grace"
	stopsAtExit := make(chan int32, 1)
	h.createRun(t, id, testRequest(t, 1), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
		<-sb.waitCut // the wall time is over: wind down
		stopsAtExit <- sb.stops.Load()
		return sb.upload(belay.SandboxExit{ExitCode: 1}, map[string][]byte{"transcript.jsonl": []byte(`{"step":"last"}` + "\n")})
	}})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	run := h.settle(t, id)
	if run.Status != belay.StatusFailed || run.Reason != orchestrator.ReasonTimeout {
		t.Fatalf("run = %s (%q), want failed (timeout)", run.Status, run.Reason)
	}
	if n := <-stopsAtExit; n != 0 {
		t.Errorf("the sandbox was stopped %d times before it could exit on its own", n)
	}
	if !slices.Equal(run.Artifacts, []string{"transcript.jsonl"}) {
		t.Errorf("artifacts = %v, want the transcript written during the grace", run.Artifacts)
	}
	h.assertEnded(t, run)
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	h := newHarness(t)
	full := orchestrator.Config{Store: h.store, Artifacts: h.artifacts, Launcher: h.launcher, Signer: h.signer}
	tests := []struct {
		name string
		edit func(*orchestrator.Config)
	}{
		{"no store", func(c *orchestrator.Config) { c.Store = nil }},
		{"no artifacts", func(c *orchestrator.Config) { c.Artifacts = nil }},
		{"no launcher", func(c *orchestrator.Config) { c.Launcher = nil }},
		{"no signer", func(c *orchestrator.Config) { c.Signer = nil }},
		{"negative token grace", func(c *orchestrator.Config) { c.TokenGrace = -time.Second }},
		{"negative stop grace", func(c *orchestrator.Config) { c.StopGrace = -time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := full
			tt.edit(&cfg)
			if _, err := orchestrator.New(cfg); err == nil {
				t.Error("New accepted the config")
			}
		})
	}
	if _, err := orchestrator.New(full); err != nil {
		t.Errorf("New(complete config): %v", err)
	}
}

// stuckSandbox is a sandbox whose processes cannot be reaped: Stop only
// ends with its context.
type stuckSandbox struct {
	stopBounded bool
	cleanups    int
}

func (s *stuckSandbox) Wait(ctx context.Context) (belay.SandboxExit, error) {
	<-ctx.Done()
	return belay.SandboxExit{}, ctx.Err()
}

func (s *stuckSandbox) Stop(ctx context.Context) error {
	_, s.stopBounded = ctx.Deadline()
	if !s.stopBounded {
		// An unbounded Stop would hang here for ever; fail instead of
		// hanging the test.
		return errors.New("stuck sandbox: Stop without a deadline would never return")
	}
	return fmt.Errorf("stuck sandbox: not reaped: %w", context.DeadlineExceeded)
}

func (s *stuckSandbox) Cleanup() error {
	s.cleanups++
	return nil
}

// TestCleanupBoundsStop: a sandbox that cannot be stopped still gets its
// Cleanup (its workspace removed) and its capability revoked, and the stop
// is bounded even when the caller's context is not.
func TestCleanupBoundsStop(t *testing.T) {
	h := newHarness(t)
	const id = "run-stuck"
	h.createRun(t, id, testRequest(t, 60), plan{})
	if err := h.store.ActivateCapability(t.Context(), belay.Capability{
		RunID: id, Model: testModel, State: belay.CapabilityActive, ExpiresAt: clock.Add(time.Hour), MaxRequests: 3,
	}); err != nil {
		t.Fatal(err)
	}
	sb := &stuckSandbox{}
	err := h.orch.Cleanup(context.Background(), id, sb)
	if !sb.stopBounded {
		t.Error("Cleanup called Stop with no deadline: a sandbox that is never reaped would hold it for ever")
	}
	if err == nil || !strings.Contains(err.Error(), "stop sandbox of run "+id) {
		t.Errorf("Cleanup = %v; want the stop failure reported", err)
	}
	if sb.cleanups != 1 {
		t.Errorf("sandbox Cleanup called %d times, want once even though Stop failed", sb.cleanups)
	}
	if res, err := h.store.ConsumeModelRequest(t.Context(), id, testModel, clock); err != nil || res.Outcome != belay.ConsumeInactive {
		t.Errorf("after Cleanup: consume = %+v, %v; want inactive", res, err)
	}
}
