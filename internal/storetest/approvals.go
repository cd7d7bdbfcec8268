package storetest

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// newApproval returns a pending shell approval requested at second sec.
func newApproval(runID, id string, sec int) belay.Approval {
	return belay.Approval{
		ID: id, RunID: runID, Tool: "shell",
		Arguments:   json.RawMessage(`{"command":"ls -la"}`),
		Status:      belay.ApprovalPending,
		RequestedAt: at(sec),
		ExpiresAt:   at(sec + 120),
	}
}

// sameApproval fails the test unless got and want are the same approval.
func sameApproval(tb testing.TB, what string, got, want belay.Approval) {
	tb.Helper()
	if got.ID != want.ID || got.RunID != want.RunID || got.Tool != want.Tool || !jsonEqual(got.Arguments, want.Arguments) ||
		got.Status != want.Status || got.Decision != want.Decision || got.Reason != want.Reason || got.DecidedBy != want.DecidedBy ||
		!got.RequestedAt.Equal(want.RequestedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) || !got.DecidedAt.Equal(want.DecidedAt) {
		tb.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// mustApproval returns the stored approval.
func mustApproval(tb testing.TB, s belay.Store, runID, id string) belay.Approval {
	tb.Helper()
	a, err := s.GetApproval(tb.Context(), runID, id)
	if err != nil {
		tb.Fatalf("GetApproval(%s, %s): %v", runID, id, err)
	}
	return a
}

// wantApprovalEvent fails the test unless e is an event of type typ about
// approval a, at time when: a client following the log must be able to tell
// which approval it concerns, and every adapter writes the same data
// (belay.ApprovalRequestedEvent, belay.ApprovalDecidedEvent).
func wantApprovalEvent(tb testing.TB, e belay.Event, seq int64, typ string, a belay.Approval, when time.Time) {
	tb.Helper()
	var data struct {
		ApprovalID string `json:"approvalId"`
	}
	if e.Seq != seq || e.Type != typ || !e.Time.Equal(when) {
		tb.Fatalf("event = %d %s %v, want %d %s %v", e.Seq, e.Type, e.Time, seq, typ, when)
	}
	if err := json.Unmarshal(e.Data, &data); err != nil || data.ApprovalID != a.ID {
		tb.Fatalf("%s event data %s does not name approvalId %q", typ, e.Data, a.ID)
	}
	want := belay.ApprovalDecidedEvent(a)
	if typ == belay.EventApprovalRequested {
		var err error
		if want, err = belay.ApprovalRequestedEvent(a); err != nil {
			tb.Fatalf("ApprovalRequestedEvent: %v", err)
		}
	}
	if !jsonEqual(e.Data, want.Data) {
		tb.Fatalf("%s event data = %s, want %s", typ, e.Data, want.Data)
	}
}

func testApprovals(t *testing.T, open opener) {
	t.Run("create_pending", func(t *testing.T) {
		s := open(t, Options{})
		r := createIn(t, s, "run-a", belay.StatusRunning)
		a := newApproval("run-a", "appr-1", 100)
		got, err := s.CreateApproval(t.Context(), a)
		if err != nil {
			t.Fatalf("CreateApproval: %v", err)
		}
		sameApproval(t, "CreateApproval", got, a)
		sameApproval(t, "GetApproval", mustApproval(t, s, "run-a", "appr-1"), a)
		p := allEvents(t, s, "run-a")
		if p.LastSeq != r.LastSeq+1 {
			t.Fatalf("lastSeq = %d, want %d", p.LastSeq, r.LastSeq+1)
		}
		wantApprovalEvent(t, p.Events[len(p.Events)-1], r.LastSeq+1, belay.EventApprovalRequested, a, a.RequestedAt)
	})

	t.Run("create_invalid", func(t *testing.T) {
		s := open(t, Options{})
		r := createIn(t, s, "run-a", belay.StatusRunning)
		for _, c := range []struct {
			name   string
			mutate func(a *belay.Approval)
		}{
			{"no_id", func(a *belay.Approval) { a.ID = "" }},
			{"no_run", func(a *belay.Approval) { a.RunID = "" }},
			{"no_tool", func(a *belay.Approval) { a.Tool = "" }},
			{"arguments_not_json", func(a *belay.Approval) { a.Arguments = json.RawMessage(`{"command":`) }},
			{"no_status", func(a *belay.Approval) { a.Status = "" }},
			{"unknown_status", func(a *belay.Approval) { a.Status = "maybe" }},
			{"pending_with_decision", func(a *belay.Approval) { a.Decision = belay.DecisionDeny }},
			{"decided_without_decision", func(a *belay.Approval) { a.Status = belay.ApprovalDecided }},
			{"decided_unknown_decision", func(a *belay.Approval) { a.Status, a.Decision = belay.ApprovalDecided, "perhaps" }},
		} {
			a := newApproval("run-a", "appr-"+c.name, 100)
			c.mutate(&a)
			_, err := s.CreateApproval(t.Context(), a)
			wantCode(t, err, belay.CodeInvalid, name("CreateApproval(%s)", c.name))
		}
		if l, err := s.ListApprovals(t.Context(), "run-a"); err != nil || len(l) != 0 {
			t.Fatalf("ListApprovals after refused creates = %d approvals, %v; want 0", len(l), err)
		}
		if got := mustGet(t, s, "run-a").LastSeq; got != r.LastSeq {
			t.Fatalf("refused creates appended events: lastSeq %d, want %d", got, r.LastSeq)
		}
	})

	t.Run("create_decided_by_policy", func(t *testing.T) {
		s := open(t, Options{})
		r := createIn(t, s, "run-a", belay.StatusRunning)
		a := newApproval("run-a", "appr-1", 100)
		a.Tool = "run_check"
		a.Status, a.Decision, a.DecidedBy, a.Reason, a.DecidedAt = belay.ApprovalDecided, belay.DecisionAllowOnce, "policy", "allowed by policy ask", at(100)
		got, err := s.CreateApproval(t.Context(), a)
		if err != nil {
			t.Fatalf("CreateApproval(decided): %v", err)
		}
		sameApproval(t, "CreateApproval(decided)", got, a)
		sameApproval(t, "GetApproval", mustApproval(t, s, "run-a", "appr-1"), a)
		p := allEvents(t, s, "run-a")
		if p.LastSeq != r.LastSeq+2 {
			t.Fatalf("lastSeq = %d, want %d (requested and decided)", p.LastSeq, r.LastSeq+2)
		}
		n := len(p.Events)
		wantApprovalEvent(t, p.Events[n-2], r.LastSeq+1, belay.EventApprovalRequested, a, a.RequestedAt)
		wantApprovalEvent(t, p.Events[n-1], r.LastSeq+2, belay.EventApprovalDecided, a, a.DecidedAt)
		_, err = s.DecideApproval(t.Context(), "run-a", "appr-1", belay.DecisionDeny, "too late", "user", at(101))
		wantCode(t, err, belay.CodeConflict, "DecideApproval(decided by policy)")
		sameApproval(t, "approval after a refused decision", mustApproval(t, s, "run-a", "appr-1"), a)
	})

	t.Run("decide", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-a", belay.StatusRunning)
		a := newApproval("run-a", "appr-1", 100)
		if _, err := s.CreateApproval(t.Context(), a); err != nil {
			t.Fatalf("CreateApproval: %v", err)
		}
		before := mustGet(t, s, "run-a").LastSeq
		got, err := s.DecideApproval(t.Context(), "run-a", "appr-1", belay.DecisionDeny, "not on my machine", "user", at(130))
		if err != nil {
			t.Fatalf("DecideApproval: %v", err)
		}
		want := a
		want.Status, want.Decision, want.Reason, want.DecidedBy, want.DecidedAt = belay.ApprovalDecided, belay.DecisionDeny, "not on my machine", "user", at(130)
		sameApproval(t, "DecideApproval", got, want)
		sameApproval(t, "GetApproval after a decision", mustApproval(t, s, "run-a", "appr-1"), want)
		p := allEvents(t, s, "run-a")
		if p.LastSeq != before+1 {
			t.Fatalf("lastSeq = %d, want %d", p.LastSeq, before+1)
		}
		wantApprovalEvent(t, p.Events[len(p.Events)-1], before+1, belay.EventApprovalDecided, want, at(130))

		_, err = s.DecideApproval(t.Context(), "run-a", "appr-1", belay.DecisionAllowSession, "changed my mind", "user", at(131))
		wantCode(t, err, belay.CodeConflict, "second DecideApproval")
		sameApproval(t, "approval after a second decision", mustApproval(t, s, "run-a", "appr-1"), want)
		if p2 := allEvents(t, s, "run-a"); p2.LastSeq != p.LastSeq {
			t.Fatalf("second decision appended events: lastSeq %d, want %d", p2.LastSeq, p.LastSeq)
		}
	})

	t.Run("list_oldest_first", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-a", belay.StatusRunning)
		createIn(t, s, "run-b", belay.StatusRunning)
		l, err := s.ListApprovals(t.Context(), "run-a")
		if err != nil || len(l) != 0 {
			t.Fatalf("ListApprovals(none) = %d approvals, %v; want 0, nil", len(l), err)
		}
		// Ids out of alphabetical order, so the list follows time, not ids.
		var want []belay.Approval
		for i, id := range []string{"appr-c", "appr-a", "appr-b"} {
			a := newApproval("run-a", id, 100+i)
			if _, err := s.CreateApproval(t.Context(), a); err != nil {
				t.Fatalf("CreateApproval(%s): %v", id, err)
			}
			want = append(want, a)
		}
		if _, err := s.CreateApproval(t.Context(), newApproval("run-b", "appr-z", 99)); err != nil {
			t.Fatalf("CreateApproval(run-b): %v", err)
		}
		d, err := s.DecideApproval(t.Context(), "run-a", "appr-a", belay.DecisionAllowOnce, "", "user", at(150))
		if err != nil {
			t.Fatalf("DecideApproval: %v", err)
		}
		want[1] = d
		got, err := s.ListApprovals(t.Context(), "run-a")
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		ids := make([]string, len(got))
		for i, a := range got {
			ids[i] = a.ID
		}
		if !slices.Equal(ids, []string{"appr-c", "appr-a", "appr-b"}) {
			t.Fatalf("ListApprovals = %v, want [appr-c appr-a appr-b]", ids)
		}
		for i := range want {
			sameApproval(t, name("ListApprovals[%d]", i), got[i], want[i])
		}
	})

	t.Run("list_same_instant_in_stored_order", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-a", belay.StatusRunning)
		ids := []string{"appr-z", "appr-m", "appr-a"}
		for _, id := range ids {
			if _, err := s.CreateApproval(t.Context(), newApproval("run-a", id, 100)); err != nil {
				t.Fatalf("CreateApproval(%s): %v", id, err)
			}
		}
		got, err := s.ListApprovals(t.Context(), "run-a")
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		listed := make([]string, len(got))
		for i, a := range got {
			listed[i] = a.ID
		}
		if !slices.Equal(listed, ids) {
			t.Fatalf("approvals requested at one instant listed %v, want the order they were stored %v", listed, ids)
		}
	})

	t.Run("not_found", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-a", belay.StatusRunning)
		ctx := t.Context()
		_, err := s.CreateApproval(ctx, newApproval("run-missing", "appr-1", 1))
		wantCode(t, err, belay.CodeNotFound, "CreateApproval(missing run)")
		_, err = s.GetApproval(ctx, "run-a", "appr-missing")
		wantCode(t, err, belay.CodeNotFound, "GetApproval(missing approval)")
		_, err = s.GetApproval(ctx, "run-missing", "appr-1")
		wantCode(t, err, belay.CodeNotFound, "GetApproval(missing run)")
		_, err = s.ListApprovals(ctx, "run-missing")
		wantCode(t, err, belay.CodeNotFound, "ListApprovals(missing run)")
		_, err = s.DecideApproval(ctx, "run-a", "appr-missing", belay.DecisionDeny, "", "user", at(2))
		wantCode(t, err, belay.CodeNotFound, "DecideApproval(missing approval)")
		_, err = s.DecideApproval(ctx, "run-missing", "appr-1", belay.DecisionDeny, "", "user", at(2))
		wantCode(t, err, belay.CodeNotFound, "DecideApproval(missing run)")
		// An approval belongs to its run: another run's id does not find it.
		createIn(t, s, "run-b", belay.StatusRunning)
		if _, err := s.CreateApproval(ctx, newApproval("run-b", "appr-b", 1)); err != nil {
			t.Fatalf("CreateApproval: %v", err)
		}
		_, err = s.GetApproval(ctx, "run-a", "appr-b")
		wantCode(t, err, belay.CodeNotFound, "GetApproval(approval of another run)")
	})

	t.Run("duplicate_id", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-a", belay.StatusRunning)
		a := newApproval("run-a", "appr-1", 100)
		if _, err := s.CreateApproval(t.Context(), a); err != nil {
			t.Fatalf("CreateApproval: %v", err)
		}
		last := mustGet(t, s, "run-a").LastSeq
		again := newApproval("run-a", "appr-1", 200)
		again.Tool = "other"
		_, err := s.CreateApproval(t.Context(), again)
		wantCode(t, err, belay.CodeConflict, "CreateApproval(existing id)")
		sameApproval(t, "approval after a duplicate", mustApproval(t, s, "run-a", "appr-1"), a)
		if got := mustGet(t, s, "run-a").LastSeq; got != last {
			t.Fatalf("duplicate CreateApproval appended events: lastSeq %d, want %d", got, last)
		}
	})

	for _, term := range []belay.RunStatus{belay.StatusCompleted, belay.StatusFailed, belay.StatusCancelled} {
		t.Run("terminal_"+string(term), func(t *testing.T) {
			s := open(t, Options{})
			mustCreate(t, s, newRun("run-a", at(0), "hash-a"), "")
			if term != belay.StatusCancelled {
				mustTransition(t, s, "run-a", belay.StatusRunning, at(1))
			}
			pending := newApproval("run-a", "appr-pending", 2)
			if _, err := s.CreateApproval(t.Context(), pending); err != nil {
				t.Fatalf("CreateApproval: %v", err)
			}
			done := mustTransition(t, s, "run-a", term, at(3))

			_, err := s.CreateApproval(t.Context(), newApproval("run-a", "appr-late", 4))
			wantCode(t, err, belay.CodeConflict, "CreateApproval(terminal run)")
			_, err = s.GetApproval(t.Context(), "run-a", "appr-late")
			wantCode(t, err, belay.CodeNotFound, "GetApproval(refused approval)")
			_, err = s.DecideApproval(t.Context(), "run-a", "appr-pending", belay.DecisionAllowOnce, "", "user", at(5))
			wantCode(t, err, belay.CodeConflict, "DecideApproval(terminal run)")
			sameApproval(t, "pending approval of a terminal run", mustApproval(t, s, "run-a", "appr-pending"), pending)
			sameRun(t, "terminal run after refused approvals", mustGet(t, s, "run-a"), done)
		})
	}
}
