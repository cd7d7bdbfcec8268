package storetest

import (
	"encoding/base64"
	"slices"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

func testRuns(t *testing.T, open opener) {
	t.Run("create_get", func(t *testing.T) {
		s := open(t, Options{})
		want := newRun("run-create", at(0), "hash-create")
		got := mustCreate(t, s, want, "")
		if got.ID != want.ID || got.Status != belay.StatusQueued {
			t.Fatalf("CreateRun = %s/%s, want %s/queued", got.ID, got.Status, want.ID)
		}
		sameRequest(t, "CreateRun", got.Request, want.Request)
		sameTime(t, "CreatedAt", got.CreatedAt, want.CreatedAt)
		sameTime(t, "StartedAt", got.StartedAt, time.Time{})
		sameTime(t, "FinishedAt", got.FinishedAt, time.Time{})
		if got.RequestHash != want.RequestHash {
			t.Fatalf("RequestHash = %q, want %q", got.RequestHash, want.RequestHash)
		}
		if got.Usage != want.Usage {
			t.Fatalf("Usage = %+v, want %+v", got.Usage, want.Usage)
		}
		if got.LastSeq != 1 || got.CancelRequested || got.ExitCode != nil || got.Reason != "" {
			t.Fatalf("new run: lastSeq %d cancelRequested %v exitCode %v reason %q; want 1 false nil empty",
				got.LastSeq, got.CancelRequested, got.ExitCode, got.Reason)
		}
		sameRun(t, "GetRun after CreateRun", mustGet(t, s, want.ID), got)

		p := allEvents(t, s, want.ID)
		if len(p.Events) != 1 || p.Events[0].Seq != 1 || p.Events[0].Type != belay.EventRunQueued {
			t.Fatalf("log of a new run = %v %v, want [1] [run.queued]", eventSeqs(p.Events), eventTypes(p.Events))
		}
		sameTime(t, "run.queued time", p.Events[0].Time, want.CreatedAt)
		if wantData := belay.RunQueuedEvent(want).Data; !jsonEqual(p.Events[0].Data, wantData) {
			t.Fatalf("run.queued data = %s, want %s", p.Events[0].Data, wantData)
		}
		if p.LastSeq != 1 || p.OldestSeq != 1 || p.Missed || p.Terminal {
			t.Fatalf("page = last %d oldest %d missed %v terminal %v, want 1 1 false false",
				p.LastSeq, p.OldestSeq, p.Missed, p.Terminal)
		}
	})

	t.Run("get_not_found", func(t *testing.T) {
		s := open(t, Options{})
		_, err := s.GetRun(t.Context(), "run-missing")
		wantCode(t, err, belay.CodeNotFound, "GetRun(missing)")
	})

	t.Run("create_invalid", func(t *testing.T) {
		s := open(t, Options{})
		for _, c := range []struct {
			name   string
			mutate func(r *belay.Run)
		}{
			{"no_id", func(r *belay.Run) { r.ID = "" }},
			{"not_queued", func(r *belay.Run) { r.Status = belay.StatusRunning }},
			{"no_creation_time", func(r *belay.Run) { r.CreatedAt, r.UpdatedAt = time.Time{}, time.Time{} }},
		} {
			r := newRun("run-bad", at(0), "hash-bad")
			c.mutate(&r)
			_, _, err := s.CreateRun(t.Context(), r, "key-"+c.name)
			wantCode(t, err, belay.CodeInvalid, name("CreateRun(%s)", c.name))
		}
		if runs, _ := listAll(t, s, belay.ListRunsQuery{Limit: 10}); len(runs) != 0 {
			t.Fatalf("refused creates stored %v", runIDs(runs))
		}
		// The refusals used no idempotency key up.
		mustCreate(t, s, newRun("run-good", at(1), "hash-good"), "key-no_id")
	})

	t.Run("create_keeps_only_creation_fields", func(t *testing.T) {
		s := open(t, Options{})
		asked := newRun("run-fresh", at(0), "hash-fresh")
		asked.Status = ""
		asked.UpdatedAt = time.Time{}
		asked.StartedAt, asked.FinishedAt = at(5), at(6)
		asked.CancelRequested, asked.Reason, asked.ExitCode = true, "made up", intp(3)
		asked.Checks = []belay.CheckResult{{Argv: []string{"true"}}}
		asked.ChangedFiles, asked.Artifacts, asked.LastSeq = []string{"calc.py"}, []string{"result.json"}, 42
		got := mustCreate(t, s, asked, "")
		want := newRun("run-fresh", at(0), "hash-fresh")
		want.LastSeq = 1
		sameRun(t, "CreateRun of a run with later fields set", got, want)
		sameRun(t, "GetRun of it", mustGet(t, s, "run-fresh"), want)
	})

	t.Run("duplicate_id", func(t *testing.T) {
		s := open(t, Options{})
		first := mustCreate(t, s, newRun("run-dup", at(0), "hash-1"), "")
		again := newRun("run-dup", at(5), "hash-2")
		again.Request.Instruction = "something else " + canary
		_, _, err := s.CreateRun(t.Context(), again, "")
		wantCode(t, err, belay.CodeConflict, "CreateRun(existing id)")
		sameRun(t, "run after a rejected duplicate", mustGet(t, s, "run-dup"), first)
		if p := allEvents(t, s, "run-dup"); len(p.Events) != 1 {
			t.Fatalf("duplicate create appended events: %v", eventTypes(p.Events))
		}
	})

	t.Run("record_usage", func(t *testing.T) {
		s := open(t, Options{})
		r := createIn(t, s, "run-usage", belay.StatusRunning)
		ctx := t.Context()
		for _, d := range []belay.UsageDelta{
			{ModelRequests: 1, PromptTokens: 100, CompletionTokens: 20},
			{ModelRequests: 2, PromptTokens: 50, CompletionTokens: 5},
		} {
			if err := s.RecordUsage(ctx, r.ID, d); err != nil {
				t.Fatalf("RecordUsage: %v", err)
			}
		}
		want := belay.Usage{ModelRequests: 3, MaxRequests: r.Usage.MaxRequests, PromptTokens: 150, CompletionTokens: 25}
		if got := mustGet(t, s, r.ID).Usage; got != want {
			t.Fatalf("Usage = %+v, want %+v", got, want)
		}
		wantCode(t, s.RecordUsage(ctx, "run-missing", belay.UsageDelta{ModelRequests: 1}), belay.CodeNotFound, "RecordUsage(missing)")
	})

	t.Run("list_empty", func(t *testing.T) {
		s := open(t, Options{})
		p, err := s.ListRuns(t.Context(), belay.ListRunsQuery{Limit: 10})
		if err != nil {
			t.Fatalf("ListRuns: %v", err)
		}
		if len(p.Runs) != 0 || p.NextCursor != "" {
			t.Fatalf("empty store lists %v, cursor %q", runIDs(p.Runs), p.NextCursor)
		}
	})

	t.Run("list_newest_first", func(t *testing.T) {
		s := open(t, Options{})
		// Created out of time order, with two runs sharing a timestamp, so
		// neither insertion order nor a cursor on time alone is enough.
		created := []struct {
			id  string
			sec int
		}{
			{"run-c", 30}, {"run-a", 10}, {"run-g", 70}, {"run-e", 50},
			{"run-b", 20}, {"run-f", 50}, {"run-d", 40},
		}
		var all []string
		for _, c := range created {
			mustCreate(t, s, newRun(c.id, at(c.sec), "hash-"+c.id), "")
			all = append(all, c.id)
		}
		for _, limit := range []int{1, 2, 3, 6, 7, 10} {
			t.Run(name("limit_%d", limit), func(t *testing.T) {
				runs, pages := listAll(t, s, belay.ListRunsQuery{Limit: limit})
				wantPages := (len(all) + limit - 1) / limit
				if pages != wantPages {
					t.Fatalf("%d pages, want %d (the last page must have an empty NextCursor)", pages, wantPages)
				}
				checkNewestFirst(t, runs)
				if got := sortedCopy(runIDs(runs)); !slices.Equal(got, sortedCopy(all)) {
					t.Fatalf("listed %v, want each of %v once", runIDs(runs), all)
				}
			})
		}
	})

	t.Run("list_status_filter", func(t *testing.T) {
		s := open(t, Options{})
		byStatus := map[belay.RunStatus][]string{}
		for i, st := range []belay.RunStatus{
			belay.StatusRunning, belay.StatusQueued, belay.StatusRunning, belay.StatusCompleted,
			belay.StatusRunning, belay.StatusQueued, belay.StatusFailed, belay.StatusRunning,
		} {
			id := name("run-%02d", i)
			r := mustCreate(t, s, newRun(id, at(i), "hash-"+id), "")
			for j, to := range pathTo(st) {
				r = mustTransition(t, s, id, to, at(100+i*10+j))
			}
			byStatus[st] = append(byStatus[st], r.ID)
		}
		for _, st := range []belay.RunStatus{belay.StatusRunning, belay.StatusQueued, belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled} {
			t.Run(string(st), func(t *testing.T) {
				runs, _ := listAll(t, s, belay.ListRunsQuery{Status: st, Limit: 1})
				checkNewestFirst(t, runs)
				for _, r := range runs {
					if r.Status != st {
						t.Fatalf("filter %s listed %s in state %s", st, r.ID, r.Status)
					}
				}
				if got, want := sortedCopy(runIDs(runs)), sortedCopy(byStatus[st]); !slices.Equal(got, want) {
					t.Fatalf("filter %s listed %v, want %v", st, got, want)
				}
			})
		}
	})

	t.Run("list_invalid_cursor", func(t *testing.T) {
		s := open(t, Options{})
		for i := range 3 {
			mustCreate(t, s, newRun(name("run-%d", i), at(i), name("hash-%d", i)), "")
		}
		for _, c := range []string{
			"!!! not a cursor !!!",
			base64.RawURLEncoding.EncodeToString([]byte("garbage")),
			base64.StdEncoding.EncodeToString([]byte(`{"unexpected":true}`)),
		} {
			_, err := s.ListRuns(t.Context(), belay.ListRunsQuery{Limit: 2, Cursor: c})
			wantCode(t, err, belay.CodeInvalid, name("ListRuns(cursor %q)", c))
		}
	})
}

// listAll follows NextCursor from the first page to the last and returns
// every run listed and the number of pages read.
func listAll(tb testing.TB, s belay.Store, q belay.ListRunsQuery) ([]belay.Run, int) {
	tb.Helper()
	var runs []belay.Run
	pages := 0
	for {
		p, err := s.ListRuns(tb.Context(), q)
		if err != nil {
			tb.Fatalf("ListRuns(page %d): %v", pages+1, err)
		}
		pages++
		if len(p.Runs) > q.Limit {
			tb.Fatalf("page %d has %d runs, limit %d", pages, len(p.Runs), q.Limit)
		}
		if p.NextCursor != "" && len(p.Runs) < q.Limit {
			tb.Fatalf("page %d has %d of %d runs but a NextCursor", pages, len(p.Runs), q.Limit)
		}
		runs = append(runs, p.Runs...)
		if p.NextCursor == "" {
			return runs, pages
		}
		if pages > 100 {
			tb.Fatalf("ListRuns never ends: %d pages", pages)
		}
		q.Cursor = p.NextCursor
	}
}

// checkNewestFirst fails the test unless runs are in non-increasing
// CreatedAt order with no run listed twice.
func checkNewestFirst(tb testing.TB, runs []belay.Run) {
	tb.Helper()
	seen := map[string]bool{}
	for i, r := range runs {
		if seen[r.ID] {
			tb.Fatalf("run %s listed twice: %v", r.ID, runIDs(runs))
		}
		seen[r.ID] = true
		if i > 0 && r.CreatedAt.After(runs[i-1].CreatedAt) {
			tb.Fatalf("not newest first: %s (%v) after %s (%v)", r.ID, r.CreatedAt, runs[i-1].ID, runs[i-1].CreatedAt)
		}
	}
}

func testIdempotency(t *testing.T, open opener) {
	t.Run("same_hash_returns_first_run", func(t *testing.T) {
		s := open(t, Options{})
		first := mustCreate(t, s, newRun("run-first", at(0), "hash-same"), "key-1")
		got, created, err := s.CreateRun(t.Context(), newRun("run-second", at(5), "hash-same"), "key-1")
		if err != nil {
			t.Fatalf("CreateRun(same key, same hash): %v", err)
		}
		if created {
			t.Fatal("CreateRun(same key, same hash): created = true, want false")
		}
		sameRun(t, "repeated CreateRun", got, first)
		_, err = s.GetRun(t.Context(), "run-second")
		wantCode(t, err, belay.CodeNotFound, "GetRun(run of the repeated request)")
		if p := allEvents(t, s, "run-first"); len(p.Events) != 1 {
			t.Fatalf("repeated CreateRun appended events: %v", eventTypes(p.Events))
		}
		if runs, _ := listAll(t, s, belay.ListRunsQuery{Limit: 10}); len(runs) != 1 {
			t.Fatalf("store holds %v, want only run-first", runIDs(runs))
		}
	})

	t.Run("same_hash_returns_current_state", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-first", at(0), "hash-same"), "key-1")
		now := mustTransition(t, s, "run-first", belay.StatusRunning, at(1))
		got, created, err := s.CreateRun(t.Context(), newRun("run-second", at(5), "hash-same"), "key-1")
		if err != nil || created {
			t.Fatalf("CreateRun(same key, same hash) = created %v, %v; want false, nil", created, err)
		}
		sameRun(t, "repeated CreateRun of a running run", got, now)
	})

	t.Run("different_hash_conflicts", func(t *testing.T) {
		s := open(t, Options{})
		first := mustCreate(t, s, newRun("run-first", at(0), "hash-a"), "key-1")
		_, _, err := s.CreateRun(t.Context(), newRun("run-second", at(5), "hash-b"), "key-1")
		wantCode(t, err, belay.CodeConflict, "CreateRun(same key, other hash)")
		_, err = s.GetRun(t.Context(), "run-second")
		wantCode(t, err, belay.CodeNotFound, "GetRun(run of the conflicting request)")
		sameRun(t, "first run after a conflicting repeat", mustGet(t, s, "run-first"), first)
	})

	t.Run("keys_are_independent", func(t *testing.T) {
		s := open(t, Options{})
		mustCreate(t, s, newRun("run-1", at(0), "hash-same"), "key-1")
		mustCreate(t, s, newRun("run-2", at(1), "hash-same"), "key-2")
		// Without a key there is no idempotency: equal requests are two runs.
		mustCreate(t, s, newRun("run-3", at(2), "hash-same"), "")
		mustCreate(t, s, newRun("run-4", at(3), "hash-same"), "")
		if runs, _ := listAll(t, s, belay.ListRunsQuery{Limit: 10}); len(runs) != 4 {
			t.Fatalf("store holds %v, want 4 runs", runIDs(runs))
		}
	})
}
