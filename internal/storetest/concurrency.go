package storetest

import (
	"slices"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// parallel runs fn(i) for i in [0, n) on n goroutines released together,
// and returns their errors by index.
func parallel(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func testConcurrency(t *testing.T, open opener) {
	t.Run("consume_budget", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cc", belay.StatusRunning)
		c := newCapability("run-cc", 50, at(600))
		mustActivate(t, s, c)
		results := make([]belay.ConsumeResult, 200)
		errs := parallel(200, func(i int) error {
			var err error
			results[i], err = s.ConsumeModelRequest(t.Context(), "run-cc", testModel, at(10))
			return err
		})
		var remaining []int
		exhausted := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("consume %d: %v", i, errs[i])
			}
			switch r.Outcome {
			case belay.ConsumeOK:
				remaining = append(remaining, r.Remaining)
			case belay.ConsumeExhausted:
				exhausted++
			default:
				t.Fatalf("consume %d = %s", i, r.Outcome)
			}
		}
		if len(remaining) != 50 || exhausted != 150 {
			t.Fatalf("200 concurrent consumes of 50: %d ok, %d exhausted; want 50, 150", len(remaining), exhausted)
		}
		// Each success saw its own count: remaining 49, 48, …, 0 once each.
		slices.Sort(remaining)
		for i, r := range remaining {
			if r != i {
				t.Fatalf("remaining values of the successes = %v, want 0..49 once each", remaining)
			}
		}
		wantCapability(t, s, c, belay.CapabilityActive, 50)
	})

	t.Run("append_events", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-ce", belay.StatusQueued) // seq 1
		got := make([][]belay.Event, 50)
		errs := parallel(50, func(i int) error {
			var err error
			got[i], err = s.AppendEvents(t.Context(), "run-ce", "", toolEvents(1, 100+i))
			return err
		})
		var seqs []int64
		for i := range got {
			if errs[i] != nil {
				t.Fatalf("append %d: %v", i, errs[i])
			}
			if len(got[i]) != 1 {
				t.Fatalf("append %d returned %d events, want 1", i, len(got[i]))
			}
			seqs = append(seqs, got[i][0].Seq)
		}
		slices.Sort(seqs)
		if !slices.Equal(seqs, seqRange(2, 51)) {
			t.Fatalf("50 concurrent appends got seqs %v, want 2..51 once each", seqs)
		}
		p := allEvents(t, s, "run-ce")
		if !slices.Equal(eventSeqs(p.Events), seqRange(1, 51)) || p.LastSeq != 51 || mustGet(t, s, "run-ce").LastSeq != 51 {
			t.Fatalf("log seqs %v lastSeq %d, want 1..51, 51", eventSeqs(p.Events), p.LastSeq)
		}
		// Each returned event is the one stored under its seq.
		for i := range got {
			e := got[i][0]
			if stored := p.Events[e.Seq-1]; !jsonEqual(stored.Data, e.Data) || !stored.Time.Equal(e.Time) {
				t.Fatalf("append %d: seq %d holds %s, returned %s", i, e.Seq, stored.Data, e.Data)
			}
		}
	})

	t.Run("complete_vs_cancel", func(t *testing.T) {
		s := open(t, Options{})
		for run := range 10 {
			id := name("run-race-%d", run)
			createIn(t, s, id, belay.StatusRunning)
			outcomes := []belay.RunStatus{belay.StatusCompleted, belay.StatusCancelled}
			runs := make([]belay.Run, 2)
			errs := parallel(2, func(i int) error {
				var err error
				runs[i], err = s.Transition(t.Context(), id, transitionTo(outcomes[i], at(100+i)))
				return err
			})
			winner := -1
			for i, err := range errs {
				switch {
				case err == nil && winner == -1:
					winner = i
				case err == nil:
					t.Fatalf("%s: both completion and cancellation succeeded", id)
				default:
					wantCode(t, err, belay.CodeConflict, name("%s: losing transition → %s", id, outcomes[i]))
				}
			}
			if winner == -1 {
				t.Fatalf("%s: neither transition succeeded: %v", id, errs)
			}
			stored := mustGet(t, s, id)
			sameRun(t, id+": stored run vs winner", stored, runs[winner])
			p := allEvents(t, s, id)
			terminal := 0
			for _, e := range p.Events {
				if belay.IsTerminalEvent(e.Type) {
					terminal++
				}
			}
			if stored.Status != outcomes[winner] || terminal != 1 || !p.Terminal {
				t.Fatalf("%s: status %s with %d terminal events; want %s with 1", id, stored.Status, terminal, outcomes[winner])
			}
		}
	})

	t.Run("create_same_key", func(t *testing.T) {
		s := open(t, Options{})
		stored := make([]belay.Run, 20)
		created := make([]bool, 20)
		errs := parallel(20, func(i int) error {
			var err error
			stored[i], created[i], err = s.CreateRun(t.Context(), newRun(name("run-k%02d", i), at(i), "hash-same"), "key-shared")
			return err
		})
		winners := 0
		for i := range stored {
			if errs[i] != nil {
				t.Fatalf("CreateRun %d: %v", i, errs[i])
			}
			if created[i] {
				winners++
			}
			if stored[i].ID != stored[0].ID {
				t.Fatalf("same idempotency key gave runs %s and %s", stored[0].ID, stored[i].ID)
			}
		}
		if winners != 1 {
			t.Fatalf("%d of 20 concurrent creates with one key report created, want 1", winners)
		}
		if runs, _ := listAll(t, s, belay.ListRunsQuery{Limit: 50}); len(runs) != 1 {
			t.Fatalf("store holds %v, want one run", runIDs(runs))
		}
		if p := allEvents(t, s, stored[0].ID); len(p.Events) != 1 {
			t.Fatalf("log = %v, want one run.queued", eventTypes(p.Events))
		}
	})

	t.Run("request_cancel", func(t *testing.T) {
		s := open(t, Options{})
		before := createIn(t, s, "run-rc", belay.StatusRunning)
		errs := parallel(20, func(int) error {
			_, err := s.RequestCancel(t.Context(), "run-rc", at(100))
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("RequestCancel %d: %v", i, err)
			}
		}
		p := allEvents(t, s, "run-rc")
		if p.LastSeq != before.LastSeq+1 || p.Events[len(p.Events)-1].Type != belay.EventCancelRequested {
			t.Fatalf("20 concurrent cancel requests: log %v, want one run.cancel_requested", eventTypes(p.Events))
		}
	})
}
