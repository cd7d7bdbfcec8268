package belay

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// SessionStatus is where a session is: idle between turns, running while a
// turn's run has not ended, closed for good.
type SessionStatus string

// The session states: idle ⇄ running, and either → closed. A closed
// session never changes again.
const (
	SessionIdle    SessionStatus = "idle"
	SessionRunning SessionStatus = "running"
	SessionClosed  SessionStatus = "closed"
)

// Session is a conversation with the agent over one workspace (DESIGN.md
// "Sessions (multi-turn)"): turn after turn, each a run started from the
// workspace as the turns before it left it, with the conversation so far
// in the agent's context.
type Session struct {
	ID        string         `json:"sessionId"`
	Status    SessionStatus  `json:"status"`
	Request   SessionRequest `json:"request"`
	CreatedAt time.Time      `json:"createdAt"`
	UpdatedAt time.Time      `json:"updatedAt"`
	ClosedAt  time.Time      `json:"closedAt,omitzero"`
	// Turns are the session's turns, oldest first; Turns[i].Turn is i+1.
	Turns []Turn `json:"turns"`
	// Usage totals the usage of the turns that ended.
	Usage Usage `json:"usage"`
	// Head is the workspace after the last turn that changed it: nil while
	// no turn has.
	Head *SessionHead `json:"head,omitempty"`
	// Version counts the writes to the session; stores write on the
	// condition that it did not move since they read.
	Version int64 `json:"-"`
}

// SessionRequest is what a session was created with: the run request of
// every turn but the instruction (the turn's text), and the skills.
type SessionRequest struct {
	Model string `json:"model"`
	// Files is the uploaded tree; Source a git repository (fetched by the
	// control plane when the first turn starts). Exactly one is set.
	Files           []File         `json:"files,omitempty"`
	Source          *Source        `json:"source,omitempty"`
	AllowedPaths    []string       `json:"allowedPaths"`
	Checks          [][]string     `json:"checks"`
	MaxSteps        int            `json:"maxSteps"`
	WallTimeSeconds int            `json:"wallTimeSeconds"`
	Approval        ApprovalConfig `json:"approval"`
	Skills          []Skill        `json:"skills,omitempty"`
}

// Skill is a named instruction document: its name and description go into
// the agent's system prompt, and the agent reads its body with the
// read_skill tool.
type Skill struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Body        string `json:"body"`
}

// Turn is one turn of a session: the person's text and the run that
// answered it.
type Turn struct {
	Turn       int       `json:"turn"`
	RunID      string    `json:"runId"`
	Status     RunStatus `json:"status"`
	Text       string    `json:"text"`
	CreatedAt  time.Time `json:"createdAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
	// Summary is what the agent answered (its finish summary); Reason why
	// the run ended when it did not complete.
	Summary      string   `json:"summary,omitempty"`
	Reason       string   `json:"reason,omitempty"`
	ChangedFiles []string `json:"changedFiles,omitempty"`
	Usage        Usage    `json:"usage"`
}

// SessionHead is the workspace after the last turn that changed it (its
// run ended with a validated patch, whatever its checks said): that
// turn and its run, and every file the session changed so far (against the
// session's base: the uploaded tree or the fetched commit).
type SessionHead struct {
	Turn         int      `json:"turn"`
	RunID        string   `json:"runId"`
	ChangedFiles []string `json:"changedFiles"`
}

// TurnEnd is what the control plane records when a turn's run has ended.
type TurnEnd struct {
	Turn         int
	Status       RunStatus
	At           time.Time
	Summary      string
	Reason       string
	ChangedFiles []string
	Usage        Usage
}

// TurnContext is what a session turn's run carries besides its
// instruction: the session and turn, the conversation of the earlier
// turns (compacted) and the session's skills. Only the control plane
// sets it; a body of POST /v1/runs cannot.
type TurnContext struct {
	SessionID    string                `json:"sessionId"`
	Turn         int                   `json:"turn"`
	Conversation []ConversationMessage `json:"conversation,omitempty"`
	Skills       []Skill               `json:"skills,omitempty"`
}

// ConversationMessage is one message of an earlier turn as the agent of a
// later turn sees it: the person's text (role user) or the agent's answer
// (role assistant).
type ConversationMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Session limits. The skills and the conversation travel in every turn's
// run record and sandbox spec, so they are bounded well under a record's
// size.
const (
	MaxSkills          = 16
	MaxSkillNameLen    = 64
	MaxSkillDescLen    = 1024
	MaxSkillBodyBytes  = 32 << 10
	MaxSkillsBytes     = 64 << 10
	MaxSessionTurns    = 100
	MaxConversationLen = 2 * MaxSessionTurns
	// MaxConversationBytes is the compaction budget: the conversation a
	// turn carries holds at most this many bytes of message text (see
	// CompactConversation).
	MaxConversationBytes = 24 << 10
)

// CheckSkills returns invalid for skills a session may not have: more than
// MaxSkills, a name that is not 1–64 of [a-z0-9_-] or is repeated, an empty
// or overlong description, a body that is empty, not UTF-8, holds NUL, or
// is over MaxSkillBodyBytes, or more than MaxSkillsBytes in all.
func CheckSkills(skills []Skill) error {
	if len(skills) > MaxSkills {
		return FieldErrorf(CodeInvalid, "skills", "has %d skills; at most %d are allowed", len(skills), MaxSkills)
	}
	total := 0
	seen := map[string]bool{}
	for i, s := range skills {
		field := fmt.Sprintf("skills[%d]", i)
		switch {
		case s.Name == "" || len(s.Name) > MaxSkillNameLen || strings.ContainsFunc(s.Name, func(r rune) bool {
			return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_')
		}):
			return FieldErrorf(CodeInvalid, field+".name", "must be 1 to %d characters of a-z, 0-9, - and _", MaxSkillNameLen)
		case seen[s.Name]:
			return FieldErrorf(CodeInvalid, field+".name", "%s is given twice", quote(s.Name))
		case strings.TrimSpace(s.Description) == "" || utf8.RuneCountInString(s.Description) > MaxSkillDescLen || !isPrintableText(s.Description):
			return FieldErrorf(CodeInvalid, field+".description", "must be 1 to %d characters of text", MaxSkillDescLen)
		case strings.TrimSpace(s.Body) == "" || !utf8.ValidString(s.Body) || strings.IndexByte(s.Body, 0) >= 0:
			return FieldErrorf(CodeInvalid, field+".body", "must be non-empty UTF-8 text without NUL")
		case len(s.Body) > MaxSkillBodyBytes:
			return FieldErrorf(CodeTooLarge, field+".body", "is %d bytes; at most %d are allowed", len(s.Body), MaxSkillBodyBytes)
		}
		seen[s.Name] = true
		total += len(s.Name) + len(s.Description) + len(s.Body)
	}
	if total > MaxSkillsBytes {
		return FieldErrorf(CodeTooLarge, "skills", "hold %d bytes; at most %d are allowed in all", total, MaxSkillsBytes)
	}
	return nil
}

// CheckTurnContext returns invalid for a turn context a run may not carry.
func CheckTurnContext(t TurnContext) error {
	switch {
	case !strings.HasPrefix(t.SessionID, "ses_") || len(t.SessionID) > 64:
		return FieldErrorf(CodeInvalid, "turn.sessionId", "is not a session id")
	case t.Turn < 1 || t.Turn > MaxSessionTurns:
		return FieldErrorf(CodeInvalid, "turn.turn", "must be 1 to %d", MaxSessionTurns)
	case len(t.Conversation) > MaxConversationLen:
		return FieldErrorf(CodeInvalid, "turn.conversation", "has %d messages; at most %d are allowed", len(t.Conversation), MaxConversationLen)
	}
	size := 0
	for i, m := range t.Conversation {
		if m.Role != "user" && m.Role != "assistant" {
			return FieldErrorf(CodeInvalid, fmt.Sprintf("turn.conversation[%d].role", i), "must be user or assistant")
		}
		size += len(m.Content)
	}
	if size > MaxConversationBytes {
		return FieldErrorf(CodeTooLarge, "turn.conversation", "holds %d bytes; at most %d are allowed", size, MaxConversationBytes)
	}
	return CheckSkills(t.Skills)
}

// CheckSession returns invalid for a session a store must not keep.
func CheckSession(s Session) error {
	switch {
	case !strings.HasPrefix(s.ID, "ses_") || len(s.ID) > 64 || !isPrintableText(s.ID):
		return FieldErrorf(CodeInvalid, "sessionId", "is not a session id")
	case s.Status != SessionIdle && s.Status != SessionRunning && s.Status != SessionClosed:
		return FieldErrorf(CodeInvalid, "status", "is %q; it must be idle, running or closed", s.Status)
	case s.CreatedAt.IsZero():
		return FieldErrorf(CodeInvalid, "createdAt", "is unset")
	case (len(s.Request.Files) > 0) == (s.Request.Source != nil):
		return FieldErrorf(CodeInvalid, "source", "a session has exactly one of files and a git source")
	case len(s.Turns) > MaxSessionTurns:
		return FieldErrorf(CodeInvalid, "turns", "at most %d turns", MaxSessionTurns)
	}
	for i, t := range s.Turns {
		if t.Turn != i+1 || t.RunID == "" {
			return FieldErrorf(CodeInvalid, fmt.Sprintf("turns[%d]", i), "turns are numbered from 1 and name their run")
		}
	}
	return CheckSkills(s.Request.Skills)
}

// LastTurn returns the session's latest turn, or nil before the first.
func (s Session) LastTurn() *Turn {
	if len(s.Turns) == 0 {
		return nil
	}
	return &s.Turns[len(s.Turns)-1]
}

// StartTurn returns the session with t as its next turn, running. Returns
// conflict, changing nothing, while a turn is running or when the session
// is closed, and invalid for a turn that is not the next one.
func (s Session) StartTurn(t Turn) (Session, error) {
	switch {
	case s.Status == SessionClosed:
		return s, Errorf(CodeConflict, "session %s is closed; start a new session", s.ID)
	case s.Status == SessionRunning:
		return s, Errorf(CodeConflict, "turn %d of session %s is still running; wait for it to end (or stop it) before sending another message", len(s.Turns), s.ID)
	case t.Turn != len(s.Turns)+1:
		return s, Errorf(CodeConflict, "turn %d is not the next turn of session %s (it has %d)", t.Turn, s.ID, len(s.Turns))
	case t.Turn > MaxSessionTurns:
		return s, Errorf(CodeConflict, "session %s has reached its %d turns; start a new session", s.ID, MaxSessionTurns)
	case t.RunID == "" || t.CreatedAt.IsZero():
		return s, FieldErrorf(CodeInvalid, "turn", "names no run or time")
	}
	if t.Status == "" {
		t.Status = StatusQueued
	}
	out := s
	out.Turns = append(slices.Clone(s.Turns), t)
	out.Status = SessionRunning
	out.UpdatedAt = t.CreatedAt
	return out, nil
}

// FinishTurn returns the session with the end of its running turn
// recorded: the turn takes e's outcome, the session's usage and head
// follow, and a running session is idle again (a closed one stays
// closed). Recording the end of a turn that already ended changes nothing
// and succeeds (changed false). Returns conflict for a turn that is not the
// session's last; invalid for an end that is not terminal.
func (s Session) FinishTurn(e TurnEnd) (out Session, changed bool, err error) {
	last := s.LastTurn()
	switch {
	case !e.Status.Terminal():
		return s, false, FieldErrorf(CodeInvalid, "status", "a turn ends completed, failed or cancelled, not %q", e.Status)
	case last == nil || last.Turn != e.Turn:
		return s, false, Errorf(CodeConflict, "turn %d is not the last turn of session %s", e.Turn, s.ID)
	case last.Status.Terminal():
		return s, false, nil
	}
	out = s
	out.Turns = slices.Clone(s.Turns)
	t := &out.Turns[len(out.Turns)-1]
	t.Status, t.FinishedAt, t.Summary, t.Reason = e.Status, e.At, e.Summary, e.Reason
	t.ChangedFiles = slices.Clone(e.ChangedFiles)
	t.Usage = e.Usage
	out.Usage.ModelRequests += e.Usage.ModelRequests
	out.Usage.MaxRequests += e.Usage.MaxRequests
	out.Usage.PromptTokens += e.Usage.PromptTokens
	out.Usage.CompletionTokens += e.Usage.CompletionTokens
	if len(e.ChangedFiles) > 0 {
		head := SessionHead{Turn: t.Turn, RunID: t.RunID}
		if s.Head != nil {
			head.ChangedFiles = slices.Clone(s.Head.ChangedFiles)
		}
		for _, f := range e.ChangedFiles {
			if !slices.Contains(head.ChangedFiles, f) {
				head.ChangedFiles = append(head.ChangedFiles, f)
			}
		}
		slices.Sort(head.ChangedFiles)
		out.Head = &head
	}
	if out.Status == SessionRunning {
		out.Status = SessionIdle
	}
	out.UpdatedAt = e.At
	return out, true, nil
}

// Close returns the session closed at at. Closing a closed session changes
// nothing (changed false).
func (s Session) Close(at time.Time) (out Session, changed bool) {
	if s.Status == SessionClosed {
		return s, false
	}
	out = s
	out.Status = SessionClosed
	out.ClosedAt = at
	out.UpdatedAt = at
	return out, true
}

// CompactConversation builds the conversation a turn's agent starts with
// from the session's earlier turns, within MaxConversationBytes of text:
// each turn as the person's text and the agent's answer (its summary, or
// why its run ended without one, and which files it changed). The newest
// turns are kept whole, as many as fit in three quarters of the budget;
// the older ones are folded into one message of one line each (their text
// and answer cut to 160 characters each), newest first while they fit in
// the rest; turns beyond that are named only by their count.
func CompactConversation(turns []Turn) []ConversationMessage {
	type pair struct{ user, assistant string }
	pairs := make([]pair, 0, len(turns))
	for _, t := range turns {
		answer := t.Summary
		if answer == "" {
			answer = fmt.Sprintf("(turn %d ended %s without a summary", t.Turn, t.Status)
			if t.Reason != "" {
				answer += ": " + t.Reason
			}
			answer += ")"
		}
		if len(t.ChangedFiles) > 0 {
			answer += "\n[turn " + fmt.Sprint(t.Turn) + " " + string(t.Status) + "; changed: " + strings.Join(t.ChangedFiles, ", ") + "]"
		} else if t.Status != StatusCompleted {
			answer += "\n[turn " + fmt.Sprint(t.Turn) + " " + string(t.Status) + "; it changed nothing]"
		}
		pairs = append(pairs, pair{t.Text, answer})
	}
	const whole = MaxConversationBytes * 3 / 4
	used, keep := 0, 0
	for i := len(pairs) - 1; i >= 0; i-- {
		n := len(pairs[i].user) + len(pairs[i].assistant)
		if used+n > whole {
			break
		}
		used += n
		keep++
	}
	older := pairs[:len(pairs)-keep]
	var out []ConversationMessage
	if len(older) > 0 {
		budget := MaxConversationBytes - used
		var lines []string
		size := len(compactHeader) + 64
		omitted := 0
		for i := len(older) - 1; i >= 0; i-- {
			ln := fmt.Sprintf("- turn %d: asked %q; answered %q", i+1, cutRunes(older[i].user, 160), cutRunes(older[i].assistant, 160))
			if size+len(ln)+1 > budget {
				omitted = i + 1
				break
			}
			size += len(ln) + 1
			lines = append(lines, ln)
		}
		slices.Reverse(lines)
		text := compactHeader
		if omitted > 0 {
			text += fmt.Sprintf("\n(%d earlier turns omitted)", omitted)
		}
		if len(lines) > 0 {
			text += "\n" + strings.Join(lines, "\n")
		}
		out = append(out, ConversationMessage{Role: "user", Content: text},
			ConversationMessage{Role: "assistant", Content: "Noted."})
	}
	for _, p := range pairs[len(pairs)-keep:] {
		out = append(out, ConversationMessage{Role: "user", Content: p.user}, ConversationMessage{Role: "assistant", Content: p.assistant})
	}
	return out
}

const compactHeader = "Earlier turns of this session, compacted:"

func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// SessionStore keeps sessions and their turns. Every method that changes a
// session is one atomic conditional write: of any number of concurrent
// StartTurn calls on an idle session, exactly one succeeds.
type SessionStore interface {
	// CreateSession stores s (status idle, no turns). Returns invalid for
	// a session CheckSession refuses; conflict if its id exists.
	CreateSession(ctx context.Context, s Session) error

	// GetSession returns the session with its turns. Returns not_found if
	// it does not exist.
	GetSession(ctx context.Context, id string) (Session, error)

	// StartTurn records t as the session's next turn, running (see
	// Session.StartTurn). Returns not_found if the session does not
	// exist; conflict while a turn runs, when it is closed, or for a turn
	// that is not the next.
	StartTurn(ctx context.Context, id string, t Turn) (Session, error)

	// FinishTurn records the end of the session's running turn (see
	// Session.FinishTurn); a second call for the same turn changes
	// nothing. Returns not_found if the session does not exist; conflict
	// for a turn that is not its last.
	FinishTurn(ctx context.Context, id string, e TurnEnd) (Session, error)

	// CloseSession closes the session; closing a closed one changes
	// nothing. Returns not_found if it does not exist.
	CloseSession(ctx context.Context, id string, at time.Time) (Session, error)
}

// SessionEvent is one event of a session's stream: an event of one of its
// turns' runs, with the session-wide sequence number Seq (SessionSeq), the
// turn, its run and the run's own sequence number.
type SessionEvent struct {
	Seq    int64           `json:"seq"`
	Turn   int             `json:"turn"`
	RunID  string          `json:"runId"`
	RunSeq int64           `json:"runSeq"`
	Time   time.Time       `json:"time"`
	Type   string          `json:"type"`
	Source string          `json:"source"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// sessionSeqTurn is the factor of the turn in a session-wide sequence
// number: a run's log never reaches a billion events (its buffer and its
// sandbox's caps are far below), so turn*sessionSeqTurn+seq is unique and
// ordered, and readable: 2000000015 is event 15 of turn 2.
const sessionSeqTurn = 1_000_000_000

// SessionSeq is the session-wide sequence number of event seq of turn.
func SessionSeq(turn int, seq int64) int64 { return int64(turn)*sessionSeqTurn + seq }

// SplitSessionSeq is SessionSeq's inverse: 0 is before the first turn.
func SplitSessionSeq(n int64) (turn int, seq int64) {
	if n <= 0 {
		return 0, 0
	}
	return int(n / sessionSeqTurn), n % sessionSeqTurn
}
