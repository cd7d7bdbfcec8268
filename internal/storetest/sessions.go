package storetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// newSession is an idle session over one uploaded file, with a skill.
func newSession(id string) belay.Session {
	return belay.Session{
		ID: id, Status: belay.SessionIdle, CreatedAt: at(0), UpdatedAt: at(0),
		Request: belay.SessionRequest{
			Model:        testModel,
			Files:        []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n# " + canary + "\n"}},
			AllowedPaths: []string{"calc.py"}, Checks: [][]string{{"python3", "-m", "pytest", "-q"}},
			MaxSteps: 4, WallTimeSeconds: 60, Approval: belay.ApprovalConfig{Policy: belay.PolicyDenyAll},
			Skills: []belay.Skill{{Name: "style", Description: "how we write Python", Body: "Use four spaces."}},
		},
	}
}

// testSessions holds the session store to its contract: a session round
// trips whole, turns start one at a time (conflict while one runs or once
// closed), a turn's end is recorded once with the session's usage and
// head, closing is idempotent, and of concurrent StartTurn calls exactly
// one wins.
func testSessions(t *testing.T, open opener) {
	t.Run("lifecycle", func(t *testing.T) {
		s := open(t, Options{})
		ctx := t.Context()
		sess := newSession("ses_life")
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		wantCode(t, s.CreateSession(ctx, sess), belay.CodeConflict, "CreateSession(same id)")
		_, err := s.GetSession(ctx, "ses_missing")
		wantCode(t, err, belay.CodeNotFound, "GetSession(missing)")

		got, err := s.GetSession(ctx, sess.ID)
		if err != nil {
			t.Fatalf("GetSession: %v", err)
		}
		if got.Status != belay.SessionIdle || len(got.Turns) != 0 || !got.CreatedAt.Equal(at(0)) ||
			len(got.Request.Files) != 1 || got.Request.Files[0].Content != sess.Request.Files[0].Content ||
			len(got.Request.Skills) != 1 || got.Request.Skills[0].Body != "Use four spaces." || got.Request.MaxSteps != 4 {
			t.Fatalf("GetSession = %+v; want the session as created", got)
		}

		t1 := belay.Turn{Turn: 1, RunID: "run_t1", Text: "fix add", CreatedAt: at(1)}
		got, err = s.StartTurn(ctx, sess.ID, t1)
		if err != nil || got.Status != belay.SessionRunning || len(got.Turns) != 1 || got.Turns[0].Status != belay.StatusQueued {
			t.Fatalf("StartTurn(1) = %+v, %v; want running with turn 1 queued", got, err)
		}
		_, err = s.StartTurn(ctx, sess.ID, belay.Turn{Turn: 2, RunID: "run_t2", Text: "more", CreatedAt: at(2)})
		wantCode(t, err, belay.CodeConflict, "StartTurn while turn 1 runs")
		_, err = s.FinishTurn(ctx, sess.ID, belay.TurnEnd{Turn: 2, Status: belay.StatusCompleted, At: at(3)})
		wantCode(t, err, belay.CodeConflict, "FinishTurn(a turn that is not the last)")

		end := belay.TurnEnd{Turn: 1, Status: belay.StatusCompleted, At: at(3), Summary: "add adds",
			ChangedFiles: []string{"calc.py"}, Usage: belay.Usage{ModelRequests: 3, MaxRequests: 6, PromptTokens: 10, CompletionTokens: 5}}
		got, err = s.FinishTurn(ctx, sess.ID, end)
		if err != nil || got.Status != belay.SessionIdle || got.Turns[0].Status != belay.StatusCompleted ||
			got.Turns[0].Summary != "add adds" || got.Usage.ModelRequests != 3 || got.Head == nil || got.Head.RunID != "run_t1" {
			t.Fatalf("FinishTurn(1) = %+v, %v; want idle, turn 1 completed, usage and head set", got, err)
		}
		// A second record of the same end changes nothing: usage is not
		// counted twice.
		again := end
		again.Usage.ModelRequests = 100
		got, err = s.FinishTurn(ctx, sess.ID, again)
		if err != nil || got.Usage.ModelRequests != 3 {
			t.Fatalf("FinishTurn(1) again = usage %+v, %v; want unchanged", got.Usage, err)
		}

		if _, err := s.StartTurn(ctx, sess.ID, belay.Turn{Turn: 2, RunID: "run_t2", Text: "more", CreatedAt: at(4)}); err != nil {
			t.Fatalf("StartTurn(2): %v", err)
		}
		got, err = s.FinishTurn(ctx, sess.ID, belay.TurnEnd{Turn: 2, Status: belay.StatusCancelled, At: at(5), Reason: "cancelled by the user",
			Usage: belay.Usage{ModelRequests: 2, MaxRequests: 6}})
		if err != nil || got.Usage.ModelRequests != 5 || got.Usage.MaxRequests != 12 || got.Head.RunID != "run_t1" {
			t.Fatalf("FinishTurn(2, cancelled, no change) = %+v, %v; want usage summed and the head still turn 1", got, err)
		}

		if _, err := s.StartTurn(ctx, sess.ID, belay.Turn{Turn: 3, RunID: "run_t3", Text: "last", CreatedAt: at(6)}); err != nil {
			t.Fatalf("StartTurn(3): %v", err)
		}
		got, err = s.CloseSession(ctx, sess.ID, at(7))
		if err != nil || got.Status != belay.SessionClosed || !got.ClosedAt.Equal(at(7)) {
			t.Fatalf("CloseSession = %+v, %v; want closed at 7", got, err)
		}
		// The turn that ran when it closed still gets its end; the
		// session stays closed.
		got, err = s.FinishTurn(ctx, sess.ID, belay.TurnEnd{Turn: 3, Status: belay.StatusCancelled, At: at(8), Reason: "session closed"})
		if err != nil || got.Status != belay.SessionClosed || got.Turns[2].Status != belay.StatusCancelled {
			t.Fatalf("FinishTurn after close = %+v, %v; want closed with turn 3 cancelled", got, err)
		}
		_, err = s.StartTurn(ctx, sess.ID, belay.Turn{Turn: 4, RunID: "run_t4", Text: "again", CreatedAt: at(9)})
		wantCode(t, err, belay.CodeConflict, "StartTurn on a closed session")
		if got, err := s.CloseSession(ctx, sess.ID, at(10)); err != nil || !got.ClosedAt.Equal(at(7)) {
			t.Fatalf("CloseSession again = %+v, %v; want closed at 7, unchanged", got.ClosedAt, err)
		}
		got, err = s.GetSession(ctx, sess.ID)
		if err != nil || len(got.Turns) != 3 || got.Turns[1].Reason != "cancelled by the user" || got.Turns[2].Text != "last" {
			t.Fatalf("GetSession at the end = %+v, %v; want three turns as recorded", got, err)
		}
		_, err = s.CloseSession(ctx, "ses_missing", at(1))
		wantCode(t, err, belay.CodeNotFound, "CloseSession(missing)")
	})

	t.Run("refused", func(t *testing.T) {
		s := open(t, Options{})
		ctx := t.Context()
		bad := newSession("not-a-session-id")
		err := s.CreateSession(ctx, bad)
		wantCode(t, err, belay.CodeInvalid, "CreateSession(bad id)")
		if err != nil && strings.Contains(err.Error(), canary) {
			t.Errorf("the error repeats file content: %v", err)
		}
		skills := newSession("ses_skills")
		skills.Request.Skills = append(skills.Request.Skills, skills.Request.Skills[0])
		wantCode(t, s.CreateSession(ctx, skills), belay.CodeInvalid, "CreateSession(a skill named twice)")
		if _, err := s.GetSession(ctx, "ses_skills"); !belay.IsCode(err, belay.CodeNotFound) {
			t.Errorf("a refused session was stored: %v", err)
		}
	})

	t.Run("one turn at a time", func(t *testing.T) {
		s := open(t, Options{})
		ctx := t.Context()
		sess := newSession("ses_race")
		if err := s.CreateSession(ctx, sess); err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = s.StartTurn(ctx, sess.ID, belay.Turn{Turn: 1, RunID: fmt.Sprintf("run_race%d", i), Text: "go", CreatedAt: at(1)})
			})
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !belay.IsCode(err, belay.CodeConflict):
				t.Errorf("StartTurn %d: %v; want success or conflict", i, err)
			}
		}
		got, err := s.GetSession(ctx, sess.ID)
		if won != 1 || err != nil || len(got.Turns) != 1 {
			t.Fatalf("%d of %d concurrent StartTurn calls won, session has %d turns (%v); want exactly one", won, n, len(got.Turns), err)
		}
	})
}

// testConnections holds the connection store to its contract: a
// connection round trips and is listed with its session, advancing is
// conditional on what was sent (of concurrent pushers one wins), and
// deleting is idempotent.
func testConnections(t *testing.T, open opener) {
	s := open(t, Options{})
	ctx := t.Context()
	c := belay.Connection{ID: "L0SM9cOFvHcCIhw=", SessionID: "ses_conn", ConnectedAt: at(1), Sent: 5}
	if err := s.PutConnection(ctx, c); err != nil {
		t.Fatalf("PutConnection: %v", err)
	}
	other := belay.Connection{ID: "other=", SessionID: "ses_other", ConnectedAt: at(2)}
	if err := s.PutConnection(ctx, other); err != nil {
		t.Fatalf("PutConnection(other): %v", err)
	}
	wantCode(t, s.PutConnection(ctx, belay.Connection{ID: "a#b", SessionID: "ses_conn", ConnectedAt: at(1)}), belay.CodeInvalid, "PutConnection(bad id)")
	got, err := s.GetConnection(ctx, c.ID)
	if err != nil || got != c {
		t.Fatalf("GetConnection = %+v, %v; want %+v", got, err, c)
	}
	_, err = s.GetConnection(ctx, "missing")
	wantCode(t, err, belay.CodeNotFound, "GetConnection(missing)")
	list, err := s.SessionConnections(ctx, "ses_conn")
	if err != nil || len(list) != 1 || list[0] != c {
		t.Fatalf("SessionConnections = %+v, %v; want only %+v", list, err, c)
	}
	if list, err := s.SessionConnections(ctx, "ses_none"); err != nil || list == nil || len(list) != 0 {
		t.Fatalf("SessionConnections(none) = %#v, %v; want empty", list, err)
	}

	if moved, err := s.AdvanceConnection(ctx, c.ID, 4, 9); err != nil || moved {
		t.Fatalf("AdvanceConnection(from a stale 4) = %v, %v; want false", moved, err)
	}
	const n = 6
	var wg sync.WaitGroup
	wins := make([]bool, n)
	for i := range n {
		wg.Go(func() {
			moved, err := s.AdvanceConnection(ctx, c.ID, 5, int64(10+i))
			if err != nil {
				t.Errorf("AdvanceConnection: %v", err)
			}
			wins[i] = moved
		})
	}
	wg.Wait()
	won := -1
	for i, w := range wins {
		if w {
			if won >= 0 {
				t.Fatalf("AdvanceConnection from 5 succeeded twice (%d and %d)", won, i)
			}
			won = i
		}
	}
	if got, _ := s.GetConnection(ctx, c.ID); won < 0 || got.Sent != int64(10+won) {
		t.Fatalf("after the race sent = %d (winner %d)", got.Sent, won)
	}

	if err := s.DeleteConnection(ctx, c.ID); err != nil {
		t.Fatalf("DeleteConnection: %v", err)
	}
	if err := s.DeleteConnection(ctx, c.ID); err != nil {
		t.Fatalf("DeleteConnection again: %v", err)
	}
	if _, err := s.GetConnection(ctx, c.ID); !belay.IsCode(err, belay.CodeNotFound) {
		t.Fatalf("GetConnection after delete: %v", err)
	}
	if moved, err := s.AdvanceConnection(ctx, c.ID, 15, 20); err != nil || moved {
		t.Fatalf("AdvanceConnection(deleted) = %v, %v; want false", moved, err)
	}
	if list, err := s.SessionConnections(ctx, "ses_conn"); err != nil || len(list) != 0 {
		t.Fatalf("SessionConnections after delete = %+v, %v", list, err)
	}
}
