package storetest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// toolEvents returns n sandbox events starting at second sec, each with
// distinct data.
func toolEvents(n, sec int) []belay.EventInput {
	evs := make([]belay.EventInput, n)
	for i := range evs {
		evs[i] = belay.EventInput{
			Time: at(sec + i),
			Type: belay.EventToolCall,
			Data: json.RawMessage(name(`{"tool":"read_file","arguments":{"path":"calc.py"},"n":%d}`, sec+i)),
		}
	}
	return evs
}

// mustAppend appends events and fails the test on error.
func mustAppend(tb testing.TB, s belay.Store, id, batch string, evs []belay.EventInput) []belay.Event {
	tb.Helper()
	got, err := s.AppendEvents(tb.Context(), id, batch, evs)
	if err != nil {
		tb.Fatalf("AppendEvents(%s, %q): %v", id, batch, err)
	}
	return got
}

// asEvents numbers inputs from seq first, as a store should, and marks
// them the control plane's (AppendEvents).
func asEvents(first int64, in []belay.EventInput) []belay.Event {
	out := make([]belay.Event, len(in))
	for i, e := range in {
		out[i] = belay.Event{Seq: first + int64(i), Time: e.Time, Type: e.Type, Source: belay.SourceControl, Data: e.Data}
	}
	return out
}

func testEvents(t *testing.T, open opener) {
	t.Run("append_and_list", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-ev", belay.StatusRunning) // seqs 1, 2
		in := toolEvents(3, 100)
		in[1].Type = belay.EventToolResult
		in[2].Data = nil
		got := mustAppend(t, s, "run-ev", "", in)
		sameEvents(t, "AppendEvents", got, asEvents(3, in))
		if r := mustGet(t, s, "run-ev"); r.LastSeq != 5 {
			t.Fatalf("run.LastSeq = %d, want 5", r.LastSeq)
		}
		p := allEvents(t, s, "run-ev")
		if !slices.Equal(eventSeqs(p.Events), seqRange(1, 5)) {
			t.Fatalf("log seqs = %v, want 1..5", eventSeqs(p.Events))
		}
		sameEvents(t, "appended events in the log", p.Events[2:], asEvents(3, in))
		if p.LastSeq != 5 || p.OldestSeq != 1 || p.Missed || p.Terminal {
			t.Fatalf("page: last %d oldest %d missed %v terminal %v; want 5 1 false false", p.LastSeq, p.OldestSeq, p.Missed, p.Terminal)
		}
	})

	t.Run("after_and_limit", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-pg", at(0), "hash-pg"), "")
		mustAppend(t, s, "run-pg", "", toolEvents(9, 100)) // seqs 2..10
		for _, c := range []struct {
			after int64
			limit int
			want  []int64
		}{
			{0, 3, seqRange(1, 3)},
			{3, 3, seqRange(4, 6)},
			{6, 100, seqRange(7, 10)},
			{9, 5, []int64{10}},
			{10, 5, nil},
			{50, 5, nil},
		} {
			t.Run(name("after_%d_limit_%d", c.after, c.limit), func(t *testing.T) {
				p, err := s.ListEvents(t.Context(), "run-pg", c.after, c.limit)
				if err != nil {
					t.Fatalf("ListEvents: %v", err)
				}
				if got := eventSeqs(p.Events); !slices.Equal(got, c.want) && (len(got) > 0 || len(c.want) > 0) {
					t.Fatalf("seqs = %v, want %v", got, c.want)
				}
				if p.LastSeq != 10 || p.Missed || p.Terminal || p.OldestSeq != 1 {
					t.Fatalf("page: last %d missed %v terminal %v oldest %d; want 10 false false 1", p.LastSeq, p.Missed, p.Terminal, p.OldestSeq)
				}
			})
		}
	})

	t.Run("terminal_flag", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-term", belay.StatusRunning)
		if p := allEvents(t, s, "run-term"); p.Terminal {
			t.Fatal("running run's log reports Terminal")
		}
		mustTransition(t, s, "run-term", belay.StatusFailed, at(50))
		p := allEvents(t, s, "run-term")
		if !p.Terminal || !belay.IsTerminalEvent(p.Events[len(p.Events)-1].Type) {
			t.Fatalf("failed run's log: terminal %v, last event %s", p.Terminal, p.Events[len(p.Events)-1].Type)
		}
	})

	t.Run("batch_idempotent", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-b", at(0), "hash-b"), "")
		in := toolEvents(2, 100)
		first := mustAppend(t, s, "run-b", "batch-1", in)
		sameEvents(t, "first AppendEvents", first, asEvents(2, in))
		again := mustAppend(t, s, "run-b", "batch-1", in)
		sameEvents(t, "repeated AppendEvents", again, first)
		if p := allEvents(t, s, "run-b"); p.LastSeq != 3 || len(p.Events) != 3 {
			t.Fatalf("after a repeated batch: lastSeq %d, %d events; want 3, 3", p.LastSeq, len(p.Events))
		}
		next := mustAppend(t, s, "run-b", "batch-2", toolEvents(1, 200))
		if len(next) != 1 || next[0].Seq != 4 {
			t.Fatalf("next batch got seqs %v, want [4]", eventSeqs(next))
		}
		// Without a batch id every call appends.
		mustAppend(t, s, "run-b", "", toolEvents(1, 300))
		mustAppend(t, s, "run-b", "", toolEvents(1, 300))
		if p := allEvents(t, s, "run-b"); !slices.Equal(eventSeqs(p.Events), seqRange(1, 6)) {
			t.Fatalf("log seqs = %v, want 1..6", eventSeqs(p.Events))
		}
	})

	for _, term := range []belay.RunStatus{belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled} {
		t.Run("append_to_"+string(term), func(t *testing.T) {
			s := open(t, Options{})
			before := createIn(t, s, "run-done", term)
			log := allEvents(t, s, "run-done")
			_, err := s.AppendEvents(t.Context(), "run-done", "batch-late", toolEvents(1, 900))
			wantCode(t, err, belay.CodeConflict, "AppendEvents(terminal)")
			sameEvents(t, "log after a refused append", allEvents(t, s, "run-done").Events, log.Events)
			sameRun(t, "run after a refused append", mustGet(t, s, "run-done"), before)
		})
	}

	t.Run("invalid", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-inv", belay.StatusRunning)
		log := allEvents(t, s, "run-inv")
		for _, c := range []struct {
			name string
			bad  belay.EventInput
		}{
			{"no_type", belay.EventInput{Time: at(100), Type: ""}},
			{"data_not_json", belay.EventInput{Time: at(100), Type: belay.EventToolCall, Data: json.RawMessage(`{"tool":`)}},
		} {
			in := append(toolEvents(2, 100), c.bad)
			_, err := s.AppendEvents(t.Context(), "run-inv", "batch-"+c.name, in)
			wantCode(t, err, belay.CodeInvalid, name("AppendEvents(%s)", c.name))
			sameEvents(t, name("log after a refused append (%s)", c.name), allEvents(t, s, "run-inv").Events, log.Events)
		}
	})

	t.Run("largest_batch", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-max", at(0), "hash-max"), "")
		in := toolEvents(belay.MaxAppendEvents, 100)
		got := mustAppend(t, s, "run-max", "batch-max", in)
		sameEvents(t, "AppendEvents of MaxAppendEvents", got, asEvents(2, in))
		again := mustAppend(t, s, "run-max", "batch-max", in)
		sameEvents(t, "repeated AppendEvents of MaxAppendEvents", again, got)
		if p := allEvents(t, s, "run-max"); p.LastSeq != int64(belay.MaxAppendEvents)+1 {
			t.Fatalf("lastSeq = %d, want %d", p.LastSeq, belay.MaxAppendEvents+1)
		}
	})

	t.Run("not_found", func(t *testing.T) {
		s := open(t, Options{})
		_, err := s.AppendEvents(t.Context(), "run-missing", "", toolEvents(1, 0))
		wantCode(t, err, belay.CodeNotFound, "AppendEvents(missing)")
		_, err = s.ListEvents(t.Context(), "run-missing", 0, 10)
		wantCode(t, err, belay.CodeNotFound, "ListEvents(missing)")
	})
}

func testBuffer(t *testing.T, open opener) {
	t.Run("keeps_last_10_of_25", func(t *testing.T) {
		s := open(t, Options{EventBufferSize: 10})
		mustCreate(t, s, newRun("run-buf", at(0), "hash-buf"), "") // seq 1
		// 24 more in batches of several sizes: 2..25.
		sec := 100
		for _, n := range []int{1, 5, 3, 11, 4} {
			mustAppend(t, s, "run-buf", "", toolEvents(n, sec))
			sec += n
		}
		if r := mustGet(t, s, "run-buf"); r.LastSeq != 25 {
			t.Fatalf("run.LastSeq = %d, want 25", r.LastSeq)
		}
		for _, c := range []struct {
			after, limit int
			want         []int64
			missed       bool
		}{
			{0, 100, seqRange(16, 25), true},
			{14, 100, seqRange(16, 25), true},
			{15, 100, seqRange(16, 25), false},
			{20, 2, []int64{21, 22}, false},
			{25, 10, nil, false},
		} {
			t.Run(name("after_%d", c.after), func(t *testing.T) {
				p, err := s.ListEvents(t.Context(), "run-buf", int64(c.after), c.limit)
				if err != nil {
					t.Fatalf("ListEvents: %v", err)
				}
				if got := eventSeqs(p.Events); !slices.Equal(got, c.want) && (len(got) > 0 || len(c.want) > 0) {
					t.Fatalf("seqs = %v, want %v", got, c.want)
				}
				if p.Missed != c.missed || p.OldestSeq != 16 || p.LastSeq != 25 {
					t.Fatalf("page: missed %v oldest %d last %d; want %v 16 25", p.Missed, p.OldestSeq, p.LastSeq, c.missed)
				}
			})
		}
	})

	t.Run("transition_events_count", func(t *testing.T) {
		s := open(t, Options{EventBufferSize: 10})
		mustCreate(t, s, newRun("run-tb", at(0), "hash-tb"), "")
		mustAppend(t, s, "run-tb", "", toolEvents(9, 100)) // 2..10
		_, err := s.Transition(t.Context(), "run-tb", belay.Transition{
			To: belay.StatusRunning, At: at(200),
			Events: []belay.EventInput{{Time: at(200), Type: belay.EventRunStarted}, {Time: at(200), Type: belay.EventSandboxReady}},
		})
		if err != nil {
			t.Fatalf("Transition: %v", err)
		}
		p := allEvents(t, s, "run-tb")
		if !slices.Equal(eventSeqs(p.Events), seqRange(3, 12)) || p.OldestSeq != 3 || !p.Missed {
			t.Fatalf("log seqs %v oldest %d missed %v; want 3..12, 3, true", eventSeqs(p.Events), p.OldestSeq, p.Missed)
		}
	})

	t.Run("batch_replay_after_eviction", func(t *testing.T) {
		s := open(t, Options{EventBufferSize: 10})
		mustCreate(t, s, newRun("run-ev", at(0), "hash-ev"), "")
		early := toolEvents(2, 100)
		mustAppend(t, s, "run-ev", "batch-early", early)    // 2, 3
		mustAppend(t, s, "run-ev", "", toolEvents(20, 200)) // 4..23
		again := mustAppend(t, s, "run-ev", "batch-early", early)
		if len(again) != 0 {
			t.Fatalf("replayed batch returned %v; its events have left the buffer", eventSeqs(again))
		}
		if p := allEvents(t, s, "run-ev"); p.LastSeq != 23 || !slices.Equal(eventSeqs(p.Events), seqRange(14, 23)) {
			t.Fatalf("after replaying an evicted batch: lastSeq %d seqs %v; want 23, 14..23", p.LastSeq, eventSeqs(p.Events))
		}
	})

	t.Run("default_size", func(t *testing.T) {
		// Options{} keeps belay.DefaultEventBufferSize events: the run's
		// first event plus that many more push out exactly the first.
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-def", at(0), "hash-def"), "")
		n := belay.DefaultEventBufferSize
		for sent := 0; sent < n; {
			k := min(belay.MaxAppendEvents, n-sent)
			mustAppend(t, s, "run-def", "", toolEvents(k, 100+sent))
			sent += k
		}
		last := int64(n) + 1
		var seqs []int64
		for after, page := int64(0), 1; ; page++ {
			p, err := s.ListEvents(t.Context(), "run-def", after, 0)
			if err != nil {
				t.Fatalf("ListEvents(after %d): %v", after, err)
			}
			if page == 1 && (!p.Missed || p.OldestSeq != 2) {
				t.Fatalf("first page: missed %v oldest %d; want true 2 (the default keeps %d events)", p.Missed, p.OldestSeq, n)
			}
			if p.LastSeq != last || page > n {
				t.Fatalf("page %d: lastSeq %d, want %d", page, p.LastSeq, last)
			}
			if len(p.Events) == 0 {
				break
			}
			seqs = append(seqs, eventSeqs(p.Events)...)
			after = p.Events[len(p.Events)-1].Seq
		}
		if !slices.Equal(seqs, seqRange(2, last)) {
			t.Fatalf("default buffer holds %d events, want seqs 2..%d", len(seqs), last)
		}
	})
}
