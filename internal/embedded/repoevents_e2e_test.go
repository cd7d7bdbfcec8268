package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/github/githubtest"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// TestRepositoryEventEndToEnd: a /belay comment on an issue, delivered as
// GitHub delivers it, becomes a run on the event's commit, fetched by the
// control plane from a real git server on loopback; the real sandbox runs
// the agent (the scripted example session) on the repository with its
// history; the validated patch is pushed as exactly one commit on
// belay/<runId>, a pull request of it is opened and the outcome commented
// (GitHub stand-in). No git or GitHub credential is ever in the sandbox's
// environment or files, or in a log, event or artifact.
func TestRepositoryEventEndToEnd(t *testing.T) {
	gittest.NeedGit(t)
	script, err := scriptedmodel.LoadScript(filepath.Join(moduleRoot(t), "examples", "sessions", "fix-calc.json"))
	if err != nil {
		t.Fatal(err)
	}
	// First the shell shows its whole environment and the repository's
	// git configuration; the rest is the example session. The provider
	// holds the last request, while the test looks at the live sandbox.
	script.Steps = append([]scriptedmodel.Step{
		step("shell", map[string]string{"command": "env; git config --list --show-origin; git log --format='%H %s'"}),
	}, script.Steps...)
	p := newProvider(t, script, len(script.Steps))
	h := startHookHarness(t, hookOptions{sandbox: realEntry(t), provider: p, approval: "allow_all"})
	// A second commit, so the sandbox has history to show and the base is
	// not the first commit.
	first := h.commit
	h.commit = h.repo.Commit(map[string]string{"README.md": "# calc\n\nA calculator whose add subtracts.\n"}, "describe the bug")
	gittest.Git(t, h.repo.Dir, "push", "-q", "-f", "origin", "HEAD:refs/heads/master")

	comment := githubtest.Example(t, githubtest.Examples(t), "issue_comment", "created")
	comment["comment"].(map[string]any)["body"] = "/belay fix the failing test in calc.py"
	status, ans, eb := h.signed("issue_comment", "d-e2e", comment)
	if status != 202 || ans.RunID == "" {
		t.Fatalf("delivery: %d %+v %+v", status, ans, eb)
	}
	runID := ans.RunID
	if out := h.waitDispatched(); out.RunID != runID || out.Status != belay.StatusQueued {
		t.Fatalf("dispatched %+v", out)
	}
	c := clientOf(t, h.m)

	waitHeld(t, p, c, runID)
	entry := findEntry(t, h.cfg.SandboxDir, runID)
	secrets := map[string]string{"git token": gitToken, "GitHub token": githubToken, "webhook secret": webhookSecret, "provider key": providerKey}
	// The sandbox's processes' environments, and every file of its
	// workspace (the repository and .git included), hold none of them.
	for _, pid := range append(sandboxProcesses(t, entry.workspace), entry.pid) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue // gone meanwhile
		}
		for what, s := range secrets {
			if bytes.Contains(env, []byte(s)) {
				t.Errorf("the %s is in the environment of sandbox process %d", what, pid)
			}
		}
	}
	files := 0
	err = filepath.WalkDir(entry.workspace, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		for what, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("the %s is in the sandbox's file %s", what, strings.TrimPrefix(path, entry.workspace))
			}
		}
		return nil
	})
	if err != nil || files < 5 {
		t.Fatalf("walked %d files of the workspace (%v)", files, err)
	}
	p.Release()

	events, run := (plane{m: h.m, c: c, cfg: h.cfg}).finished(t, runID)
	if run.Status != belay.StatusCompleted || !slices.Equal(run.ChangedFiles, []string{"calc.py"}) {
		t.Fatalf("run ended %s (%s), changed %v; events: %s", run.Status, run.Reason, run.ChangedFiles, eventTypes(events))
	}
	if tr := run.Trigger; tr == nil || tr.Event != "issue_comment" || tr.Delivery != "d-e2e" || tr.Commit != h.commit ||
		tr.Actor != "Codertocat" || tr.Repository != "Codertocat/Hello-World" || tr.Issue != 1 {
		t.Errorf("the run view's trigger is %+v", run.Trigger)
	}
	if s := run.Request.Source; s == nil || s.Git == nil || s.Git.Commit != h.commit || s.Git.URL != h.repo.URL {
		t.Errorf("the run view's source is %+v", run.Request.Source)
	}
	// The sandbox ran on the event's commit, with its history.
	ready := awaitEvent(t, c, runID, func(e belay.Event) bool { return e.Type == belay.EventSandboxReady })
	if !strings.Contains(string(ready.Data), h.commit) {
		t.Errorf("sandbox.ready %s does not name the base commit %s", ready.Data, h.commit)
	}
	code, out := commandResult(t, resultOfStep(t, events, 1))
	if code != 0 || !strings.Contains(out, h.commit+" describe the bug") || !strings.Contains(out, first+" initial commit") {
		t.Errorf("the sandbox's git log (exit %d):\n%s\nwant both commits", code, out)
	}
	for what, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("the %s shows in the sandbox's environment or git configuration", what)
		}
	}
	// The repository knows no remote and no credential: the sandbox could
	// not fetch or push if it tried. (/etc/gitconfig is the machine's.)
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "file:.git/config") && (strings.Contains(line, "credential") || strings.Contains(line, "remote.") || strings.Contains(line, "url")) {
			t.Errorf("the sandbox's repository configuration has %q", line)
		}
	}
	if strings.Contains(out, "x-access-token") {
		t.Errorf("the sandbox's environment or git configuration names the git user:\n%s", out)
	}

	// The safe outputs: a pull request and a comment saying so.
	ctx := context.Background()
	patch, err := c.GetArtifact(ctx, runID, "patch.diff")
	if err != nil {
		t.Fatal(err)
	}
	branch := "belay/" + runID
	var pr, comment2 githubtest.Call
	done := make(chan struct{})
	time.AfterFunc(runDeadline, func() { close(done) })
	for pr.Path == "" || comment2.Path == "" {
		call, ok := h.api.Next(done)
		if !ok {
			t.Fatalf("the GitHub stand-in got %+v; want a pull request and a comment", h.api.Calls())
		}
		switch call.Path {
		case "/repos/Codertocat/Hello-World/pulls":
			pr = call
		case "/repos/Codertocat/Hello-World/issues/1/comments":
			comment2 = call
		}
	}
	if pr.Body["head"] != branch || pr.Body["base"] != "master" || !strings.Contains(pr.Body["title"].(string), "fix the failing test in calc.py") {
		t.Errorf("pull request %+v; want %s into master", pr.Body, branch)
	}
	if body := comment2.Body["body"].(string); !strings.Contains(body, "completed") || !strings.Contains(body, "pull request #42") || !strings.Contains(body, runID) {
		t.Errorf("the outcome comment says %q", body)
	}

	// The branch: one commit on the event's commit, whose diff is exactly
	// the validated patch; nothing else moved.
	diff := []string{"diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", h.commit, "refs/heads/" + branch, "--"}
	if got := gittest.Git(t, h.repo.Bare, diff...); got != string(patch) {
		t.Errorf("the pushed branch's diff from the event's commit differs from the validated patch:\n got %q\nwant %q", got, patch)
	}
	if parents := strings.Fields(gittest.Git(t, h.repo.Bare, "rev-parse", "refs/heads/"+branch+"^@")); !slices.Equal(parents, []string{h.commit}) {
		t.Errorf("the branch's commit has parents %v; want the event's commit", parents)
	}
	for _, b := range []string{"main", "master"} {
		if got := strings.TrimSpace(gittest.Git(t, h.repo.Bare, "rev-parse", "refs/heads/"+b)); got != h.commit {
			t.Errorf("%s moved to %s", b, got)
		}
	}
	pushed := false
	for _, r := range h.repoServer().Requests() {
		if strings.HasSuffix(r.Path, "/git-receive-pack") && r.Method == "POST" {
			pushed = true
			if !r.Authorized || r.User != "x-access-token" {
				t.Errorf("the push went without the control plane's credentials")
			}
		}
	}
	if !pushed {
		t.Errorf("the git server saw no push")
	}

	// And no secret in the logs, the events or the artifacts.
	var seen strings.Builder
	seen.WriteString(h.logs.String())
	for _, name := range []string{"result.json", "transcript.jsonl", "patch.diff"} {
		b, err := c.GetArtifact(ctx, runID, name)
		if err != nil {
			t.Fatal(err)
		}
		seen.Write(b)
	}
	for _, e := range events {
		seen.Write(e.Data)
	}
	for what, s := range secrets {
		if strings.Contains(seen.String(), s) {
			t.Errorf("the %s shows in a log line, an event or an artifact", what)
		}
	}
}

// sandboxProcesses lists the processes whose working directory is in the
// sandbox's workspace: the entry and everything it started.
func sandboxProcesses(tb testing.TB, workspace string) []int {
	tb.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var pids []int
	for _, d := range procs {
		var pid int
		if _, err := fmt.Sscanf(d.Name(), "%d", &pid); err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", d.Name(), "cwd"))
		if err == nil && (cwd == workspace || strings.HasPrefix(cwd, workspace+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func moduleRoot(tb testing.TB) string {
	tb.Helper()
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}
