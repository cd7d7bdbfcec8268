package orchestrator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/orchestrator"
)

// TestOneDeadline: the spec carries the run's deadline (its start plus its
// wall time, in UTC), the capability and the tokens end TokenGrace after
// it, and Wait stops the sandbox at that deadline, not a wall time counted
// from the launch: the clock moves on 700 ms while the sandbox launches,
// and a 1 s run is cut 300 ms after the launch.
func TestOneDeadline(t *testing.T) {
	var now atomic.Pointer[time.Time]
	start := clock
	now.Store(&start)
	h := newHarness(t, func(c *orchestrator.Config) {
		c.Now = func() time.Time { return *now.Load() }
		c.TokenGrace = 10 * time.Second
		// The launch takes 700 ms on the orchestrator's clock.
		c.Launcher = slowLauncher{next: c.Launcher, before: func() {
			late := start.Add(700 * time.Millisecond)
			now.Store(&late)
		}}
	})
	const id = "run-one-deadline"
	var waited atomic.Int64
	h.createRun(t, id, testRequest(t, 1), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
		launched := time.Now()
		<-sb.waitCut
		waited.Store(int64(time.Since(launched)))
		<-sb.stopped
		return belay.SandboxExit{ExitCode: -1, Signaled: true}
	}})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	run := h.settle(t, id)
	if run.Status != belay.StatusFailed || run.Reason != orchestrator.ReasonTimeout {
		t.Fatalf("run = %s (%q), want failed (timeout)", run.Status, run.Reason)
	}
	deadline := run.StartedAt.Add(time.Second).UTC()
	if !run.Deadline().Equal(deadline) || run.Deadline().Location() != time.UTC {
		t.Errorf("Run.Deadline() = %v, want %v (UTC)", run.Deadline(), deadline)
	}
	sb := h.launcher.sandbox(id)
	if !sb.spec.Deadline.Equal(deadline) {
		t.Errorf("spec.Deadline = %v, want the run's start plus its wall time, %v", sb.spec.Deadline, deadline)
	}
	capability, err := h.store.GetCapability(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if want := deadline.Add(10 * time.Second); !capability.ExpiresAt.Equal(want) {
		t.Errorf("capability expires %v, want the deadline plus TokenGrace, %v", capability.ExpiresAt, want)
	}
	// Wait had 1 s less the 700 ms the clock moved: well under the 1 s a
	// count from the launch would give.
	if d := time.Duration(waited.Load()); d >= 900*time.Millisecond {
		t.Errorf("Wait cut the sandbox %v after its launch; want about 300 ms, what was left of the run's wall time", d)
	}
}

// slowLauncher calls before, then the launcher it wraps: a launch that
// takes time.
type slowLauncher struct {
	next   belay.Launcher
	before func()
}

func (l slowLauncher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	l.before()
	return l.next.Launch(ctx, spec)
}

// TestStopGraceKeepsTheSandboxVerdict: a sandbox still finishing at the
// deadline that exits on its own within StopGrace with a valid bundle is
// judged by it, so the run and the bundle give the same reason; one that
// leaves no bundle is timeout (TestStopGrace), and one that had to be
// killed is timeout whatever it left.
func TestStopGraceKeepsTheSandboxVerdict(t *testing.T) {
	failed := func(runID string) belay.ResultBundle {
		b := completedBundle(runID)
		b.Status, b.ExitCode, b.Reason = belay.StatusFailed, 1, "wall_time_exceeded"
		b.ChangedFiles, b.HeadCommit = []string{}, b.BaseCommit
		b.Checks[0].ExitCode, b.Checks[0].OutputTail = -1, "[belay: not run: the run's wall time is used up]"
		return b
	}
	tests := []struct {
		name       string
		exit       func(sb *fakeSandbox) belay.SandboxExit
		wantStatus belay.RunStatus
		wantReason string
	}{
		{"failed bundle", func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{}, bundleFiles(t, failed(sb.spec.RunID), ""))
		}, belay.StatusFailed, "wall_time_exceeded"},
		{"completed bundle", func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{}, bundleFiles(t, completedBundle(sb.spec.RunID), goodPatch))
		}, belay.StatusCompleted, ""},
		{"completed bundle, non-zero exit", func(sb *fakeSandbox) belay.SandboxExit {
			return sb.upload(belay.SandboxExit{ExitCode: 1}, bundleFiles(t, completedBundle(sb.spec.RunID), goodPatch))
		}, belay.StatusFailed, orchestrator.ReasonTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *orchestrator.Config) { c.StopGrace = time.Minute })
			const id = "run-grace-verdict"
			h.createRun(t, id, testRequest(t, 1), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
				<-sb.waitCut // the deadline has passed: the sandbox writes its bundle
				return tt.exit(sb)
			}})
			if err := h.orch.Submit(t.Context(), id); err != nil {
				t.Fatalf("Submit: %v", err)
			}
			run := h.settle(t, id)
			if run.Status != tt.wantStatus || run.Reason != tt.wantReason {
				t.Fatalf("run = %s (%q), want %s (%q)", run.Status, run.Reason, tt.wantStatus, tt.wantReason)
			}
		})
	}

	// Killed at the end of the grace: timeout, whatever it left.
	h := newHarness(t, func(c *orchestrator.Config) { c.StopGrace = 50 * time.Millisecond })
	const id = "run-grace-killed"
	h.createRun(t, id, testRequest(t, 1), plan{script: func(sb *fakeSandbox) belay.SandboxExit {
		<-sb.stopped
		return sb.upload(belay.SandboxExit{ExitCode: -1, Signaled: true}, bundleFiles(t, failed(sb.spec.RunID), ""))
	}})
	if err := h.orch.Submit(t.Context(), id); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if run := h.settle(t, id); run.Status != belay.StatusFailed || run.Reason != orchestrator.ReasonTimeout {
		t.Fatalf("killed after the grace: run = %s (%q), want failed (timeout)", run.Status, run.Reason)
	}
}
