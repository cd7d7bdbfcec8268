package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/orchestrator"
	"github.com/belay-dev/belay/internal/token"
)

// restart is a new orchestrator on h's store, artifacts and sandbox
// double, as the next start of belay serve has, with h's options.
func (h *harness) restart(tb testing.TB) *harness {
	tb.Helper()
	next := *h
	next.launcher = &fakeLauncher{h: &next, plans: h.launcher.plans, launched: map[string]*fakeSandbox{}, onLaunch: make(chan *fakeSandbox, 16)}
	cfg := h.cfg
	cfg.Launcher = next.launcher
	o, err := orchestrator.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	next.orch = o
	tb.Cleanup(func() { _ = o.Close(context.Background()) })
	return &next
}

// specLog records the spec of every launch, as the launcher got it.
type specLog struct {
	mu    sync.Mutex
	specs []belay.SandboxSpec
}

func (l *specLog) add(s belay.SandboxSpec) {
	l.mu.Lock()
	l.specs = append(l.specs, s)
	l.mu.Unlock()
}

func (l *specLog) all() []belay.SandboxSpec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]belay.SandboxSpec(nil), l.specs...)
}

// byAttempt plays one script per attempt (the last one again past the
// end), recording each launch's spec.
func byAttempt(log *specLog, scripts ...script) script {
	return func(sb *fakeSandbox) belay.SandboxExit {
		log.add(sb.spec)
		i := min(sb.spec.Attempt, len(scripts)) - 1
		return scripts[max(i, 0)](sb)
	}
}

// killed dies by a signal without a result, having spent one model
// request and saved a checkpoint of its attempt, as a sandbox that was
// killed mid-run has.
func killed(sb *fakeSandbox) belay.SandboxExit {
	ctx := context.Background()
	if res, err := sb.h.store.ConsumeModelRequest(ctx, sb.spec.RunID, testModel, clock); err != nil || res.Outcome != belay.ConsumeOK {
		sb.h.t.Errorf("sandbox double: consume in attempt %d = %+v, %v", sb.spec.Attempt, res, err)
	}
	run, err := sb.h.store.GetRun(ctx, sb.spec.RunID)
	if err != nil {
		sb.h.t.Errorf("sandbox double: %v", err)
		return belay.SandboxExit{Signaled: true, ExitCode: -1}
	}
	seq := int64(1)
	if run.Checkpoint != nil {
		seq = run.Checkpoint.Seq + 1
	}
	if _, err := sb.h.store.RecordCheckpoint(ctx, sb.spec.RunID, belay.CheckpointRef{
		Seq: seq, Attempt: sb.spec.Attempt, Step: int(seq), Pending: "shell", Size: 100, At: clock,
	}); err != nil {
		sb.h.t.Errorf("sandbox double: checkpoint: %v", err)
	}
	return belay.SandboxExit{Signaled: true, ExitCode: -1}
}

func completes(sb *fakeSandbox) belay.SandboxExit {
	return sb.upload(belay.SandboxExit{}, bundleFiles(sb.h.t, completedBundle(sb.spec.RunID), goodPatch))
}

// eventsOf returns the run's events of type typ, their data decoded into T.
func eventsOf[T any](tb testing.TB, h *harness, id, typ string) []T {
	tb.Helper()
	var out []T
	for _, e := range h.events(tb, id) {
		if e.Type != typ {
			continue
		}
		if e.Source != belay.SourceControl {
			tb.Errorf("%s event written as %q", typ, e.Source)
		}
		var d T
		if err := json.Unmarshal(e.Data, &d); err != nil {
			tb.Fatalf("%s data %s: %v", typ, e.Data, err)
		}
		out = append(out, d)
	}
	return out
}

// TestResumeAfterALostSandbox: a sandbox killed without a result is
// replaced by a new attempt of the same run, told how the one before was
// lost, with fresh tokens and claim, on the same capability (its budget
// spent so far kept) and the same checkpoint pointer; the run then
// completes from the new sandbox's bundle.
func TestResumeAfterALostSandbox(t *testing.T) {
	h := newHarness(t)
	const id = "run-resume"
	log := &specLog{}
	h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, killed, completes)})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	run := h.settle(t, id)
	if run.Status != belay.StatusCompleted || run.Attempt != 2 {
		t.Fatalf("run = %s (%q) at attempt %d, want completed at attempt 2", run.Status, run.Reason, run.Attempt)
	}
	if len(run.LostAttempts) != 1 || run.LostAttempts[0].Attempt != 1 || run.LostAttempts[0].Reason != orchestrator.ReasonKilled {
		t.Fatalf("lost attempts %+v, want attempt 1, %q", run.LostAttempts, orchestrator.ReasonKilled)
	}
	specs := log.all()
	if len(specs) != 2 {
		t.Fatalf("%d launches, want 2", len(specs))
	}
	first, second := specs[0], specs[1]
	if first.Attempt != 1 || first.Lost != nil || second.Attempt != 2 || second.Lost == nil || second.Lost.Reason != orchestrator.ReasonKilled {
		t.Fatalf("launches: attempt %d (lost %+v), attempt %d (lost %+v)", first.Attempt, first.Lost, second.Attempt, second.Lost)
	}
	if first.Claim.Reveal() == second.Claim.Reveal() || second.Claim.Reveal() == "" || second.Tokens.Model == "" {
		t.Error("the second attempt has no tokens, or reuses the first's claim code")
	}
	if _, err := h.signer.Verify(second.Tokens.Events, token.Expect{Audience: token.AudienceEvents, RunID: id, Model: testModel}); err != nil {
		t.Errorf("the second attempt's events token does not verify: %v", err)
	}
	// One capability for both attempts: what the first spent stays spent.
	c, err := h.store.GetCapability(t.Context(), id)
	if err != nil || c.UsedRequests != 1 || c.State != belay.CapabilityRevoked {
		t.Errorf("capability after the run = %+v, %v; want the first attempt's request spent, revoked", c, err)
	}
	lost := eventsOf[belay.SandboxLostData](t, h, id, belay.EventSandboxLost)
	resumed := eventsOf[belay.RunResumedData](t, h, id, belay.EventRunResumed)
	if len(lost) != 1 || lost[0].Attempt != 1 || lost[0].Reason != orchestrator.ReasonKilled || !lost[0].Signaled || !lost[0].Resumes {
		t.Errorf("sandbox.lost events %+v", lost)
	}
	if len(resumed) != 1 || resumed[0].Attempt != 2 || resumed[0].ResumesLeft != 1 || resumed[0].Checkpoint == nil ||
		resumed[0].Checkpoint.Seq != 1 || resumed[0].Checkpoint.Pending != "shell" {
		t.Errorf("run.resumed events %+v, want attempt 2 from checkpoint 1, one resume left", resumed)
	}
	types := []string{}
	for _, e := range h.events(t, id) {
		types = append(types, e.Type)
	}
	if want := []string{"run.queued", "run.started", "sandbox.lost", "run.resumed", "check.finished", "run.completed"}; !slices.Equal(types, want) {
		t.Errorf("events %v, want %v", types, want)
	}
	h.assertEnded(t, run)
	if sb := h.launcher.sandbox(id); sb == nil || sb.cleanups.Load() == 0 {
		t.Error("the last sandbox was not cleaned up")
	}
}

// TestResumeLimit: a sandbox lost on every attempt is replaced MaxResumes
// times; then the run fails with a reason naming the attempts, its
// capability revoked.
func TestResumeLimit(t *testing.T) {
	h := newHarness(t)
	const id = "run-always-killed"
	log := &specLog{}
	h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, killed)})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	run := h.settle(t, id)
	want := "sandbox killed on attempt 3; gave up after 3 attempts (2 resumes, the limit)"
	if run.Status != belay.StatusFailed || run.Reason != want || run.Attempt != 3 {
		t.Fatalf("run = %s (%q) at attempt %d, want failed (%q) at attempt 3", run.Status, run.Reason, run.Attempt, want)
	}
	if n := len(log.all()); n != 3 {
		t.Errorf("%d launches, want 3", n)
	}
	lost := eventsOf[belay.SandboxLostData](t, h, id, belay.EventSandboxLost)
	if len(lost) != 3 || !lost[0].Resumes || !lost[1].Resumes || lost[2].Resumes || lost[2].Attempt != 3 {
		t.Errorf("sandbox.lost events %+v, want three, the last not resumed", lost)
	}
	if n := len(eventsOf[belay.RunResumedData](t, h, id, belay.EventRunResumed)); n != 2 {
		t.Errorf("%d run.resumed events, want 2", n)
	}
	if c, err := h.store.GetCapability(t.Context(), id); err != nil || c.UsedRequests != 3 {
		t.Errorf("capability %+v, %v; want one budget, 3 requests spent over the attempts", c, err)
	}
	h.assertEnded(t, run)
}

// TestNoResume: the runs a lost sandbox is not replaced for.
func TestNoResume(t *testing.T) {
	var elapsed atomic.Int64
	tests := []struct {
		name   string
		setup  func(tb testing.TB, h *harness, id string)
		opts   []harnessOption
		status belay.RunStatus
		reason string
	}{
		{name: "resumes off", opts: []harnessOption{noResumes}, status: belay.StatusFailed, reason: orchestrator.ReasonKilled},
		{name: "one resume", opts: []harnessOption{func(c *orchestrator.Config) { c.MaxResumes = 1 }}, status: belay.StatusFailed,
			reason: "sandbox killed on attempt 2; gave up after 2 attempts (1 resumes, the limit)"},
		{name: "unresumable checkpoint", setup: func(tb testing.TB, h *harness, id string) {
			h.beforeExit = func(sb *fakeSandbox) {
				if _, err := h.store.RecordCheckpoint(context.Background(), id, belay.CheckpointRef{
					Seq: 99, Attempt: sb.spec.Attempt, Size: 10, At: clock, Unresumable: "the checkpoint is 5000000 bytes",
				}); err != nil {
					tb.Error(err)
				}
			}
		}, status: belay.StatusFailed, reason: "sandbox killed on attempt 1; its last checkpoint cannot be resumed from: the checkpoint is 5000000 bytes"},
		{name: "cancel requested", setup: func(tb testing.TB, h *harness, id string) {
			h.beforeExit = func(*fakeSandbox) {
				if _, err := h.store.RequestCancel(context.Background(), id, clock); err != nil {
					tb.Error(err)
				}
			}
		}, status: belay.StatusCancelled, reason: orchestrator.ReasonCancelled},
		{name: "no time left", opts: []harnessOption{func(c *orchestrator.Config) {
			c.Now = func() time.Time { return clock.Add(time.Duration(elapsed.Load())) }
		}}, setup: func(tb testing.TB, h *harness, id string) {
			// The sandbox dies 57 s into the run's 60.
			h.beforeExit = func(*fakeSandbox) { elapsed.Store(int64(57 * time.Second)) }
		}, status: belay.StatusFailed, reason: "sandbox killed on attempt 1, with too little of the run's wall time left to resume"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opts...)
			id := "run-" + strings.ReplaceAll(tt.name, " ", "-")
			log := &specLog{}
			h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, func(sb *fakeSandbox) belay.SandboxExit {
				if h.beforeExit != nil {
					h.beforeExit(sb)
				}
				return belay.SandboxExit{Signaled: true, ExitCode: -1}
			})})
			if tt.setup != nil {
				tt.setup(t, h, id)
			}
			if err := h.orch.Submit(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			run := h.settle(t, id)
			if run.Status != tt.status || run.Reason != tt.reason {
				t.Fatalf("run = %s (%q), want %s (%q)", run.Status, run.Reason, tt.status, tt.reason)
			}
			wantLaunches := 1
			if tt.name == "one resume" {
				wantLaunches = 2
			}
			if n := len(log.all()); n != wantLaunches {
				t.Errorf("%d launches, want %d", n, wantLaunches)
			}
			h.assertEnded(t, run)
		})
	}
}

// TestCancelDuringAResume: a cancel that arrives while the run's next
// sandbox starts ends the run cancelled; that sandbox is stopped and no
// model request can be spent after the cancel.
func TestCancelDuringAResume(t *testing.T) {
	h := newHarness(t)
	const id = "run-cancel-resume"
	log := &specLog{}
	h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, killed, blockUntilStopped(nil))})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	h.waitLaunched(t)
	second := h.waitLaunched(t)
	if second.spec.Attempt != 2 {
		t.Fatalf("second launch at attempt %d", second.spec.Attempt)
	}
	if err := h.orch.Cancel(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if res, err := h.store.ConsumeModelRequest(t.Context(), id, testModel, clock); err != nil || res.Outcome != belay.ConsumeInactive {
		t.Errorf("a model request after the cancel: %+v, %v; want inactive", res, err)
	}
	run := h.settle(t, id)
	if run.Status != belay.StatusCancelled || second.stops.Load() == 0 {
		t.Fatalf("run = %s (%q), second sandbox stopped %d times; want cancelled and stopped", run.Status, run.Reason, second.stops.Load())
	}
	h.assertEnded(t, run)
}

// TestRecoverResumes: runs a dead control plane left running resume on a
// new sandbox when Recover starts, told the control plane restarted; one
// whose deadline is too near fails, naming the loss, and one asked to
// cancel is cancelled.
func TestRecoverResumes(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	log := &specLog{}
	orphan := func(id string, started time.Time) {
		t.Helper()
		h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, completes)})
		if _, err := h.store.Transition(ctx, id, belay.Transition{To: belay.StatusRunning, At: started, Attempt: 1,
			Events: []belay.EventInput{{Type: belay.EventRunStarted}}}); err != nil {
			t.Fatal(err)
		}
		if err := h.store.ActivateCapability(ctx, belay.Capability{RunID: id, Model: testModel, State: belay.CapabilityActive,
			ExpiresAt: started.Add(90 * time.Second), MaxRequests: 7}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.store.RecordCheckpoint(ctx, id, belay.CheckpointRef{Seq: 4, Attempt: 1, Step: 2, Size: 10, At: started}); err != nil {
			t.Fatal(err)
		}
	}
	const resumes, late, cancelled = "run-orphan-resumes", "run-orphan-late", "run-orphan-cancelled"
	orphan(resumes, clock)
	orphan(late, clock.Add(-58*time.Second))
	orphan(cancelled, clock)
	if _, err := h.store.RequestCancel(ctx, cancelled, clock); err != nil {
		t.Fatal(err)
	}
	if err := h.orch.Recover(ctx); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	for _, id := range []string{resumes, late, cancelled} {
		h.waitTerminal(t, id)
	}
	if err := h.orch.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status  belay.RunStatus
		reason  string
		attempt int
	}{
		resumes:   {belay.StatusCompleted, "", 2},
		late:      {belay.StatusFailed, "control plane restarted on attempt 1, with too little of the run's wall time left to resume", 1},
		cancelled: {belay.StatusCancelled, orchestrator.ReasonCancelled, 1},
	}
	for id, w := range want {
		run, err := h.store.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != w.status || run.Reason != w.reason || run.Attempt != w.attempt {
			t.Errorf("%s = %s (%q) at attempt %d, want %s (%q) at %d", id, run.Status, run.Reason, run.Attempt, w.status, w.reason, w.attempt)
		}
		h.assertEnded(t, run)
	}
	specs := log.all()
	if len(specs) != 1 || specs[0].RunID != resumes || specs[0].Attempt != 2 || specs[0].Lost == nil || specs[0].Lost.Reason != orchestrator.ReasonRestarted {
		t.Fatalf("launches %+v, want one: the resumed run's attempt 2, lost to the restart", specs)
	}
	resumed := eventsOf[belay.RunResumedData](t, h, resumes, belay.EventRunResumed)
	if len(resumed) != 1 || resumed[0].Checkpoint == nil || resumed[0].Checkpoint.Seq != 4 {
		t.Errorf("run.resumed %+v, want from checkpoint 4", resumed)
	}
}

// TestCloseLeavesTheRunToResume: a graceful Close stops the sandbox in
// flight but leaves its run running, capability active, for the next
// start's Recover, which resumes it to completion.
func TestCloseLeavesTheRunToResume(t *testing.T) {
	h := newHarness(t)
	const id = "run-upgrade"
	log := &specLog{}
	h.createRun(t, id, testRequest(t, 60), plan{script: byAttempt(log, blockUntilStopped(nil), completes)})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	first := h.waitLaunched(t)
	if err := h.orch.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	run, err := h.store.GetRun(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.store.GetCapability(t.Context(), id)
	if run.Status != belay.StatusRunning || err != nil || c.State != belay.CapabilityActive || first.stops.Load() == 0 || first.cleanups.Load() == 0 {
		t.Fatalf("after Close: run %s, capability %+v (%v), sandbox stopped %d, cleaned %d; want running, active, stopped, cleaned",
			run.Status, c, err, first.stops.Load(), first.cleanups.Load())
	}

	next := h.restart(t)
	if err := next.orch.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	run = next.settle(t, id)
	if run.Status != belay.StatusCompleted || run.Attempt != 2 || len(run.LostAttempts) != 1 || run.LostAttempts[0].Reason != orchestrator.ReasonRestarted {
		t.Fatalf("after the restart: %s (%q) at attempt %d, lost %+v", run.Status, run.Reason, run.Attempt, run.LostAttempts)
	}
	next.assertEnded(t, run)
}

// TestSandboxLost: which endings are a lost sandbox, and in which words.
func TestSandboxLost(t *testing.T) {
	result := map[string][]byte{"result.json": []byte("{}")}
	tests := []struct {
		name    string
		exit    belay.SandboxExit
		files   map[string][]byte
		waitErr error
		reason  string
		lost    bool
	}{
		{"killed", belay.SandboxExit{Signaled: true, ExitCode: -1}, nil, nil, orchestrator.ReasonKilled, true},
		{"out of memory", belay.SandboxExit{Signaled: true, ExitCode: 137, OOMKilled: true}, nil, nil, orchestrator.ReasonOutOfMemory, true},
		{"crashed", belay.SandboxExit{ExitCode: 3}, nil, nil, "sandbox exited with code 3", true},
		{"exit 0 without a result", belay.SandboxExit{}, map[string][]byte{"patch.diff": nil}, nil, orchestrator.ReasonNoResult, true},
		{"wait failed", belay.SandboxExit{}, nil, errors.New("task vanished"), orchestrator.ReasonLost, true},
		{"uploaded, then killed", belay.SandboxExit{Signaled: true}, result, nil, "", false},
		{"a check was OOM-killed, the entry reported", belay.SandboxExit{OOMKilled: true}, result, nil, "", false},
		{"deadline", belay.SandboxExit{}, nil, orchestrator.ErrTimeout, "", false},
		{"cancelled", belay.SandboxExit{}, nil, orchestrator.ErrCancelled, "", false},
		{"shutdown", belay.SandboxExit{}, nil, orchestrator.ErrShutdown, "", false},
	}
	for _, tt := range tests {
		reason, lost := orchestrator.SandboxLost(tt.exit, tt.files, tt.waitErr)
		if reason != tt.reason || lost != tt.lost {
			t.Errorf("%s: SandboxLost = %q, %v; want %q, %v", tt.name, reason, lost, tt.reason, tt.lost)
		}
	}
}
