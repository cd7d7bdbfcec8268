package storetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// sandboxEvent is a tool.call event whose data is pad bytes of padding.
func sandboxEvent(sec, pad int) belay.EventInput {
	return belay.EventInput{Time: at(sec), Type: belay.EventToolCall,
		Data: json.RawMessage(`{"p":"` + strings.Repeat("x", pad) + `"}`)}
}

func sandboxEvents(n, pad int) []belay.EventInput {
	evs := make([]belay.EventInput, n)
	for i := range evs {
		evs[i] = sandboxEvent(20+i, pad)
	}
	return evs
}

// wantSandboxCount fails the test unless the run has counted events
// sandbox events of size bytes.
func wantSandboxCount(tb testing.TB, s belay.Store, id string, events int, size int64) {
	tb.Helper()
	r := mustGet(tb, s, id)
	if r.SandboxEvents != events || r.SandboxEventBytes != size {
		tb.Fatalf("run counts %d sandbox events of %d bytes, want %d of %d", r.SandboxEvents, r.SandboxEventBytes, events, size)
	}
}

func testSandboxEvents(t *testing.T, open opener) {
	t.Run("sources", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-src", belay.StatusRunning)
		if _, err := s.AppendEvents(t.Context(), "run-src", "", []belay.EventInput{{Time: at(20), Type: belay.EventModelRequest}}); err != nil {
			t.Fatalf("AppendEvents: %v", err)
		}
		got, err := s.AppendSandboxEvents(t.Context(), "run-src", "b1", sandboxEvents(2, 1), belay.DefaultSandboxEventLimits())
		if err != nil {
			t.Fatalf("AppendSandboxEvents: %v", err)
		}
		for _, e := range got {
			if e.Source != belay.SourceSandbox {
				t.Fatalf("AppendSandboxEvents answered event %d with source %q, want sandbox", e.Seq, e.Source)
			}
		}
		mustTransition(t, s, "run-src", belay.StatusCompleted, at(30))
		var sources []string
		for _, e := range allEvents(t, s, "run-src").Events {
			sources = append(sources, e.Type+"/"+e.Source)
		}
		want := []string{"run.queued/control", "run.started/control", "model.request/control",
			"tool.call/sandbox", "tool.call/sandbox", "run.completed/control"}
		if fmt.Sprint(sources) != fmt.Sprint(want) {
			t.Fatalf("events and sources = %v, want %v", sources, want)
		}
		// A repeated sandbox batch answers with the same, still sandbox's.
		again, err := s.AppendSandboxEvents(t.Context(), "run-src", "b1", sandboxEvents(2, 1), belay.DefaultSandboxEventLimits())
		if err != nil || len(again) != 2 || again[0].Source != belay.SourceSandbox || again[0].Seq != got[0].Seq {
			t.Fatalf("repeated batch = %+v, %v; want the first answer", again, err)
		}
	})

	t.Run("count_cap", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		limits := belay.SandboxEventLimits{MaxEvents: 5, MaxBytes: 1 << 20}
		per := belay.EventBytes(sandboxEvent(0, 3))
		if _, err := s.AppendSandboxEvents(t.Context(), "run-cap", "", sandboxEvents(3, 3), limits); err != nil {
			t.Fatalf("3 of 5: %v", err)
		}
		before := mustGet(t, s, "run-cap").LastSeq
		_, err := s.AppendSandboxEvents(t.Context(), "run-cap", "", sandboxEvents(3, 3), limits)
		wantCode(t, err, belay.CodeTooLarge, "3 more past a cap of 5")
		if !strings.Contains(belay.ErrorMessage(err), "at most 5 events") {
			t.Fatalf("refusal %q does not name the cap", belay.ErrorMessage(err))
		}
		if got := mustGet(t, s, "run-cap").LastSeq; got != before {
			t.Fatalf("a refused batch appended: lastSeq %d, was %d", got, before)
		}
		wantSandboxCount(t, s, "run-cap", 3, 3*per)
		if _, err := s.AppendSandboxEvents(t.Context(), "run-cap", "", sandboxEvents(2, 3), limits); err != nil {
			t.Fatalf("up to the cap: %v", err)
		}
		wantSandboxCount(t, s, "run-cap", 5, 5*per)
		_, err = s.AppendSandboxEvents(t.Context(), "run-cap", "", sandboxEvents(1, 3), limits)
		wantCode(t, err, belay.CodeTooLarge, "one past the cap")
		// The control plane's own events are not the sandbox's to spend.
		if _, err := s.AppendEvents(t.Context(), "run-cap", "", []belay.EventInput{{Time: at(40), Type: belay.EventModelResponse}}); err != nil {
			t.Fatalf("AppendEvents at the sandbox cap: %v", err)
		}
		mustTransition(t, s, "run-cap", belay.StatusFailed, at(50))
		if got := mustGet(t, s, "run-cap"); got.SandboxEvents != 5 {
			t.Fatalf("counters after the end: %d", got.SandboxEvents)
		}
	})

	t.Run("byte_cap", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-bytes", belay.StatusRunning)
		per := belay.EventBytes(sandboxEvent(0, 40))
		limits := belay.SandboxEventLimits{MaxEvents: 100, MaxBytes: 3*per + per/2}
		if _, err := s.AppendSandboxEvents(t.Context(), "run-bytes", "", sandboxEvents(3, 40), limits); err != nil {
			t.Fatalf("3 events under the byte cap: %v", err)
		}
		_, err := s.AppendSandboxEvents(t.Context(), "run-bytes", "", sandboxEvents(1, 40), limits)
		wantCode(t, err, belay.CodeTooLarge, "past the byte cap")
		if !strings.Contains(belay.ErrorMessage(err), fmt.Sprintf("at most %d bytes", limits.MaxBytes)) {
			t.Fatalf("refusal %q does not name the byte cap", belay.ErrorMessage(err))
		}
		wantSandboxCount(t, s, "run-bytes", 3, 3*per)
		// A smaller one still fits.
		if _, err := s.AppendSandboxEvents(t.Context(), "run-bytes", "", []belay.EventInput{{Time: at(30), Type: "x"}}, limits); err != nil {
			t.Fatalf("a small event under the byte cap: %v", err)
		}
	})

	t.Run("repeated_batch_at_the_cap", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-rep", belay.StatusRunning)
		limits := belay.SandboxEventLimits{MaxEvents: 2, MaxBytes: 1 << 20}
		first, err := s.AppendSandboxEvents(t.Context(), "run-rep", "b-full", sandboxEvents(2, 1), limits)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.AppendSandboxEvents(t.Context(), "run-rep", "b-full", sandboxEvents(2, 1), limits)
		if err != nil || len(again) != 2 || again[0].Seq != first[0].Seq {
			t.Fatalf("repeated batch at the cap = %v, %v; want the first answer", again, err)
		}
		wantSandboxCount(t, s, "run-rep", 2, 2*belay.EventBytes(sandboxEvent(0, 1)))
	})

	t.Run("invalid_limits_and_states", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-bad", belay.StatusRunning)
		for _, l := range []belay.SandboxEventLimits{{}, {MaxEvents: 1}, {MaxBytes: 1}, {MaxEvents: -1, MaxBytes: 10}} {
			_, err := s.AppendSandboxEvents(t.Context(), "run-bad", "", sandboxEvents(1, 1), l)
			wantCode(t, err, belay.CodeInvalid, fmt.Sprintf("limits %+v", l))
		}
		_, err := s.AppendSandboxEvents(t.Context(), "run-missing", "", sandboxEvents(1, 1), belay.DefaultSandboxEventLimits())
		wantCode(t, err, belay.CodeNotFound, "a missing run")
		mustTransition(t, s, "run-bad", belay.StatusCompleted, at(30))
		_, err = s.AppendSandboxEvents(t.Context(), "run-bad", "", sandboxEvents(1, 1), belay.DefaultSandboxEventLimits())
		wantCode(t, err, belay.CodeConflict, "an ended run")
	})

	t.Run("cap_holds_under_concurrency", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-race", belay.StatusRunning)
		const limit, writers = 7, 16
		limits := belay.SandboxEventLimits{MaxEvents: limit, MaxBytes: 1 << 20}
		errs := parallel(writers, func(i int) error {
			_, err := s.AppendSandboxEvents(t.Context(), "run-race", fmt.Sprintf("w%d", i), []belay.EventInput{sandboxEvent(20+i, 2)}, limits)
			return err
		})
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case belay.IsCode(err, belay.CodeTooLarge):
			default:
				t.Fatalf("a concurrent append failed with %v, want ok or too_large", err)
			}
		}
		n := 0
		for _, e := range allEvents(t, s, "run-race").Events {
			if e.Source == belay.SourceSandbox {
				n++
			}
		}
		if ok != limit || n != limit {
			t.Fatalf("%d appends succeeded and %d sandbox events are in the log; want exactly the cap, %d", ok, n, limit)
		}
		wantSandboxCount(t, s, "run-race", limit, limit*belay.EventBytes(sandboxEvent(0, 2)))
	})
}
