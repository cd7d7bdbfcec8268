package embedded_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/wire"
)

// The scripted model answers the step numbered by the assistant messages
// already in a request, and a turn's request starts with one assistant
// message per earlier turn (its answer). So each turn of these scripts is
// one reply: its tool calls and finish, run in order.
func sessionScript(tb testing.TB, steps ...[]scriptedmodel.ToolCall) scriptedmodel.Script {
	tb.Helper()
	s := scriptedmodel.Script{Name: "session"}
	for _, calls := range steps {
		s.Steps = append(s.Steps, scriptedmodel.Step{ToolCalls: calls})
	}
	return s
}

func toolCallOf(tb testing.TB, name string, args any) scriptedmodel.ToolCall {
	tb.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		tb.Fatal(err)
	}
	return scriptedmodel.ToolCall{Name: name, Arguments: b}
}

var pytest = []string{"python3", "-m", "pytest", "-q"}

func calcSession(tb testing.TB, approval *belay.ApprovalConfig) httpapi.SessionBody {
	tb.Helper()
	return httpapi.SessionBody{
		Source:       httpapi.SessionSourceBody{Files: treeFiles(tb, calcDir(tb))},
		AllowedPaths: []string{"calc.py", "tests/**"},
		Checks:       [][]string{pytest},
		MaxSteps:     4, WallTimeSeconds: 120,
		Approval: approval,
		Skills:   []belay.Skill{{Name: "calc-style", Description: "how calc.py is written", Body: "Every function has a docstring."}},
	}
}

// waitTurn polls the session until its last turn has ended, and returns
// the record.
func waitTurn(tb testing.TB, c *httpapi.Client, id string, turn int) wire.SessionView {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	for {
		v, err := c.GetSession(ctx, id)
		if err != nil {
			tb.Fatalf("get session %s: %v", id, err)
		}
		if len(v.Turns) >= turn && v.Turns[turn-1].Status.Terminal() {
			return v
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("turn %d of session %s did not end: %+v", turn, id, v)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestSessionThreeTurns holds a session to its contract on the embedded
// control plane with the real sandbox entry and the scripted model: each
// turn starts from the workspace as the turns before it left it and with
// their conversation in the model's request; the record lists the turns
// with their runs; the session's patch is the sum of the turns' patches;
// a second message while a turn runs is a conflict; the event stream
// spans the turns and resumes with Last-Event-ID; a closed session refuses
// messages.
func TestSessionThreeTurns(t *testing.T) {
	t.Parallel()
	script := sessionScript(t,
		// Turn 1 fixes add.
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Turn one: add adds now."}),
		},
		// Turn 2 edits what turn 1 wrote: the edit only applies if turn
		// 1's change is in its workspace. It reads the skill first.
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "read_skill", map[string]string{"name": "calc-style"}),
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "    return a + b\n",
				"new": "    return a + b\n\n\ndef sub(a, b):\n    \"\"\"Return a minus b.\"\"\"\n    return a - b\n"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Turn two: sub subtracts."}),
		},
		// Turn 3 tests turn 2's function.
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "write_file", map[string]string{"path": "tests/test_sub.py",
				"content": "import os\nimport sys\n\nsys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\nimport calc\n\n\ndef test_sub():\n    assert calc.sub(5, 3) == 2\n"}),
			toolCallOf(t, "run_check", map[string]any{"argv": pytest}),
			toolCallOf(t, "finish", map[string]string{"summary": "Turn three: sub is tested."}),
		},
	)
	p := newProvider(t, script, 1)
	pl := startWith(t, p, nil, "")
	ctx := context.Background()
	c := pl.c

	created, err := c.CreateSession(ctx, calcSession(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if created.Status != belay.SessionIdle || !strings.HasPrefix(created.SessionID, "ses_") {
		t.Fatalf("create session = %+v; want an idle ses_ session", created)
	}
	id := created.SessionID
	texts := []string{"Fix add in calc.py.", "Now add a sub function next to add.", "Add a test for sub."}

	first, err := c.SendMessage(ctx, id, texts[0])
	if err != nil || first.Turn != 1 || first.RunID == "" {
		t.Fatalf("message 1 = %+v, %v; want turn 1 with its run", first, err)
	}
	// The first model call is held: the turn is running for sure.
	<-p.Held()
	if _, err := c.SendMessage(ctx, id, texts[1]); !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("a message while turn 1 runs: %v; want conflict", err)
	}
	p.Release()
	v := waitTurn(t, c, id, 1)
	for n := 2; n <= 3; n++ {
		m, err := c.SendMessage(ctx, id, texts[n-1])
		if err != nil || m.Turn != n {
			t.Fatalf("message %d = %+v, %v", n, m, err)
		}
		v = waitTurn(t, c, id, n)
	}

	// The record lists the three turns with their runs.
	if len(v.Turns) != 3 || v.Status != belay.SessionIdle {
		t.Fatalf("record %+v; want three turns, idle", v)
	}
	runs := make([]wire.RunView, 3)
	for i, turn := range v.Turns {
		if turn.Turn != i+1 || turn.Text != texts[i] || turn.Status != belay.StatusCompleted || turn.RunID == "" {
			t.Errorf("turn %d = %+v; want completed with text %q", i+1, turn, texts[i])
		}
		if runs[i], err = c.GetRun(ctx, turn.RunID); err != nil {
			t.Fatal(err)
		}
	}
	if v.Turns[0].RunID != first.RunID || v.Turns[1].Summary != "Turn two: sub subtracts." {
		t.Errorf("turn 1's run %s (want %s), turn 2's summary %q", v.Turns[0].RunID, first.RunID, v.Turns[1].Summary)
	}
	for i, want := range [][]string{{"calc.py"}, {"calc.py"}, {"tests/test_sub.py"}} {
		if !slices.Equal(runs[i].ChangedFiles, want) {
			t.Errorf("turn %d's run changed %q; want %q", i+1, runs[i].ChangedFiles, want)
		}
		if runs[i].Usage.MaxRequests != 4+2 {
			t.Errorf("turn %d's budget is %d requests; want maxSteps + 2 = 6", i+1, runs[i].Usage.MaxRequests)
		}
	}
	if v.Head == nil || v.Head.Turn != 3 || !slices.Equal(v.Head.ChangedFiles, []string{"calc.py", "tests/test_sub.py"}) {
		t.Errorf("head %+v; want turn 3 with calc.py and tests/test_sub.py changed", v.Head)
	}
	if v.Usage.ModelRequests != 3 || p.Calls() != 3 {
		t.Errorf("usage %+v, provider calls %d; want one model request per turn", v.Usage, p.Calls())
	}

	// Turn 2 saw turn 1's change: its patch edits the fixed add.
	patches := make([][]byte, 3)
	for i, turn := range v.Turns {
		if patches[i], err = c.GetArtifact(ctx, turn.RunID, "patch.diff"); err != nil {
			t.Fatal(err)
		}
	}
	if s := string(patches[1]); !strings.Contains(s, " def add(a, b):") || !strings.Contains(s, "+def sub(a, b):") || strings.Contains(s, "-    return a - b") {
		t.Errorf("turn 2's patch does not start from turn 1's change:\n%s", s)
	}

	// Each turn's request carries the earlier turns' conversation.
	reqs := p.model.Requests()
	if len(reqs) != 3 {
		t.Fatalf("the provider got %d requests; want 3", len(reqs))
	}
	for n, r := range reqs {
		var text strings.Builder
		for _, m := range r.Messages {
			text.WriteString(m.Role + ": " + m.Content + "\n")
		}
		got := text.String()
		for k := range n {
			if !strings.Contains(got, "user: "+texts[k]) || !strings.Contains(got, v.Turns[k].Summary) {
				t.Errorf("turn %d's request lacks turn %d's message or answer:\n%s", n+1, k+1, got)
			}
		}
		if !strings.Contains(got, "calc-style: how calc.py is written") || !slices.Contains(r.Tools, "read_skill") {
			t.Errorf("turn %d's request does not offer the skill (tools %q)", n+1, r.Tools)
		}
		if strings.Contains(got, "Every function has a docstring.") && n != 1 {
			t.Errorf("turn %d's request holds the skill's body, which only read_skill gives", n+1)
		}
	}
	if !strings.Contains(messagesText(reqs[1]), "Every function has a docstring.") {
		// Turn 2's request is its first: the body comes back as the
		// result in the transcript, not in this request.
		transcript, err := c.GetArtifact(ctx, v.Turns[1].RunID, "transcript.jsonl")
		if err != nil || !strings.Contains(string(transcript), "Every function has a docstring.") {
			t.Errorf("read_skill did not return the skill's body in turn 2 (%v)", err)
		}
	}

	// The session's patch is the sum of the turns: applied to the upload
	// it gives what the three patches applied in turn give, and pytest
	// passes there.
	sessionPatch, err := c.SessionPatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	files := treeFiles(t, calcDir(t))
	summed := applyPatches(t, files, patches...)
	whole := applyPatches(t, files, sessionPatch)
	if !mapsEqual(summed, whole) {
		t.Errorf("the session's patch gives\n%v\nthe turns' patches give\n%v", whole, summed)
	}
	if !strings.Contains(whole["calc.py"], "return a + b") || !strings.Contains(whole["calc.py"], "def sub(a, b):") || whole["tests/test_sub.py"] == "" {
		t.Errorf("the session's workspace lacks a turn's change: %v", whole)
	}

	// One stream across the turns, in order, each turn ending with its
	// terminal event.
	events, ended, err := c.SessionEvents(ctx, id, 0, 2000)
	if err != nil || ended {
		t.Fatalf("session events: %d, ended %v, %v; want events of an open session", len(events), ended, err)
	}
	var terminals []int64
	for i, e := range events {
		if i > 0 && e.Seq <= events[i-1].Seq {
			t.Fatalf("event %d (seq %d) after seq %d: out of order", i, e.Seq, events[i-1].Seq)
		}
		if e.Seq != belay.SessionSeq(e.Turn, e.RunSeq) || e.RunID != v.Turns[e.Turn-1].RunID {
			t.Errorf("event %+v: seq, turn and run do not agree", e)
		}
		if belay.IsTerminalEvent(e.Type) {
			terminals = append(terminals, e.Seq)
		}
	}
	if len(terminals) != 3 || events[0].Type != belay.EventRunQueued || !belay.IsTerminalEvent(events[len(events)-1].Type) {
		t.Fatalf("the stream has %d terminal events; want one per turn, last", len(terminals))
	}

	// A closed session refuses messages.
	closed, err := c.CloseSession(ctx, id)
	if err != nil || closed.Status != belay.SessionClosed {
		t.Fatalf("close = %+v, %v", closed.Status, err)
	}
	if _, err := c.SendMessage(ctx, id, "one more"); !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("a message to a closed session: %v; want conflict", err)
	}

	// SSE resumes after turn 2's last event with Last-Event-ID: turn 3's
	// events follow, then the stream ends (the session is closed).
	sse := readSSE(t, pl, id, terminals[1])
	want := 0
	for _, e := range events {
		if e.Seq > terminals[1] {
			want++
		}
	}
	if len(sse) != want || sse[0] != belay.SessionSeq(3, 1) {
		t.Errorf("SSE from Last-Event-ID %d gave %d events starting at %v; want turn 3's %d", terminals[1], len(sse), sse, want)
	}
}

func messagesText(r scriptedmodel.Request) string {
	var b strings.Builder
	for _, m := range r.Messages {
		b.WriteString(m.Content)
	}
	return b.String()
}

// readSSE reads the session's SSE stream from Last-Event-ID after to its
// end and returns the ids.
func readSSE(tb testing.TB, pl plane, id string, after int64) []int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+pl.m.Addr()+"/v1/sessions/"+id+"/events", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+pl.m.Token())
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		tb.Fatalf("SSE answered %s (%s)", resp.Status, resp.Header.Get("Content-Type"))
	}
	var ids []int64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("SSE id %q", v)
			}
			ids = append(ids, n)
		}
	}
	return ids
}

// applyPatches writes files into a fresh folder, applies each patch with
// git apply, in order, and returns the folder's files.
func applyPatches(tb testing.TB, files []belay.File, patches ...[]byte) map[string]string {
	tb.Helper()
	dir := tb.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.Content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	for i, patch := range patches {
		pf := filepath.Join(tb.TempDir(), "p.diff")
		if err := os.WriteFile(pf, patch, 0o600); err != nil {
			tb.Fatal(err)
		}
		cmd := exec.Command("git", "apply", pf)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git apply patch %d: %v\n%s\n%s", i+1, err, out, patch)
		}
	}
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestSessionFromGit holds a session with a git source to its contract: the
// control plane fetches the repository from a real git server on loopback
// (git http-backend) once, for the first turn, with its own credentials;
// the next turn starts from a commit of the first turn's change on top of
// the fetched one (its sandbox's base), so its patch is only its own; and
// the session's patch is the sum of both.
func TestSessionFromGit(t *testing.T) {
	t.Parallel()
	const gitToken = "ghs_session_CANARY_git_token"
	srv := gittest.Start(t, "x-access-token", gitToken)
	files := map[string]string{}
	for _, f := range treeFiles(t, calcDir(t)) {
		files[f.Path] = f.Content
	}
	repo := srv.NewRepo(t, "octo-org/calc", files, true)
	head := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))

	script := sessionScript(t,
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Fixed add."}),
		},
		[]scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "    return a + b\n",
				"new": "    return a + b\n\n\ndef sub(a, b):\n    \"\"\"Return a minus b.\"\"\"\n    return a - b\n"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Added sub."}),
		},
	)
	p := newProvider(t, script, 0)
	logs := &embeddedtest.Logs{}
	pl := startWith(t, p, logs, "", func(cfg *embedded.Config) {
		cfg.RepoEvents.GitCredentials = strings.Replace(srv.URL, "http://", "http://x-access-token:"+gitToken+"@", 1)
	})
	ctx := context.Background()
	body := calcSession(t, nil)
	body.Source = httpapi.GitSourceOf(repo.URL, "main")
	body.AllowedPaths = []string{"calc.py"}
	created, err := pl.c.CreateSession(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID
	if _, err := pl.c.SendMessage(ctx, id, "Fix add."); err != nil {
		t.Fatal(err)
	}
	waitTurn(t, pl.c, id, 1)
	fetches := len(srv.Requests())
	if fetches == 0 {
		t.Fatal("the git server got no request: the first turn's source was not fetched from it")
	}
	for _, r := range srv.Requests() {
		if !r.Authorized || r.User != "x-access-token" {
			t.Errorf("git request %+v did not carry the control plane's credentials", r)
		}
	}
	if _, err := pl.c.SendMessage(ctx, id, "Add sub."); err != nil {
		t.Fatal(err)
	}
	v := waitTurn(t, pl.c, id, 2)
	if n := len(srv.Requests()); n != fetches {
		t.Errorf("the second turn made %d more requests to the git server; it continues from the first turn's bundle", n-fetches)
	}

	runs := make([]wire.RunView, 2)
	for i, turn := range v.Turns {
		if turn.Status != belay.StatusCompleted {
			t.Fatalf("turn %d ended %s (%s)", i+1, turn.Status, turn.Reason)
		}
		if runs[i], err = pl.c.GetRun(ctx, turn.RunID); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(r wire.RunView) string {
		if s := r.Request.Source; s != nil && s.Git != nil {
			return s.Git.Commit
		}
		return ""
	}
	if commit(runs[0]) != head {
		t.Errorf("turn 1 ran on %q; want the fetched commit %s", commit(runs[0]), head)
	}
	if c := commit(runs[1]); c == head || !belay.IsObjectName(c) {
		t.Errorf("turn 2 ran on %q; want a commit of turn 1's change on %s", c, head)
	}
	patch2, err := pl.c.GetArtifact(ctx, v.Turns[1].RunID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	if s := string(patch2); !strings.Contains(s, "+def sub(a, b):") || strings.Contains(s, "-    return a - b") {
		t.Errorf("turn 2's patch does not start from turn 1's change:\n%s", s)
	}
	sessionPatch, err := pl.c.SessionPatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got := applyPatches(t, treeFiles(t, calcDir(t)), sessionPatch)
	if !strings.Contains(got["calc.py"], "    return a + b\n") || !strings.Contains(got["calc.py"], "def sub(a, b):") {
		t.Errorf("the session's patch does not hold both turns:\n%s", sessionPatch)
	}
	if strings.Contains(logs.String(), gitToken) {
		t.Error("the git token shows up in the logs")
	}
}

// TestSessionTurnResumes: a turn whose sandbox is killed mid-command
// resumes on a new sandbox (checkpoints), completes with the earlier
// turn's conversation still in its requests, and the session goes on: the
// next turn starts from the workspace the resumed turn left.
func TestSessionTurnResumes(t *testing.T) {
	t.Parallel()
	script := scriptedmodel.Script{Name: "session resume", Steps: []scriptedmodel.Step{
		{ToolCalls: []scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
			toolCallOf(t, "finish", map[string]string{"summary": "Fixed add."}),
		}},
		{ToolCalls: []scriptedmodel.ToolCall{
			toolCallOf(t, "edit_file", map[string]string{"path": "calc.py", "old": "    return a + b\n",
				"new": "    return a + b\n\n\ndef sub(a, b):\n    \"\"\"Return a minus b.\"\"\"\n    return a - b\n"}),
			toolCallOf(t, "shell", map[string]string{"command": "sleep 300"}),
		}},
		// After the resume (turn 2's second request), and turn 3's first.
		{ToolCalls: []scriptedmodel.ToolCall{toolCallOf(t, "finish", map[string]string{"summary": "Added sub; the sleep was interrupted."})}},
	}}
	p := newProvider(t, script, 0)
	// Under the OCI launcher, belay serve's default: the turn's sandbox is
	// the image under runc, killed as Fargate would lose a task.
	pl := startResume(t, p, embedded.LauncherOCI)
	ctx := context.Background()
	created, err := pl.c.CreateSession(ctx, calcSession(t, &belay.ApprovalConfig{Policy: belay.PolicyAllowAll}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID
	if _, err := pl.c.SendMessage(ctx, id, "Fix add."); err != nil {
		t.Fatal(err)
	}
	waitTurn(t, pl.c, id, 1)
	m, err := pl.c.SendMessage(ctx, id, "Add sub, then wait a while.")
	if err != nil {
		t.Fatal(err)
	}
	waitView(t, pl, m.RunID, "a checkpoint with the shell call pending", func(r wire.RunView) bool {
		return r.Checkpoint != nil && r.Checkpoint.Pending == "shell"
	})
	killSandbox(t, pl, m.RunID)
	v := waitTurn(t, pl.c, id, 2)
	run, err := pl.c.GetRun(ctx, m.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Turns[1].Status != belay.StatusCompleted || run.Attempt != 2 || v.Status != belay.SessionIdle {
		t.Fatalf("turn 2 ended %s on attempt %d (%q), session %s; want completed after one resume, idle",
			v.Turns[1].Status, run.Attempt, v.Turns[1].Reason, v.Status)
	}
	reqs := p.model.Requests()
	if len(reqs) != 3 || !strings.Contains(messagesText(reqs[2]), "Fix add.") || !strings.Contains(messagesText(reqs[2]), `"interrupted":true`) {
		t.Fatalf("the resumed turn's request does not carry turn 1's conversation and the interrupted call: %d requests", len(reqs))
	}

	// The session goes on from the resumed turn's change.
	if _, err := pl.c.SendMessage(ctx, id, "Anything else?"); err != nil {
		t.Fatal(err)
	}
	v = waitTurn(t, pl.c, id, 3)
	if v.Turns[2].Status != belay.StatusCompleted {
		t.Fatalf("turn 3 ended %s (%s)", v.Turns[2].Status, v.Turns[2].Reason)
	}
	patch, err := pl.c.SessionPatch(ctx, id)
	if err != nil || !strings.Contains(string(patch), "+def sub(a, b):") || !strings.Contains(string(patch), "+    return a + b") {
		t.Errorf("the session's patch lacks the resumed turn's change (%v):\n%s", err, patch)
	}
}
