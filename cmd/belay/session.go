package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

const sessionDoc = `Multi-turn sessions: a conversation with the agent over one workspace.
Each message starts a turn, a run from the workspace as the earlier turns
left it, with their conversation in the agent's context.

  belay session new DIR|--repo URL [--ref REF] --allow PATH... --check CMD... [--skill FILE]... [flags]
      create a session over the files under DIR (uploaded as belay run
      uploads them) or a git repository the server fetches; prints its id.
      A --skill FILE is a named instruction document: its name is the file's
      base name without extension, its description its first line.
  belay session chat ID [--message TEXT]
      an interactive prompt: each line you type is a message (a turn); the
      agent's events stream as they happen, and an approval the agent asks
      for is asked here ([y]es once, [s]ession, [n]o, [c]ancel the turn).
      /stop stops the running turn, /quit (or end of input) leaves once no
      turn runs. With --message it sends that one message, streams its
      turn and exits (0 when the turn completed). A dropped connection is
      made again from the last event shown.
  belay session show ID [--json]
      the session's record: status, turns and their runs, usage, the files
      it changed.
  belay session patch ID
      the session's change so far (the sum of its turns) as a git diff.
  belay session close ID
      close the session, stopping a running turn.`

// cmdSession runs `belay session SUBCOMMAND ...`.
func cmdSession(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stderr, sessionDoc)
		if len(args) == 0 {
			return usagef("belay session needs a subcommand: new, chat, show, patch or close")
		}
		return nil
	}
	switch args[0] {
	case "new":
		return cmdSessionNew(ctx, e, args[1:])
	case "chat":
		return cmdSessionChat(ctx, e, args[1:])
	case "show":
		return cmdSessionShow(ctx, e, args[1:])
	case "patch":
		return cmdSessionPatch(ctx, e, args[1:])
	case "close":
		return cmdSessionClose(ctx, e, args[1:])
	}
	return usagef("unknown session subcommand %q: want new, chat, show, patch or close", args[0])
}

func cmdSessionNew(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "session new", "DIR|--repo URL [--ref REF] --allow PATH... --check CMD... [flags]", sessionDoc)
	repo := fs.String("repo", "", "git repository `URL` the server fetches the tree from, instead of DIR")
	ref := fs.String("ref", "", "with --repo: the branch, tag, full ref or commit `id` (default: the default branch)")
	var allow, checks, approvalAllow, skills stringList
	fs.Var(&allow, "allow", "a `path` the agent may change; end it in /** for a subtree (repeatable)")
	fs.Var(&checks, "check", "a `command` that proves a change, split on spaces, no shell (repeatable)")
	fs.Var(&skills, "skill", "a skill: a text `file` whose first line describes it (repeatable)")
	maxSteps := fs.Int("max-steps", 0, "most agent steps of each turn (server default when 0)")
	wallTime := fs.Int("wall-time", 0, "most `seconds` each turn may take (server default when 0)")
	approval := fs.String("approval", "", "approval `policy` for shell commands: deny_all (default), allow_list, allow_all or ask")
	fs.Var(&approvalAllow, "approval-allow", "a `tool` the allow_list or ask policy allows without asking (repeatable)")
	var pos []string
	var err error
	if hasRepoFlag(args) {
		pos, err = parseExact(fs, args)
	} else {
		pos, err = parseExact(fs, args, "DIR")
	}
	if err != nil {
		return err
	}
	switch {
	case *repo == "" && *ref != "":
		return usagef("--ref goes with --repo")
	case len(allow) == 0:
		return usagef("--allow is required: name the paths the agent may change")
	case len(checks) == 0:
		return usagef(`--check is required: give a command that proves a change, for example --check "python3 -m pytest -q"`)
	}
	body := httpapi.SessionBody{AllowedPaths: allow, MaxSteps: *maxSteps, WallTimeSeconds: *wallTime}
	if *approval != "" || len(approvalAllow) > 0 {
		body.Approval = &belay.ApprovalConfig{Policy: belay.ApprovalPolicy(*approval), Allow: approvalAllow}
	}
	for _, c := range checks {
		argv := strings.Fields(c)
		if len(argv) == 0 {
			return usagef("--check %q is empty", c)
		}
		body.Checks = append(body.Checks, argv)
	}
	for _, path := range skills {
		sk, err := readSkill(path)
		if err != nil {
			return err
		}
		body.Skills = append(body.Skills, sk)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	lim, err := serverLimits(ctx, c, e.stderr)
	if err != nil {
		return err
	}
	if *repo != "" {
		if err := belay.CheckGitURL(*repo, lim.GitURLs); err != nil {
			return usagef("--repo: %s", strings.TrimPrefix(belay.ErrorMessage(err), "source.git.url: "))
		}
		if err := belay.CheckGitRef(*ref); err != nil {
			return usagef("--ref: %s", strings.TrimPrefix(belay.ErrorMessage(err), "source.git.ref: "))
		}
		body.Source = httpapi.GitSourceOf(*repo, *ref)
	} else if body.Source.Files, err = readTree(pos[0], lim, e.stderr); err != nil {
		return err
	}
	created, err := c.CreateSession(ctx, body)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, created.SessionID)
	fmt.Fprintf(e.stderr, "belay: talk to it with: belay session chat %s\n", created.SessionID)
	return nil
}

// readSkill reads a skill file: its name from the file name (lower case,
// other characters than a-z, 0-9, - and _ turned into -), its description
// from its first non-empty line (without a leading #), its body the whole
// file.
func readSkill(path string) (belay.Skill, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return belay.Skill{}, usagef("--skill: %v", err)
	}
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	name := strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9', r == '-', r == '_':
			return r
		case 'A' <= r && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, base)
	var desc string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(strings.TrimLeft(line, "#")); line != "" {
			desc = line
			break
		}
	}
	sk := belay.Skill{Name: name, Description: desc, Body: string(b)}
	if err := belay.CheckSkills([]belay.Skill{sk}); err != nil {
		return belay.Skill{}, usagef("--skill %s: %s", path, belay.ErrorMessage(err))
	}
	return sk, nil
}

func cmdSessionShow(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "session show", "ID [--json]", sessionDoc)
	asJSON := fs.Bool("json", false, "print the record as JSON")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	v, err := c.GetSession(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSONLine(e.stdout, v)
	}
	printSession(e.stdout, v)
	return nil
}

func printSession(w io.Writer, v wire.SessionView) {
	fmt.Fprintf(w, "session %s  %s  created %s\n", v.SessionID, v.Status, v.CreatedAt.Format("2006-01-02 15:04:05Z07:00"))
	if g := v.Request.Git; g != nil {
		fmt.Fprintf(w, "source: %s %s\n", printableLine(g.URL), printableLine(g.Ref))
	} else {
		fmt.Fprintf(w, "source: %d uploaded files\n", v.Request.Files)
	}
	if len(v.Request.Skills) > 0 {
		fmt.Fprintf(w, "skills: %s\n", strings.Join(v.Request.Skills, ", "))
	}
	fmt.Fprintf(w, "usage: %d model requests, %d prompt and %d completion tokens\n",
		v.Usage.ModelRequests, v.Usage.PromptTokens, v.Usage.CompletionTokens)
	for _, t := range v.Turns {
		fmt.Fprintf(w, "turn %d  %s  run %s\n  you: %s\n", t.Turn, t.Status, t.RunID, clip(printableLine(t.Text), 200))
		if t.Summary != "" {
			fmt.Fprintf(w, "  agent: %s\n", clip(printableLine(t.Summary), 400))
		}
		if t.Reason != "" && t.Status != belay.StatusCompleted {
			fmt.Fprintf(w, "  reason: %s\n", printableLine(t.Reason))
		}
		if len(t.ChangedFiles) > 0 {
			fmt.Fprintf(w, "  changed: %s\n", strings.Join(t.ChangedFiles, ", "))
		}
	}
	if v.Head != nil {
		fmt.Fprintf(w, "workspace: after turn %d, changed %s (belay session patch %s)\n", v.Head.Turn, strings.Join(v.Head.ChangedFiles, ", "), v.SessionID)
	}
}

func cmdSessionPatch(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "session patch", "ID", sessionDoc)
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	patch, err := c.SessionPatch(ctx, pos[0])
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(patch)
	return err
}

func cmdSessionClose(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "session close", "ID", sessionDoc)
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	v, err := c.CloseSession(ctx, pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "session %s %s\n", v.SessionID, v.Status)
	return nil
}

// chatMessage is what the server sends on the session's socket: an event
// or the answer to a message.
type chatMessage struct {
	belay.SessionEvent
	For   string            `json:"for"`
	ID    string            `json:"id"`
	Error *wire.ErrorDetail `json:"error"`
}

func cmdSessionChat(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "session chat", "ID [--message TEXT]", sessionDoc)
	message := fs.String("message", "", "send this one `text`, stream its turn, and exit")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	id := pos[0]
	c, err := e.client()
	if err != nil {
		return err
	}
	v, err := c.GetSession(ctx, id)
	if err != nil {
		return err
	}
	if v.Status == belay.SessionClosed {
		return fmt.Errorf("session %s is closed", id)
	}
	// Only what happens from now on is shown: the latest event's number
	// is where the socket starts.
	var after int64
	if events, _, err := c.SessionEvents(ctx, id, belay.SessionSeq(max(len(v.Turns), 1), 0), 2000); err == nil && len(events) > 0 {
		after = events[len(events)-1].Seq
	}
	sock := &chatSocket{client: c, id: id, after: after, stderr: e.stderr,
		msgs: make(chan chatMessage), errs: make(chan socketError)}
	if err := sock.dial(ctx); err != nil {
		return err
	}
	defer sock.close()
	lines := make(chan string)
	if *message == "" {
		go func() {
			defer close(lines)
			in := e.stdin
			if in == nil {
				return
			}
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	send := func(m wire.WSClientMessage) error { return sock.send(ctx, m) }

	ended := map[int]bool{}
	running := 0 // the turn running, 0 for none
	var lastStatus belay.RunStatus
	pending := ""               // the approval asked, "" for none
	inputDone := *message != "" // no more lines will come
	prompt := func() {
		if !inputDone && running == 0 && pending == "" {
			fmt.Fprint(e.stderr, "you> ")
		}
	}
	if *message != "" {
		if err := send(wire.WSClientMessage{Type: wire.WSTypeChat, Text: *message}); err != nil {
			return err
		}
		running = -1 // until the server says which turn
	} else {
		fmt.Fprintf(e.stderr, "belay: session %s; type a message, /stop to stop a turn, /quit to leave\n", id)
		prompt()
	}
	// Lines typed while a turn runs wait in queue (the next message, or
	// the answer to an approval the turn will ask); /stop acts at once.
	var queue []string
	quit := false
	drain := func() error {
		for len(queue) > 0 && !quit && (pending != "" || running == 0) {
			line := strings.TrimSpace(queue[0])
			queue = queue[1:]
			switch {
			case pending != "":
				d, ok := approvalAnswer(line)
				if !ok {
					fmt.Fprint(e.stderr, "answer y (yes, once), s (yes, for the session), n (no) or c (cancel the turn): ")
					continue
				}
				if err := send(wire.WSClientMessage{Type: wire.WSTypeApprove, ID: pending, Decision: d}); err != nil {
					return err
				}
				pending = ""
			case line == "/quit":
				quit = true
			case line == "/stop":
				fmt.Fprintln(e.stderr, "no turn is running")
				prompt()
			case line == "":
				prompt()
			default:
				if err := send(wire.WSClientMessage{Type: wire.WSTypeChat, Text: line}); err != nil {
					return err
				}
				running = -1
			}
		}
		return nil
	}
	for {
		if err := drain(); err != nil {
			return err
		}
		if (quit || inputDone && len(queue) == 0) && running == 0 && pending == "" {
			if *message != "" && lastStatus != belay.StatusCompleted {
				return fmt.Errorf("the turn ended %s", lastStatus)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		case se := <-sock.errs:
			if se.gen != sock.gen {
				continue // a connection already replaced
			}
			if websocket.CloseStatus(se.err) == websocket.StatusNormalClosure {
				fmt.Fprintf(e.stdout, "session %s closed\n", id)
				return nil
			}
			if err := sock.redial(ctx, se.err); err != nil {
				return err
			}
		case line, ok := <-lines:
			if !ok {
				inputDone = true
				lines = nil
				continue
			}
			if strings.TrimSpace(line) == "/stop" && running != 0 && pending == "" {
				if err := send(wire.WSClientMessage{Type: wire.WSTypeStop}); err != nil {
					return err
				}
				continue
			}
			queue = append(queue, line)
		case m := <-sock.msgs:
			if !sock.fresh(m) {
				continue // shown before the connection was made again
			}
			switch m.Type {
			case wire.WSTypeError:
				fmt.Fprintf(e.stderr, "belay: %s: %s\n", m.Error.Code, m.Error.Message)
				if m.For == wire.WSTypeChat {
					running = 0
					lastStatus = belay.StatusFailed
					prompt()
				}
				continue
			case wire.WSTypeAccepted:
				if m.For == wire.WSTypeChat {
					running = m.Turn
					if ended[m.Turn] {
						// Its events outran the answer.
						running = 0
						prompt()
					}
					fmt.Fprintf(e.stderr, "belay: turn %d, run %s\n", m.Turn, m.RunID)
				}
				continue
			case wire.EventsMissedType:
				continue
			}
			ev := belay.Event{Seq: m.RunSeq, Time: m.Time, Type: m.Type, Source: m.Source, Data: m.Data}
			if err := printEvent(e.stdout, m.RunID, ev, false); err != nil {
				return err
			}
			switch {
			case m.Type == belay.EventApprovalRequested:
				var a struct {
					ApprovalID string          `json:"approvalId"`
					Tool       string          `json:"tool"`
					Arguments  json.RawMessage `json:"arguments"`
				}
				if json.Unmarshal(m.Data, &a) == nil {
					pending = a.ApprovalID
					fmt.Fprintf(e.stderr, "approve %s %s? [y]es once, [s]ession, [n]o, [c]ancel: ",
						printableLine(a.Tool), clip(argumentsText(a.Arguments), 200))
					if inputDone && len(queue) == 0 {
						fmt.Fprintln(e.stderr, "(no input left: it is left to its timeout)")
					}
				}
			case m.Type == belay.EventApprovalDecided:
				pending = ""
			case belay.IsTerminalEvent(m.Type):
				ended[m.Turn] = true
				if m.Turn != running && running != -1 {
					continue
				}
				running = 0
				lastStatus = map[string]belay.RunStatus{belay.EventRunCompleted: belay.StatusCompleted,
					belay.EventRunFailed: belay.StatusFailed, belay.EventRunCancelled: belay.StatusCancelled}[m.Type]
				if s, err := c.GetSession(ctx, id); err == nil && m.Turn >= 1 && m.Turn <= len(s.Turns) {
					if t := s.Turns[m.Turn-1]; t.Summary != "" {
						fmt.Fprintf(e.stdout, "agent: %s\n", printable(t.Summary))
					}
				}
				prompt()
			}
		}
	}
}

// chatSocket is the chat's WebSocket to its session. When the connection
// drops (API Gateway ends a WebSocket idle for 10 minutes, and any after 2
// hours; a network can fail) it is dialled again from the last event
// received, so nothing is lost or shown twice; a message that could not
// be sent is sent again on the new connection.
type chatSocket struct {
	client *httpapi.Client
	id     string
	after  int64 // the session seq of the last event received
	stderr io.Writer

	conn *websocket.Conn
	gen  int // counts the connections; errors of replaced ones are stale
	msgs chan chatMessage
	errs chan socketError
}

type socketError struct {
	gen int
	err error
}

// How long a dropped chat keeps trying to connect again, and the waits
// between tries.
const (
	chatReconnectFor      = 2 * time.Minute
	chatReconnectFirst    = 250 * time.Millisecond
	chatReconnectMaxDelay = 5 * time.Second
)

// dial opens a connection from s.after and reads it into s.msgs until it
// fails, which it reports on s.errs with its generation.
func (s *chatSocket) dial(ctx context.Context) error {
	conn, err := s.client.DialSession(ctx, s.id, s.after)
	if err != nil {
		return err
	}
	if s.conn != nil {
		s.conn.CloseNow()
	}
	s.conn = conn
	s.gen++
	gen := s.gen
	go func() {
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				select {
				case s.errs <- socketError{gen, err}:
				case <-ctx.Done():
				}
				return
			}
			var m chatMessage
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			select {
			case s.msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}

// redial connects again after cause ended the connection, trying for
// chatReconnectFor. A refusal (the session is gone or closed, the token
// refused) ends the chat.
func (s *chatSocket) redial(ctx context.Context, cause error) error {
	fmt.Fprintf(s.stderr, "belay: the session's connection dropped (%v); connecting again\n", cause)
	deadline := time.Now().Add(chatReconnectFor)
	delay := chatReconnectFirst
	for {
		err := s.dial(ctx)
		if err == nil {
			fmt.Fprintf(s.stderr, "belay: connected again, from event %d\n", s.after)
			return nil
		}
		// A network failure, or a server failing for now, is tried again;
		// an answer about the session or the token is final.
		code := belay.ErrorCode(err)
		final := code != belay.CodeInternal && code != belay.CodeUnavailable && code != belay.CodeUpstream
		if final || time.Now().Add(delay).After(deadline) {
			return fmt.Errorf("the session's websocket ended (%v), and connecting again failed: %w", cause, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, chatReconnectMaxDelay)
	}
}

// send writes m; when the connection has failed, it connects again and
// sends m once more.
func (s *chatSocket) send(ctx context.Context, m wire.WSClientMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
		if err := s.redial(ctx, err); err != nil {
			return err
		}
		return s.conn.Write(ctx, websocket.MessageText, b)
	}
	return nil
}

// fresh reports whether m is to be shown: an answer, or an event after
// the last one received (which it then is). An event at or before it
// came again on a new connection.
func (s *chatSocket) fresh(m chatMessage) bool {
	if m.Seq == 0 {
		return true
	}
	if m.Seq <= s.after {
		return false
	}
	s.after = m.Seq
	return true
}

func (s *chatSocket) close() {
	if s.conn != nil {
		s.conn.CloseNow()
	}
}

// approvalAnswer reads a person's answer to an approval question.
func approvalAnswer(line string) (belay.Decision, bool) {
	switch strings.ToLower(line) {
	case "y", "yes":
		return belay.DecisionAllowOnce, true
	case "s", "session":
		return belay.DecisionAllowSession, true
	case "n", "no":
		return belay.DecisionDeny, true
	case "c", "cancel":
		return belay.DecisionCancel, true
	}
	return "", false
}
