package belay_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/storetest"
)

func openWatched(tb testing.TB, opts storetest.Options) *belay.WatchedStore {
	tb.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(tb.TempDir(), "belay.db"), sqlite.Options{EventBufferSize: opts.EventBufferSize})
	if err != nil {
		tb.Fatalf("open sqlite: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return belay.WatchStore(st)
}

// TestWatchedStoreConformance shows the wrapper is still a whole Store.
func TestWatchedStoreConformance(t *testing.T) {
	storetest.Run(t, func(tb testing.TB, opts storetest.Options) belay.Store { return openWatched(tb, opts) })
}

func TestWatchedStoreSignalsWrites(t *testing.T) {
	ctx := context.Background()
	w := openWatched(t, storetest.Options{})
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	before := w.Changed()
	run := belay.Run{ID: "run_watch", Status: belay.StatusQueued, CreatedAt: now, UpdatedAt: now,
		RequestHash: "h", Usage: belay.Usage{MaxRequests: 3},
		Request: belay.RunRequest{Instruction: "x", Model: "m", MaxSteps: 1, WallTimeSeconds: 1}}
	if _, _, err := w.CreateRun(ctx, run, ""); err != nil {
		t.Fatal(err)
	}
	if !closed(before) {
		t.Fatal("CreateRun did not signal")
	}

	before = w.Changed()
	if closed(before) {
		t.Fatal("a fresh signal is already closed")
	}
	if _, err := w.AppendEvents(ctx, run.ID, "", []belay.EventInput{{Time: now, Type: belay.EventToolCall}}); err != nil {
		t.Fatal(err)
	}
	if !closed(before) {
		t.Fatal("AppendEvents did not signal")
	}

	// A refused write appends nothing and wakes nobody.
	before = w.Changed()
	if _, err := w.Transition(ctx, run.ID, belay.Transition{To: belay.StatusCompleted, At: now}); !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("queued → completed: %v, want conflict", err)
	}
	if closed(before) {
		t.Fatal("a refused transition signalled")
	}
	// Reads never signal.
	if _, err := w.ListEvents(ctx, run.ID, 0, 10); err != nil {
		t.Fatal(err)
	}
	if closed(before) {
		t.Fatal("a read signalled")
	}
}
