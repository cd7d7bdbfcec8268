package belay

import (
	"context"
	"time"
)

// NotifyingStore is a Store that reports each run that reaches a state:
// created (queued), and every successful Transition (running and the
// terminal states). belay publishes these as run status events (on its
// EventBridge bus on AWS; to the in-process publisher of safe outputs in
// belay serve). Only writes through this wrapper are seen.
type NotifyingStore struct {
	Store
	onStatus func(ctx context.Context, run Run)
}

// NotifyStore wraps s; onStatus is called after each such write, with the
// stored run, and must not block for long.
func NotifyStore(s Store, onStatus func(ctx context.Context, run Run)) *NotifyingStore {
	return &NotifyingStore{Store: s, onStatus: onStatus}
}

// CreateRun stores the run and reports it when it was created.
func (n *NotifyingStore) CreateRun(ctx context.Context, run Run, idempotencyKey string) (Run, bool, error) {
	stored, created, err := n.Store.CreateRun(ctx, run, idempotencyKey)
	if err == nil && created {
		n.onStatus(ctx, stored)
	}
	return stored, created, err
}

// Transition moves the run and reports its new state.
func (n *NotifyingStore) Transition(ctx context.Context, id string, t Transition) (Run, error) {
	run, err := n.Store.Transition(ctx, id, t)
	if err == nil {
		n.onStatus(ctx, run)
	}
	return run, err
}

// RequestCancel records the request; the run's state does not change.
func (n *NotifyingStore) RequestCancel(ctx context.Context, id string, at time.Time) (Run, error) {
	return n.Store.RequestCancel(ctx, id, at)
}
