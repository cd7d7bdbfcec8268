// Package orchestrator is belay's embedded run sequencer: the in-process twin
// of the Step Functions state machine that runs belay on AWS. Each run goes
// through the same named steps there and here — Activate, Launch, Wait,
// Validate, Finalize, Cleanup — so the Lambda task handlers can call these
// methods one by one, while the embedded control plane runs them in a
// goroutine per run.
//
// Whatever happens to a run (success, failure, timeout, crash, cancel, a
// failed launch or activation, a panic, shutdown), its capability is revoked
// and its sandbox stopped and cleaned up, and a terminal state that is
// already stored is never overwritten.
package orchestrator

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
)

// The reasons the orchestrator records on the runs it ends. A run that its
// sandbox ended gets the bundle's reason instead.
const (
	ReasonTimeout     = "timeout"
	ReasonCancelled   = "cancelled"
	ReasonShutdown    = "control plane shutting down"
	ReasonInterrupted = "interrupted: control plane restarted"
	ReasonKilled      = "sandbox killed"
	// ReasonOutOfMemory ends a run that failed after the kernel killed a
	// process of its sandbox (the entry, or a check or command it ran) for
	// going past the sandbox's memory limit.
	ReasonOutOfMemory = "sandbox out of memory"
	ReasonActivation  = "activation failed"
	ReasonLaunch      = "sandbox launch failed"
	ReasonLost        = "sandbox lost"
	ReasonInternal    = "internal error"
	// ReasonValidationPrefix starts the reason of a run whose result bundle
	// failed validation; the validation message follows.
	ReasonValidationPrefix = "result validation: "
)

// Why Wait stopped a sandbox before it exited. Wait returns one of them (or
// an error wrapping a failure to wait), and Validate turns it into the
// run's outcome.
var (
	ErrTimeout   = errors.New("the run's wall time is over")
	ErrCancelled = errors.New("the run was cancelled")
	ErrShutdown  = errors.New("the control plane is shutting down")
)

// errNotStarted is a flight's own note that it was cancelled or shut down
// before it activated its run.
var errNotStarted = errors.New("run not started")

// Defaults of Config.
const (
	DefaultTokenGrace = 30 * time.Second
)

// collectTimeout bounds stopping a sandbox and collecting what it left.
const collectTimeout = 10 * time.Second

// Config is what an Orchestrator needs. Store, Artifacts, Launcher and
// Signer are required.
type Config struct {
	Store     belay.Store
	Artifacts belay.ArtifactStore
	Launcher  belay.Launcher
	Signer    *token.Signer
	// Logger receives one line per run step worth knowing, each with run_id
	// and never a token. Nil discards.
	Logger *slog.Logger
	// Now is the clock of stored times and expiries. Nil means time.Now.
	Now func() time.Time
	// Entropy draws claim codes. Nil means crypto/rand.
	Entropy io.Reader
	// TokenGrace is how long the run's tokens and capability outlive its
	// wall time, so a sandbox finishing at the deadline can still report.
	// Zero means DefaultTokenGrace.
	TokenGrace time.Duration
	// StopGrace is how long a sandbox past its wall time may take to exit
	// on its own (and leave its transcript) before it is killed. Zero kills
	// at once. The run is failed with reason timeout either way.
	StopGrace time.Duration
}

// Orchestrator sequences runs in-process. It implements belay.Orchestrator.
// It is safe for concurrent use.
type Orchestrator struct {
	store      belay.Store
	artifacts  belay.ArtifactStore
	launcher   belay.Launcher
	signer     *token.Signer
	log        *slog.Logger
	now        func() time.Time
	entropy    io.Reader
	tokenGrace time.Duration
	stopGrace  time.Duration

	mu     sync.Mutex
	closed bool
	runs   map[string]*flight // runs with a goroutine, by id
	wg     sync.WaitGroup
}

var _ belay.Orchestrator = (*Orchestrator)(nil)

// flight is one run's goroutine as Cancel and Close see it.
type flight struct {
	id     string
	ctx    context.Context
	cancel context.CancelCauseFunc

	// mu orders Cancel against the flight's activation and launch, so a
	// capability activated concurrently with a cancel is still revoked and
	// a sandbox launched concurrently is still stopped.
	mu      sync.Mutex
	sandbox belay.Sandbox
}

// New checks cfg and returns an Orchestrator with no runs in flight. Call
// Recover before serving, and Close on shutdown.
func New(cfg Config) (*Orchestrator, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("orchestrator: Config.Store is required")
	case cfg.Artifacts == nil:
		return nil, errors.New("orchestrator: Config.Artifacts is required")
	case cfg.Launcher == nil:
		return nil, errors.New("orchestrator: Config.Launcher is required")
	case cfg.Signer == nil:
		return nil, errors.New("orchestrator: Config.Signer is required")
	case cfg.TokenGrace < 0:
		return nil, fmt.Errorf("orchestrator: Config.TokenGrace %v is negative", cfg.TokenGrace)
	case cfg.StopGrace < 0:
		return nil, fmt.Errorf("orchestrator: Config.StopGrace %v is negative", cfg.StopGrace)
	}
	o := &Orchestrator{
		store:      cfg.Store,
		artifacts:  cfg.Artifacts,
		launcher:   cfg.Launcher,
		signer:     cfg.Signer,
		log:        cfg.Logger,
		now:        cfg.Now,
		entropy:    cfg.Entropy,
		tokenGrace: cfg.TokenGrace,
		stopGrace:  cfg.StopGrace,
		runs:       make(map[string]*flight),
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.entropy == nil {
		o.entropy = rand.Reader
	}
	if o.tokenGrace == 0 {
		o.tokenGrace = DefaultTokenGrace
	}
	return o, nil
}

// Submit starts sequencing the stored, queued run in a goroutine and returns
// at once. The run does not inherit ctx: it outlives the request that
// submitted it, and ends through Cancel or Close. Submitting a run already
// in flight does nothing. Returns unavailable after Close.
func (o *Orchestrator) Submit(ctx context.Context, runID string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return belay.Errorf(belay.CodeUnavailable, "the control plane is shutting down")
	}
	if _, ok := o.runs[runID]; ok {
		return nil
	}
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	f := &flight{id: runID, ctx: runCtx, cancel: cancel}
	o.runs[runID] = f
	o.wg.Add(1)
	go o.fly(f)
	return nil
}

// Cancel ends the run as cancelled. For a run in flight it cancels the
// run's context, revokes its capability and stops its sandbox, all before
// returning; the run's goroutine then records cancelled (it would record
// cancelled even if the sandbox finished meanwhile). A queued run, or a
// running one that nothing here is running, is moved to cancelled directly.
// It is idempotent and succeeds for a terminal run. Returns not_found for
// an unknown run.
func (o *Orchestrator) Cancel(ctx context.Context, runID string) error {
	o.mu.Lock()
	f := o.runs[runID]
	if f == nil {
		// Held across the write so that Submit cannot start the run
		// between the read and the transition.
		defer o.mu.Unlock()
		return o.cancelIdle(ctx, runID)
	}
	o.mu.Unlock()

	f.cancel(ErrCancelled)
	f.mu.Lock()
	sb := f.sandbox
	revokeErr := o.store.RevokeCapability(ctx, runID)
	f.mu.Unlock()
	var stopErr error
	if sb != nil {
		stopErr = sb.Stop(ctx)
	}
	o.log.Info("run cancel requested", "run_id", runID)
	if err := errors.Join(revokeErr, stopErr); err != nil {
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	return nil
}

// cancelIdle cancels a run that has no goroutine here. o.mu is held.
func (o *Orchestrator) cancelIdle(ctx context.Context, runID string) error {
	run, err := o.store.GetRun(ctx, runID)
	if err != nil {
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	if run.Status.Terminal() {
		return nil
	}
	if err := o.store.RevokeCapability(ctx, runID); err != nil {
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	_, err = o.Finalize(ctx, run, Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled})
	return err
}

// Recover is for start-up, before serving: it ends what a dead control
// plane left behind. A running run has lost its sandbox and is failed with
// reason "interrupted: control plane restarted" (cancelled instead if a
// cancel was requested), its capability revoked. A queued run is submitted
// again (or cancelled, if a cancel was requested). Runs in flight here are
// left alone. It goes on past a run it cannot end and returns the errors
// joined.
func (o *Orchestrator) Recover(ctx context.Context) error {
	running, err := o.listRuns(ctx, belay.StatusRunning)
	if err != nil {
		return err
	}
	queued, err := o.listRuns(ctx, belay.StatusQueued)
	if err != nil {
		return err
	}
	var errs []error
	interrupted, resubmitted, cancelled := 0, 0, 0
	for _, run := range running {
		if o.inFlight(run.ID) {
			continue
		}
		if err := o.store.RevokeCapability(ctx, run.ID); err != nil {
			errs = append(errs, fmt.Errorf("recover run %s: %w", run.ID, err))
			continue
		}
		out := Outcome{Status: belay.StatusFailed, Reason: ReasonInterrupted}
		if run.CancelRequested {
			out = Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled}
		}
		if _, err := o.Finalize(ctx, run, out); err != nil {
			errs = append(errs, fmt.Errorf("recover run %s: %w", run.ID, err))
			continue
		}
		interrupted++
	}
	for _, run := range queued {
		if run.CancelRequested {
			o.mu.Lock()
			if _, ok := o.runs[run.ID]; !ok {
				err = o.cancelIdle(ctx, run.ID)
			}
			o.mu.Unlock()
			cancelled++
		} else {
			err = o.Submit(ctx, run.ID)
			resubmitted++
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("recover run %s: %w", run.ID, err))
		}
	}
	if interrupted+resubmitted+cancelled > 0 {
		o.log.Info("recovered runs", "interrupted", interrupted, "resubmitted", resubmitted, "cancelled", cancelled)
	}
	return errors.Join(errs...)
}

func (o *Orchestrator) listRuns(ctx context.Context, status belay.RunStatus) ([]belay.Run, error) {
	var runs []belay.Run
	q := belay.ListRunsQuery{Status: status, Limit: 100}
	for {
		page, err := o.store.ListRuns(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("recover: list %s runs: %w", status, err)
		}
		runs = append(runs, page.Runs...)
		if page.NextCursor == "" {
			return runs, nil
		}
		q.Cursor = page.NextCursor
	}
}

func (o *Orchestrator) inFlight(runID string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.runs[runID]
	return ok
}

// Close shuts the orchestrator down gracefully: Submit refuses new runs,
// every sandbox in flight is stopped and its run finalized as failed with
// reason "control plane shutting down", and Close waits for those writes to
// finish. A run that had not started yet stays queued for Recover to submit
// again. Returns an error if ctx ends first. It is idempotent.
func (o *Orchestrator) Close(ctx context.Context) error {
	o.mu.Lock()
	o.closed = true
	n := len(o.runs)
	for _, f := range o.runs {
		f.cancel(ErrShutdown)
	}
	o.mu.Unlock()

	done := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		if n > 0 {
			o.log.Info("orchestrator closed", "runs_stopped", n)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close orchestrator: runs still finishing: %w", context.Cause(ctx))
	}
}

// fly runs one run's steps in its goroutine.
func (o *Orchestrator) fly(f *flight) {
	defer o.wg.Done()
	defer o.land(f)

	ctx := f.ctx
	// Store writes are not cut short by a cancel or a shutdown: a run's
	// outcome is always written whole.
	store := context.WithoutCancel(ctx)
	log := o.log.With("run_id", f.id)

	var (
		run     belay.Run
		spec    belay.SandboxSpec // holds the tokens and the claim code
		owned   bool              // this flight moved the run to running
		sandbox belay.Sandbox
	)
	defer func() {
		if owned {
			if err := o.Cleanup(store, f.id, sandbox); err != nil {
				log.Error("clean up run", "err", redact(err.Error(), spec))
			}
		}
	}()
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		log.Error("run panicked", "panic", redact(fmt.Sprint(p), spec), "stack", string(debug.Stack()))
		if owned {
			// Stop the sandbox before the run is reported failed; the
			// deferred Cleanup repeats this harmlessly.
			if err := o.Cleanup(store, f.id, sandbox); err != nil {
				log.Error("clean up run", "err", redact(err.Error(), spec))
			}
		}
		if run.ID == "" {
			run.ID = f.id
		}
		if _, err := o.Finalize(store, run, Outcome{Status: belay.StatusFailed, Reason: ReasonInternal}); err != nil {
			log.Error("finalize run", "err", err)
		}
	}()

	// Activate under f.mu, so that a concurrent Cancel revokes the
	// capability after it exists rather than before.
	activate := func() (belay.Run, belay.SandboxSpec, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ctx.Err() != nil {
			return belay.Run{}, belay.SandboxSpec{}, errNotStarted
		}
		return o.Activate(store, f.id)
	}
	run, spec, err := activate()
	owned = run.Status == belay.StatusRunning
	if err != nil {
		switch {
		case errors.Is(err, errNotStarted) && errors.Is(context.Cause(ctx), ErrShutdown):
			// Never started: it stays queued for Recover.
		case errors.Is(err, errNotStarted):
			o.cancelBeforeStart(store, log, f.id)
		case !owned && belay.IsCode(err, belay.CodeConflict):
			log.Info("run not started: it is no longer queued", "err", err)
		case !owned:
			log.Error("run not started", "err", err)
		default:
			log.Error("activate run", "err", err)
			o.finish(store, log, run, Outcome{Status: belay.StatusFailed, Reason: ReasonActivation})
		}
		return
	}
	log.Info("run started", "wall_time_seconds", run.Request.WallTimeSeconds, "max_requests", run.Request.MaxRequests())
	if run.CancelRequested {
		o.finish(store, log, run, Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled})
		return
	}

	if cause := interruption(ctx); cause != nil {
		// Cancelled or shut down while activating: launch nothing.
		o.finish(store, log, run, Validate(run, belay.SandboxExit{}, nil, cause))
		return
	}
	sb, err := o.Launch(ctx, spec)
	f.mu.Lock()
	sandbox, f.sandbox = sb, sb
	f.mu.Unlock()
	if err != nil {
		out := Outcome{Status: belay.StatusFailed, Reason: ReasonLaunch}
		if cause := interruption(ctx); cause != nil {
			out = Validate(run, belay.SandboxExit{}, nil, cause)
		} else {
			log.Error("launch sandbox", "err", redact(err.Error(), spec))
		}
		o.finish(store, log, run, out)
		return
	}

	exit, waitErr := o.Wait(ctx, run, sb)
	if waitErr != nil && waitErr != ErrTimeout && waitErr != ErrCancelled && waitErr != ErrShutdown {
		// The sandbox could not be waited for or stopped cleanly.
		log.Error("wait for sandbox", "err", redact(waitErr.Error(), spec))
	}
	// The sandbox is gone: no model call, and no upload, from here on.
	if err := o.store.RevokeCapability(store, f.id); err != nil {
		log.Error("revoke capability", "err", err)
	}
	files := o.Collect(store, run)
	out := Validate(run, exit, files, waitErr)
	if errors.Is(context.Cause(ctx), ErrCancelled) && out.Status != belay.StatusCancelled {
		// Cancelled while finishing: the cancel wins over a late result.
		out = Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled, Files: out.Files}
	}
	o.finish(store, log, run, redactOutcome(out, spec))
}

// land forgets a finished flight.
func (o *Orchestrator) land(f *flight) {
	f.cancel(nil)
	o.mu.Lock()
	delete(o.runs, f.id)
	o.mu.Unlock()
}

// cancelBeforeStart ends a run cancelled before its flight activated it.
func (o *Orchestrator) cancelBeforeStart(ctx context.Context, log *slog.Logger, runID string) {
	run, err := o.store.GetRun(ctx, runID)
	if err != nil {
		log.Error("cancel run before start", "err", err)
		return
	}
	o.finish(ctx, log, run, Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled})
}

// finish finalizes and logs the outcome.
func (o *Orchestrator) finish(ctx context.Context, log *slog.Logger, run belay.Run, out Outcome) {
	stored, err := o.Finalize(ctx, run, out)
	if err != nil {
		log.Error("finalize run", "err", err)
		return
	}
	attrs := []any{"status", stored.Status, "reason", stored.Reason}
	if stored.ExitCode != nil {
		attrs = append(attrs, "exit_code", *stored.ExitCode)
	}
	if !stored.StartedAt.IsZero() && !stored.FinishedAt.IsZero() {
		attrs = append(attrs, "duration", stored.FinishedAt.Sub(stored.StartedAt))
	}
	log.Info("run finished", attrs...)
}

// Activate moves the queued run to running at attempt 1 (appending
// run.started), gives it its capability (its model, MaxRequests, expiring
// TokenGrace after its wall time), issues its three tokens with the same
// lifetime, and stores a claim code for attempt 1 (belay.ClaimTTL). It
// returns the sandbox's spec with both: a launcher that hands the tokens
// over as files uses Tokens, one that starts the entry in claim mode uses
// Claim, which then gets fresh tokens for its attempt.
//
// The returned run has status running once that move is stored, even when
// a later part fails: the caller then owns the run and must finalize it.
// Returns conflict, and a zero run, if the run is not queued.
func (o *Orchestrator) Activate(ctx context.Context, runID string) (belay.Run, belay.SandboxSpec, error) {
	stored, err := o.store.GetRun(ctx, runID)
	if err != nil {
		return belay.Run{}, belay.SandboxSpec{}, fmt.Errorf("activate run %s: %w", runID, err)
	}
	now := o.now()
	req := stored.Request
	started, err := json.Marshal(struct {
		MaxRequests     int `json:"maxRequests"`
		WallTimeSeconds int `json:"wallTimeSeconds"`
	}{req.MaxRequests(), req.WallTimeSeconds})
	if err != nil {
		return belay.Run{}, belay.SandboxSpec{}, fmt.Errorf("activate run %s: %w", runID, err)
	}
	run, err := o.store.Transition(ctx, runID, belay.Transition{
		To: belay.StatusRunning, At: now, Attempt: 1,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunStarted, Data: started}},
	})
	if err != nil {
		return belay.Run{}, belay.SandboxSpec{}, fmt.Errorf("activate run %s: %w", runID, err)
	}

	// The capability and the tokens end TokenGrace after the run's
	// deadline, the one clock of the run (belay.Run.Deadline).
	expires := run.Deadline().Add(o.tokenGrace)
	ttl := expires.Sub(now)
	if err := o.store.ActivateCapability(ctx, belay.Capability{
		RunID:       runID,
		Model:       req.Model,
		State:       belay.CapabilityActive,
		ExpiresAt:   expires,
		MaxRequests: req.MaxRequests(),
	}); err != nil {
		return run, belay.SandboxSpec{}, fmt.Errorf("activate capability of run %s: %w", runID, err)
	}
	set, err := o.signer.IssueSet(runID, req.Model, ttl)
	if err != nil {
		return run, belay.SandboxSpec{}, fmt.Errorf("issue tokens of run %s: %w", runID, err)
	}
	code, claim, err := belay.NewClaim(runID, run.Attempt, now, o.entropy)
	if err != nil {
		return run, belay.SandboxSpec{}, err
	}
	if err := o.store.CreateClaim(ctx, claim); err != nil {
		return run, belay.SandboxSpec{}, fmt.Errorf("store claim of run %s: %w", runID, err)
	}
	spec := belay.SpecForRun(run)
	spec.Tokens = belay.SandboxTokens{Model: set.Model, Events: set.Events, Approvals: set.Approvals}
	spec.Claim = code
	return run, spec, nil
}

// Launch starts the run's sandbox with spec, as Activate made it.
func (o *Orchestrator) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	sb, err := o.launcher.Launch(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("launch sandbox of run %s: %w", spec.RunID, err)
	}
	return sb, nil
}

// Wait waits for the sandbox to exit, until the run's deadline
// (belay.Run.Deadline, the clock the sandbox keeps too) or the end of ctx.
// It then gives the sandbox StopGrace to exit on its own, stops it and
// collects what it left. The error says why the sandbox did not simply
// exit: ErrTimeout, the cause of ctx (ErrCancelled, ErrShutdown), or a
// failure to wait.
func (o *Orchestrator) Wait(ctx context.Context, run belay.Run, sb belay.Sandbox) (belay.SandboxExit, error) {
	deadline := run.Deadline()
	if deadline.IsZero() {
		return belay.SandboxExit{}, fmt.Errorf("wait for sandbox of run %s: the run has not started, so it has no deadline", run.ID)
	}
	wctx, cancel := context.WithTimeoutCause(ctx, max(deadline.Sub(o.now()), 0), ErrTimeout)
	exit, err := sb.Wait(wctx)
	cause := context.Cause(wctx)
	interrupted := wctx.Err() != nil
	cancel()
	if err == nil {
		return exit, nil
	}
	if !interrupted {
		cause = fmt.Errorf("wait for sandbox of run %s: %w", run.ID, err)
	}
	if errors.Is(cause, ErrTimeout) && o.stopGrace > 0 {
		gctx, cancel := context.WithTimeout(ctx, o.stopGrace)
		exit, err = sb.Wait(gctx)
		cancel()
		if err == nil {
			return exit, cause
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), collectTimeout)
	defer cancel()
	if err := sb.Stop(cctx); err != nil {
		return belay.SandboxExit{}, errors.Join(cause, fmt.Errorf("stop sandbox of run %s: %w", run.ID, err))
	}
	exit, err = sb.Wait(cctx)
	if err != nil {
		return belay.SandboxExit{}, errors.Join(cause, fmt.Errorf("collect sandbox of run %s: %w", run.ID, err))
	}
	return exit, cause
}

// Collect reads the outputs the run's sandbox uploaded for its attempt
// (belay.StagedOutputName) from the artifact store, after the sandbox has
// exited: nothing is read from the sandbox's workspace, where a command
// running as the sandbox user could swap a file. A missing output is left
// out; one that cannot be read, or is over belay.MaxArtifactBytes, is left
// out and logged. Validate then decides what they are worth.
func (o *Orchestrator) Collect(ctx context.Context, run belay.Run) map[string][]byte {
	return ReadOutputs(ctx, o.artifacts, run, o.log.With("run_id", run.ID))
}

// ReadOutputs is Collect for a caller without an Orchestrator (the steps
// function's validate task on AWS).
func ReadOutputs(ctx context.Context, artifacts belay.ArtifactStore, run belay.Run, log *slog.Logger) map[string][]byte {
	files := map[string][]byte{}
	for _, name := range belay.ArtifactNames {
		staged := belay.StagedOutputName(run.Attempt, name)
		b, err := artifacts.GetArtifact(ctx, run.ID, staged)
		switch {
		case belay.IsCode(err, belay.CodeNotFound):
			continue
		case err != nil:
			log.Warn("sandbox output left out", "output", name, "attempt", run.Attempt, "err", err)
			continue
		case len(b) > belay.MaxArtifactBytes:
			log.Warn("sandbox output left out: too large", "output", name, "attempt", run.Attempt, "size", len(b))
			continue
		}
		files[name] = b
	}
	return files
}

// Outcome is how a run ends: what Validate decides and Finalize records.
// Files are the sandbox's output files, stored as artifacts whatever the
// status.
type Outcome struct {
	Status       belay.RunStatus
	Reason       string
	ExitCode     *int
	Checks       []belay.CheckResult
	ChangedFiles []string
	Files        map[string][]byte
}

// Validate decides the run's outcome from how its sandbox ended; the
// sandbox does not. waitErr is Wait's error. A sandbox stopped for a
// reason is cancelled (ErrCancelled) or failed with reason timeout,
// "control plane shutting down" or "sandbox lost"; a killed one fails with
// "sandbox killed". Otherwise the result bundle decides, once
// belay.ValidateResult accepts it: an invalid bundle fails the run with
// "result validation: ..." when the sandbox exited 0, and with "sandbox
// exited with code N" when it did not (a crash); a bundle that claims
// completed from a sandbox that exited non-zero is not believed either.
//
// A sandbox still running at the deadline (ErrTimeout) that then exits on
// its own within StopGrace with a bundle ValidateResult accepts is judged
// by that bundle: it kept to the same deadline (belay.Run.Deadline), so
// the run records what the sandbox did by then, with the sandbox's own
// reason (its wall-time reason when its time ran out), rather than a
// second verdict on the same clock. Without such a bundle it is timeout.
//
// When the kernel killed a process of the sandbox at its memory limit
// (exit.OOMKilled), a run that fails for any of these reasons but the
// stopping ones fails with "sandbox out of memory" instead: that is why.
// files are the outputs the sandbox uploaded (Collect).
func Validate(run belay.Run, exit belay.SandboxExit, files map[string][]byte, waitErr error) Outcome {
	out := Outcome{Status: belay.StatusFailed, Files: files}
	switch {
	case errors.Is(waitErr, ErrCancelled):
		out.Status, out.Reason = belay.StatusCancelled, ReasonCancelled
		return out
	case errors.Is(waitErr, ErrShutdown):
		out.Reason = ReasonShutdown
		return out
	case errors.Is(waitErr, ErrTimeout):
		if bundled, ok := bundleOutcome(run, exit, files); ok && !exit.Signaled {
			return bundled
		}
		out.Reason = ReasonTimeout
		return out
	case waitErr != nil:
		out.Reason = ReasonLost
		return out
	case exit.Signaled && exit.OOMKilled:
		out.Reason = ReasonOutOfMemory
		return out
	case exit.Signaled:
		out.Reason = ReasonKilled
		return out
	}

	if bundled, ok := bundleOutcome(run, exit, files); ok {
		return bundled
	}
	_, err := belay.ValidateResult(run.ID, run.Request, files)
	if crashed := exit.ExitCode != 0; crashed {
		code := exit.ExitCode
		out.ExitCode = &code
		out.Reason = fmt.Sprintf("sandbox exited with code %d", code)
		if exit.OOMKilled {
			out.Reason = ReasonOutOfMemory
		}
		return out
	}
	out.Reason = ReasonValidationPrefix + belay.ErrorMessage(err)
	return out
}

// bundleOutcome is the outcome the sandbox's result bundle gives, when
// belay.ValidateResult accepts it and the exit code agrees (a bundle that
// claims completed from a sandbox that exited non-zero is not believed).
func bundleOutcome(run belay.Run, exit belay.SandboxExit, files map[string][]byte) (Outcome, bool) {
	b, err := belay.ValidateResult(run.ID, run.Request, files)
	if err != nil || (b.Status != belay.StatusFailed && exit.ExitCode != 0) {
		return Outcome{}, false
	}
	code := b.ExitCode
	out := Outcome{Status: b.Status, ExitCode: &code, Checks: b.Checks, ChangedFiles: b.ChangedFiles, Files: files}
	if b.Status == belay.StatusFailed {
		out.Reason = b.Reason
		if out.Reason == "" {
			out.Reason = "failed"
		}
		if exit.OOMKilled {
			// The bundle says what failed (a check killed by SIGKILL);
			// the memory limit is why.
			out.Reason = ReasonOutOfMemory
		}
	}
	return out, true
}

// FinalCheck is the data of the check.finished events Finalize appends,
// one per check of a validated bundle, before the terminal event. Only the
// control plane writes Final: the events route refuses it from a sandbox.
type FinalCheck struct {
	Argv       []string `json:"argv"`
	ExitCode   int      `json:"exitCode"`
	DurationMs int64    `json:"durationMs"`
	Final      bool     `json:"final"`
}

// Finalize stores the outcome's files as artifacts (result.json, patch.diff,
// transcript.jsonl, whichever exist) and moves the run to its terminal
// state with the outcome, a check.finished event per final check of a
// validated bundle (FinalCheck) and its terminal event (run.completed,
// run.failed or run.cancelled, with reason and exitCode) in one write. A run whose
// cancel was requested ends cancelled whatever the outcome. A run that is
// already terminal keeps its state: Finalize logs that and returns the
// stored run without error. An artifact that cannot be stored is logged and
// left out.
func (o *Orchestrator) Finalize(ctx context.Context, run belay.Run, out Outcome) (belay.Run, error) {
	log := o.log.With("run_id", run.ID)
	stored, err := o.store.GetRun(ctx, run.ID)
	if err != nil {
		return belay.Run{}, fmt.Errorf("finalize run %s: %w", run.ID, err)
	}
	if stored.Status.Terminal() {
		log.Info("run already ended; its state stands", "status", stored.Status, "outcome", out.Status)
		return stored, nil
	}
	if stored.CancelRequested && out.Status != belay.StatusCancelled {
		out = Outcome{Status: belay.StatusCancelled, Reason: ReasonCancelled, Files: out.Files}
	}

	var artifacts []string
	for _, name := range belay.ArtifactNames {
		content, ok := out.Files[name]
		if !ok {
			continue
		}
		if err := o.artifacts.PutArtifact(ctx, run.ID, name, content); err != nil {
			log.Error("store artifact", "artifact", name, "size", len(content), "err", err)
			continue
		}
		artifacts = append(artifacts, name)
	}

	data, err := json.Marshal(struct {
		Reason   string `json:"reason,omitempty"`
		ExitCode *int   `json:"exitCode,omitempty"`
	}{out.Reason, out.ExitCode})
	if err != nil {
		return belay.Run{}, fmt.Errorf("finalize run %s: %w", run.ID, err)
	}
	now := o.now()
	// The final checks go into the log from the bundle the control plane
	// validated, as its own events: the sandbox may not report them.
	events := make([]belay.EventInput, 0, len(out.Checks)+1)
	for _, c := range out.Checks {
		check, err := json.Marshal(FinalCheck{Argv: c.Argv, ExitCode: c.ExitCode, DurationMs: c.DurationMs, Final: true})
		if err != nil {
			return belay.Run{}, fmt.Errorf("finalize run %s: %w", run.ID, err)
		}
		events = append(events, belay.EventInput{Time: now, Type: belay.EventCheckFinished, Data: check})
	}
	events = append(events, belay.EventInput{Time: now, Type: belay.TerminalEventType(out.Status), Data: data})
	done, err := o.store.Transition(ctx, run.ID, belay.Transition{
		To:           out.Status,
		At:           now,
		Reason:       out.Reason,
		ExitCode:     out.ExitCode,
		Checks:       out.Checks,
		ChangedFiles: out.ChangedFiles,
		Artifacts:    artifacts,
		Events:       events,
	})
	if belay.IsCode(err, belay.CodeConflict) {
		log.Info("run ended meanwhile; its state stands", "outcome", out.Status)
		if done, err = o.store.GetRun(ctx, run.ID); err != nil {
			return belay.Run{}, fmt.Errorf("finalize run %s: %w", run.ID, err)
		}
		return done, nil
	}
	if err != nil {
		return belay.Run{}, fmt.Errorf("finalize run %s: %w", run.ID, err)
	}
	return done, nil
}

// Cleanup is the step every path ends with: it revokes the run's
// capability, stops its sandbox and removes the sandbox's workspace. Each
// part is idempotent and is tried even when another fails; sb may be nil
// when no sandbox was launched. Stopping waits at most collectTimeout, so a
// sandbox that cannot be reaped still has its workspace removed and does
// not hold its run's goroutine (and Close) for ever.
func (o *Orchestrator) Cleanup(ctx context.Context, runID string, sb belay.Sandbox) error {
	var errs []error
	if err := o.store.RevokeCapability(ctx, runID); err != nil {
		errs = append(errs, fmt.Errorf("revoke capability of run %s: %w", runID, err))
	}
	if sb != nil {
		sctx, cancel := context.WithTimeout(ctx, collectTimeout)
		err := sb.Stop(sctx)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox of run %s: %w", runID, err))
		}
		if err := sb.Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("clean up sandbox of run %s: %w", runID, err))
		}
	}
	return errors.Join(errs...)
}

// interruption returns why ctx ended, if it did: ErrCancelled or
// ErrShutdown.
func interruption(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

// secretsOf lists what a run's spec carries that no log or artifact may:
// its three tokens and its claim code.
func secretsOf(spec belay.SandboxSpec) []string {
	var out []string
	for _, v := range []string{spec.Tokens.Model, spec.Tokens.Events, spec.Tokens.Approvals, spec.Claim.Reveal()} {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// redact replaces the run's tokens and claim code in s, and anything else
// shaped like a run token (the claim exchange issues tokens this
// orchestrator never sees), so that an error or a panic that quotes one
// cannot carry it into a log.
func redact(s string, spec belay.SandboxSpec) string {
	for _, t := range secretsOf(spec) {
		s = strings.ReplaceAll(s, t, "[redacted]")
	}
	return token.RedactAll(s)
}

// redactOutcome removes the run's secrets (see redact) from everything the
// outcome will store. A sandbox should never write one, but its output is
// untrusted, and an agent that read its token would otherwise publish it.
func redactOutcome(out Outcome, spec belay.SandboxSpec) Outcome {
	out.Reason = redact(out.Reason, spec)
	if len(out.Checks) > 0 {
		checks := make([]belay.CheckResult, len(out.Checks))
		for i, c := range out.Checks {
			c.OutputTail = redact(c.OutputTail, spec)
			checks[i] = c
		}
		out.Checks = checks
	}
	if len(out.Files) > 0 {
		files := make(map[string][]byte, len(out.Files))
		for name, content := range out.Files {
			for _, t := range secretsOf(spec) {
				content = bytes.ReplaceAll(content, []byte(t), []byte("[redacted]"))
			}
			files[name] = token.RedactAllBytes(content)
		}
		out.Files = files
	}
	return out
}
