// Package dispatch turns normalized repository events into runs: the
// dispatcher Lambda's work on AWS (an EventBridge rule's target), called
// in-process by belay serve. It matches the event against the triggers
// file again, renders the run request (triggers.Render) and creates the
// run through the same path as POST /v1/runs (internal/intake), under the
// id the webhook promised. When the source cannot be fetched, the run is
// still created, failed with the reason, so the promised id says why.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/intake"
	"github.com/belay-dev/belay/internal/triggers"
)

// Config is what a Dispatcher needs; all but Logger and Now are required.
type Config struct {
	Triggers *triggers.Config
	Intake   *intake.Service
	Store    belay.Store
	// NewID returns a fresh run id, for events from the bus that no webhook
	// promised a run for (CodeCommit's).
	NewID  func() string
	Now    func() time.Time
	Logger *slog.Logger
}

// Dispatcher creates runs from repository events. It is safe for
// concurrent use.
type Dispatcher struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Dispatcher.
func New(cfg Config) (*Dispatcher, error) {
	switch {
	case cfg.Triggers == nil:
		return nil, errors.New("dispatch: Config.Triggers is required")
	case cfg.Intake == nil || cfg.Store == nil:
		return nil, errors.New("dispatch: Config.Intake and Config.Store are required")
	case cfg.NewID == nil:
		return nil, errors.New("dispatch: Config.NewID is required")
	}
	d := &Dispatcher{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d, nil
}

// Outcome is what Dispatch did with an event.
type Outcome struct {
	// RunID is the run the event started (or had started), empty when it
	// started none; Ignored says why not.
	RunID   string `json:"runId,omitempty"`
	Ignored string `json:"ignored,omitempty"`
	// Status is the run's status once dispatched: queued, or failed when
	// its source could not be fetched.
	Status belay.RunStatus `json:"status,omitempty"`
	Reason string          `json:"reason,omitempty"`
}

// Dispatch creates the run ev starts. It is idempotent: an event whose run
// exists (a redelivery, EventBridge's at-least-once delivery) answers that
// run. Returns invalid for an event CheckRepoEvent refuses; other errors
// are the store's.
func (d *Dispatcher) Dispatch(ctx context.Context, ev belay.RepoEvent) (Outcome, error) {
	if err := belay.CheckRepoEvent(ev); err != nil {
		return Outcome{}, err
	}
	log := d.log.With("delivery", ev.Delivery, "event", ev.Event, "repository", ev.Repository)
	rule, reason := d.cfg.Triggers.Match(ev)
	if ev.RunID == "" {
		// From the bus without a webhook (CodeCommit): this is the
		// delivery's first answer, recorded as a webhook's would be.
		delivery := belay.Delivery{Provider: ev.Provider, ID: ev.Delivery, Ignored: truncate(reason, belay.MaxDeliveryIgnoredLen), ReceivedAt: d.now()}
		if rule != nil {
			delivery.RunID, delivery.Ignored = d.cfg.NewID(), ""
		}
		stored, _, err := d.cfg.Store.RecordDelivery(ctx, delivery)
		if err != nil {
			return Outcome{}, fmt.Errorf("dispatch: record delivery: %w", err)
		}
		if stored.RunID == "" {
			log.Info("repository event ignored", "reason", stored.Ignored)
			return Outcome{Ignored: stored.Ignored}, nil
		}
		ev.RunID = stored.RunID
	} else if rule == nil {
		// The webhook matched it, but the triggers changed since: the
		// promised run says so.
		rule = d.cfg.Triggers.Lookup(ev.Provider, ev.Repository)
		if rule == nil {
			log.Warn("a promised run's repository left the triggers file; nothing to create", "run_id", ev.RunID, "reason", reason)
			return Outcome{RunID: ev.RunID, Ignored: reason}, nil
		}
	}
	log = log.With("run_id", ev.RunID)
	if run, err := d.cfg.Store.GetRun(ctx, ev.RunID); err == nil {
		log.Info("repository event already dispatched")
		return Outcome{RunID: run.ID, Status: run.Status, Reason: run.Reason}, nil
	} else if !belay.IsCode(err, belay.CodeNotFound) {
		return Outcome{}, fmt.Errorf("dispatch: %w", err)
	}

	req := triggers.Render(ev, rule)
	policy := triggers.OperatorGitURLs
	if reason != "" {
		// Matched by the webhook, no longer by the triggers: a failed run.
		return d.failed(ctx, log, ev.RunID, req, &policy, "trigger: "+reason)
	}
	run, _, err := d.cfg.Intake.Create(ctx, intake.Request{Run: req, RunID: ev.RunID, GitURLs: &policy})
	switch {
	case err == nil:
		log.Info("run created from a repository event", "actor", ev.Actor, "commit", run.Request.GitSource().Commit)
		return Outcome{RunID: run.ID, Status: run.Status}, nil
	case belay.IsCode(err, belay.CodeConflict):
		if run, gerr := d.cfg.Store.GetRun(ctx, ev.RunID); gerr == nil {
			return Outcome{RunID: run.ID, Status: run.Status, Reason: run.Reason}, nil
		}
		return Outcome{}, fmt.Errorf("dispatch: %w", err)
	case belay.ErrorCode(err) == belay.CodeInternal:
		return Outcome{}, fmt.Errorf("dispatch: create run %s: %w", ev.RunID, err)
	}
	return d.failed(ctx, log, ev.RunID, req, &policy, "source: "+belay.ErrorMessage(err))
}

// failed creates the promised run as failed with reason.
func (d *Dispatcher) failed(ctx context.Context, log *slog.Logger, runID string, req belay.RunRequest, policy *belay.GitURLPolicy, reason string) (Outcome, error) {
	reason = truncate(reason, 1000)
	run, err := d.cfg.Intake.CreateFailed(ctx, runID, req, policy, reason)
	if err != nil {
		if belay.IsCode(err, belay.CodeConflict) {
			if run, gerr := d.cfg.Store.GetRun(ctx, runID); gerr == nil {
				return Outcome{RunID: run.ID, Status: run.Status, Reason: run.Reason}, nil
			}
		}
		return Outcome{}, fmt.Errorf("dispatch: record failed run %s: %w", runID, err)
	}
	log.Info("run from a repository event failed before it started", "reason", reason)
	return Outcome{RunID: run.ID, Status: run.Status, Reason: run.Reason}, nil
}

// AsyncBus is the in-process bus of belay serve: it dispatches each event
// in a goroutine of its own, so the webhook answers GitHub at once (GitHub
// waits 10 s) while the source is fetched. Close waits for dispatches in
// flight.
type AsyncBus struct {
	d    *Dispatcher
	log  *slog.Logger
	wg   sync.WaitGroup
	mu   sync.Mutex
	done bool
	// OnDispatched, when set, is called after each dispatch (tests).
	OnDispatched func(belay.RepoEvent, Outcome, error)
}

// NewAsyncBus returns a bus that dispatches with d.
func NewAsyncBus(d *Dispatcher, log *slog.Logger) *AsyncBus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AsyncBus{d: d, log: log}
}

// PublishRepoEvent starts dispatching ev and returns. Returns unavailable
// after Close.
func (b *AsyncBus) PublishRepoEvent(ctx context.Context, ev belay.RepoEvent) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return belay.Errorf(belay.CodeUnavailable, "the control plane is shutting down")
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		out, err := b.d.Dispatch(context.WithoutCancel(ctx), ev)
		if err != nil {
			b.log.Error("dispatch repository event", "run_id", ev.RunID, "delivery", ev.Delivery, "err", err.Error())
		}
		if b.OnDispatched != nil {
			b.OnDispatched(ev, out, err)
		}
	}()
	return nil
}

// Close refuses new events and waits for dispatches in flight, or ctx.
func (b *AsyncBus) Close(ctx context.Context) error {
	b.mu.Lock()
	b.done = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("dispatch: events still being dispatched: %w", ctx.Err())
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// HandleBusEvent is the dispatcher function's handler: the repository
// event an EventBridge event carries (belay's own, or CodeCommit's),
// dispatched. An event that is no push answers ignored.
func (d *Dispatcher) HandleBusEvent(ctx context.Context, ev belay.BusEvent) (Outcome, error) {
	re, ignored, err := belay.RepoEventOf(ev)
	switch {
	case err != nil:
		d.log.Warn("bus event refused", "event_id", ev.ID, "source", ev.Source, "err", err.Error())
		return Outcome{}, err
	case ignored != "":
		d.log.Info("bus event ignored", "event_id", ev.ID, "reason", ignored)
		return Outcome{Ignored: ignored}, nil
	}
	return d.Dispatch(ctx, re)
}
