package belay_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

func TestCompactConversation(t *testing.T) {
	turn := func(n int, text, summary string) belay.Turn {
		return belay.Turn{Turn: n, RunID: fmt.Sprintf("run_%d", n), Status: belay.StatusCompleted, Text: text, Summary: summary,
			ChangedFiles: []string{"calc.py"}}
	}
	t.Run("short: every turn whole", func(t *testing.T) {
		got := belay.CompactConversation([]belay.Turn{turn(1, "fix add", "fixed"), turn(2, "add sub", "added")})
		if len(got) != 4 || got[0] != (belay.ConversationMessage{Role: "user", Content: "fix add"}) ||
			got[1].Role != "assistant" || !strings.HasPrefix(got[1].Content, "fixed\n[turn 1 completed; changed: calc.py]") ||
			got[2].Content != "add sub" {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("a cancelled turn says it changed nothing", func(t *testing.T) {
		c := belay.Turn{Turn: 1, RunID: "run_1", Status: belay.StatusCancelled, Text: "go", Reason: "cancelled by the user"}
		got := belay.CompactConversation([]belay.Turn{c})
		if !strings.Contains(got[1].Content, "ended cancelled without a summary: cancelled by the user") || !strings.Contains(got[1].Content, "changed nothing") {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("long: within the budget, newest whole, older folded, oldest counted", func(t *testing.T) {
		var turns []belay.Turn
		for n := 1; n <= 100; n++ {
			turns = append(turns, turn(n, fmt.Sprintf("message %d: %s", n, strings.Repeat("x", 2000)), fmt.Sprintf("answer %d", n)))
		}
		got := belay.CompactConversation(turns)
		size := 0
		for _, m := range got {
			size += len(m.Content)
		}
		if size > belay.MaxConversationBytes {
			t.Fatalf("the conversation holds %d bytes; the budget is %d", size, belay.MaxConversationBytes)
		}
		if err := belay.CheckTurnContext(belay.TurnContext{SessionID: "ses_x", Turn: 101 - 1, Conversation: got}); err != nil {
			t.Fatalf("the compacted conversation does not pass CheckTurnContext: %v", err)
		}
		last := got[len(got)-2]
		if !strings.HasPrefix(last.Content, "message 100: ") || len(last.Content) < 2000 {
			t.Errorf("the newest turn is not whole: %.40q", last.Content)
		}
		if !strings.HasPrefix(got[0].Content, "Earlier turns of this session, compacted:\n(") || !strings.Contains(got[0].Content, "earlier turns omitted") {
			t.Errorf("the older turns are not folded and counted: %.200q", got[0].Content)
		}
		if !strings.Contains(got[0].Content, "answer 90") {
			t.Errorf("the fold lacks a recent older turn: %.400q", got[0].Content)
		}
	})
}

func TestSessionTurns(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := belay.Session{ID: "ses_a", Status: belay.SessionIdle, CreatedAt: at}
	s, err := s.StartTurn(belay.Turn{Turn: 1, RunID: "run_1", Text: "a", CreatedAt: at})
	if err != nil || s.Status != belay.SessionRunning {
		t.Fatalf("StartTurn: %+v, %v", s, err)
	}
	if _, err := s.StartTurn(belay.Turn{Turn: 2, RunID: "run_2", Text: "b", CreatedAt: at}); !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("StartTurn while running: %v", err)
	}
	if _, _, err := s.FinishTurn(belay.TurnEnd{Turn: 1, Status: belay.StatusRunning, At: at}); !belay.IsCode(err, belay.CodeInvalid) {
		t.Fatalf("FinishTurn(running): %v", err)
	}
	closed, changed := s.Close(at)
	if !changed || closed.Status != belay.SessionClosed {
		t.Fatalf("Close: %+v", closed)
	}
	if _, err := closed.StartTurn(belay.Turn{Turn: 2, RunID: "run_2", Text: "b", CreatedAt: at}); !belay.IsCode(err, belay.CodeConflict) ||
		!strings.Contains(err.Error(), "closed") {
		t.Fatalf("StartTurn on a closed session: %v", err)
	}
	if a, b := belay.SplitSessionSeq(belay.SessionSeq(3, 17)); a != 3 || b != 17 {
		t.Errorf("SplitSessionSeq(SessionSeq(3, 17)) = %d, %d", a, b)
	}
}

func TestParseSessionRequest(t *testing.T) {
	lim := belay.DefaultLimits("m")
	ok := `{"source": {"files": [{"path": "calc.py", "content": "x = 1\n"}]}, "allowedPaths": ["calc.py"],
		"checks": [["python3", "-m", "pytest", "-q"]], "skills": [{"name": "style", "description": "d", "body": "b"}], "maxSteps": 3}`
	req, err := belay.ParseSessionRequest([]byte(ok), lim)
	if err != nil || req.Model != "m" || req.MaxSteps != 3 || req.WallTimeSeconds != lim.DefaultWallTimeSeconds || len(req.Skills) != 1 {
		t.Fatalf("ParseSessionRequest(ok) = %+v, %v", req, err)
	}
	for name, tc := range map[string]struct {
		body, field string
	}{
		"no source":         {`{"allowedPaths": ["calc.py"], "checks": [["python3", "-m", "pytest", "-q"]]}`, "source"},
		"both sources":      {`{"source": {"files": [{"path": "a.py", "content": ""}], "git": {"url": "https://example.com/r.git"}}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]]}`, "source"},
		"a commit":          {`{"source": {"git": {"url": "https://example.com/r.git", "commit": "abc"}}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]]}`, ""},
		"an instruction":    {`{"instruction": "x", "source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]]}`, ""},
		"a fraction":        {`{"source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]], "maxSteps": 2.5}`, "maxSteps"},
		"zero steps":        {`{"source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]], "maxSteps": 0}`, "maxSteps"},
		"unlisted check":    {`{"source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["a.py"], "checks": [["sh", "-c", "x"]]}`, "checks[0]"},
		"allowed not there": {`{"source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["b.py"], "checks": [["python3", "-m", "pytest", "-q"]]}`, "allowedPaths[0]"},
		"bad skill name":    {`{"source": {"files": [{"path": "a.py", "content": ""}]}, "allowedPaths": ["a.py"], "checks": [["python3", "-m", "pytest", "-q"]], "skills": [{"name": "Bad Name", "description": "d", "body": "b"}]}`, "skills[0].name"},
		"trailing data":     {ok + ` {}`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := belay.ParseSessionRequest([]byte(tc.body), lim)
			var be *belay.Error
			if !errors.As(err, &be) || be.Code != belay.CodeInvalid || (tc.field != "" && be.Field != tc.field) {
				t.Fatalf("err = %#v; want invalid naming %q", err, tc.field)
			}
		})
	}
}
