package belay

import (
	"context"
	"sync"
	"time"
)

// WatchedStore is a Store that signals every write that appends events, so
// an event stream in the same process can wake at once instead of at its
// next poll. Only writers that go through this wrapper are seen; a stream
// still polls for the rest (another process sharing a DynamoDB table).
type WatchedStore struct {
	Store
	mu      sync.Mutex
	changed chan struct{}
}

// WatchStore wraps s.
func WatchStore(s Store) *WatchedStore {
	return &WatchedStore{Store: s, changed: make(chan struct{})}
}

// Changed returns a channel that is closed at the next successful write
// that appends events. Take it before reading, so a write between the read
// and the wait is not missed.
func (w *WatchedStore) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

func (w *WatchedStore) signal(err error) {
	if err != nil {
		return
	}
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// CreateRun stores the run and signals its run.queued event.
func (w *WatchedStore) CreateRun(ctx context.Context, run Run, idempotencyKey string) (Run, bool, error) {
	stored, created, err := w.Store.CreateRun(ctx, run, idempotencyKey)
	w.signal(err)
	return stored, created, err
}

// Transition moves the run and signals its events.
func (w *WatchedStore) Transition(ctx context.Context, id string, t Transition) (Run, error) {
	run, err := w.Store.Transition(ctx, id, t)
	w.signal(err)
	return run, err
}

// RequestCancel records the request and signals its event.
func (w *WatchedStore) RequestCancel(ctx context.Context, id string, at time.Time) (Run, error) {
	run, err := w.Store.RequestCancel(ctx, id, at)
	w.signal(err)
	return run, err
}

// AppendEvents appends and signals.
func (w *WatchedStore) AppendEvents(ctx context.Context, runID, batchID string, events []EventInput) ([]Event, error) {
	stored, err := w.Store.AppendEvents(ctx, runID, batchID, events)
	w.signal(err)
	return stored, err
}

// AppendSandboxEvents appends and signals.
func (w *WatchedStore) AppendSandboxEvents(ctx context.Context, runID, batchID string, events []EventInput, limits SandboxEventLimits) ([]Event, error) {
	stored, err := w.Store.AppendSandboxEvents(ctx, runID, batchID, events, limits)
	w.signal(err)
	return stored, err
}

// CreateApproval stores the approval and signals its events.
func (w *WatchedStore) CreateApproval(ctx context.Context, a Approval) (Approval, error) {
	stored, err := w.Store.CreateApproval(ctx, a)
	w.signal(err)
	return stored, err
}

// DecideApproval records the decision and signals its event.
func (w *WatchedStore) DecideApproval(ctx context.Context, runID, id string, d Decision, reason, by string, at time.Time) (Approval, error) {
	a, err := w.Store.DecideApproval(ctx, runID, id, d, reason, by, at)
	w.signal(err)
	return a, err
}

// SpendModelRequest spends and signals the model.request event it
// appended.
func (w *WatchedStore) SpendModelRequest(ctx context.Context, runID string, call ModelCall, now time.Time) (ConsumeResult, error) {
	res, err := w.Store.SpendModelRequest(ctx, runID, call, now)
	if err == nil && res.Outcome == ConsumeOK {
		w.signal(nil)
	}
	return res, err
}

// RecordModelResponse records the usage and signals the event, when it
// was appended.
func (w *WatchedStore) RecordModelResponse(ctx context.Context, runID string, d UsageDelta, response EventInput) (bool, error) {
	appended, err := w.Store.RecordModelResponse(ctx, runID, d, response)
	if err == nil && appended {
		w.signal(nil)
	}
	return appended, err
}
