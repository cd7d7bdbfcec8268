package triggers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/triggers"
)

const good = `{"repositories": [{
  "repository": "octo-org/octo-repo",
  "cloneUrl": "file:///srv/mirrors/octo-repo.git",
  "on": {"issue_comment": {"command": "/belay"},
         "issues": {"labels": ["belay"]},
         "pull_request": {"actions": ["opened", "synchronize"], "instruction": "Review and fix the tests"},
         "push": {"branches": ["main"], "instruction": "Keep the tests green"}},
  "allowedPaths": ["src/**"], "checks": [["python3", "-m", "pytest", "-q"]],
  "maxSteps": 12, "approval": {"policy": "deny_all"},
  "outputs": {"branch": true, "pullRequest": true, "comment": false}}]}`

var limits = belay.DefaultLimits("test-model")

func parse(t *testing.T, s string) *triggers.Config {
	t.Helper()
	c, err := triggers.Parse(strings.NewReader(s), limits)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestParseRefusesWithClearErrors(t *testing.T) {
	repl := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("%q not in the sample", old)
		}
		return strings.Replace(good, old, new, 1)
	}
	for name, c := range map[string]struct{ file, want string }{
		"not JSON":          {"{", "not a triggers file"},
		"unknown field":     {repl(`"maxSteps": 12`, `"maxSteps": 12, "steps": 3`), `unknown field "steps"`},
		"empty":             {`{"repositories": []}`, `"repositories" is empty`},
		"no repository":     {repl(`"repository": "octo-org/octo-repo",`, ``), `"repository" must name`},
		"not owner/name":    {repl(`"octo-org/octo-repo"`, `"octo-repo"`), `must be "owner/name"`},
		"credentials":       {repl(`file:///srv/mirrors/octo-repo.git`, `https://u:p@github.com/o/r.git`), "cloneUrl: holds credentials"},
		"no events":         {repl(`"on": {`, `"on": {}, "x": {`), `unknown field "x"`},
		"bad command":       {repl(`"/belay"`, `"belay"`), `starting with "/"`},
		"no labels":         {repl(`["belay"]`, `[]`), "on.issues.labels"},
		"bad action":        {repl(`"synchronize"`, `"merged"`), `"merged" is not one of`},
		"no PR instruction": {repl(`"Review and fix the tests"`, `" "`), "on.pull_request.instruction is required"},
		"belay branch":      {repl(`["main"]`, `["belay/x"]`), "must be a branch name"},
		"bad check":         {repl(`["python3", "-m", "pytest", "-q"]`, `["sh", "-c", "make"]`), "is not an allowed check"},
		"glob path":         {repl(`"src/**"`, `"src/*.py"`), "pattern characters"},
		"duplicate":         {strings.Replace(good, `}]}`, `}, {"repository": "Octo-Org/Octo-Repo", "on": {"issues": {"labels": ["x"]}}, "allowedPaths": ["a"], "checks": [["git", "diff", "--check"]]}]}`, 1), "is already repositories[0]"},
	} {
		_, err := triggers.Parse(strings.NewReader(c.file), limits)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse = %v; want an error containing %q", name, err, c.want)
		}
	}
}

func event(kind string) belay.RepoEvent {
	ev := belay.RepoEvent{Version: "1", Provider: "github", Event: kind, Delivery: "d-1", Repository: "octo-org/octo-repo",
		CloneURL: "https://github.com/octo-org/octo-repo.git", DefaultBranch: "main", Actor: "octocat", Association: "MEMBER",
		ReceivedAt: time.Now()}
	switch kind {
	case "issue_comment":
		ev.Action = "created"
		ev.Issue = &belay.RepoIssue{Number: 7, Title: "add() subtracts"}
		ev.Comment = &belay.RepoComment{ID: 1, Body: "/belay fix the failing test\nplease"}
	case "issues":
		ev.Action, ev.Label = "labeled", "belay"
		ev.Issue = &belay.RepoIssue{Number: 8, Title: "Spelling error", Body: "commit has two t's"}
	case "pull_request":
		ev.Action = "opened"
		ev.PullRequest = &belay.RepoPullRequest{Number: 2, Title: "t", HeadRef: "changes", HeadSHA: strings.Repeat("e", 40), BaseRef: "main"}
		ev.Commit = ev.PullRequest.HeadSHA
	case "push":
		ev.Ref, ev.Commit = "refs/heads/main", strings.Repeat("6", 40)
	}
	return ev
}

func TestMatchAndRender(t *testing.T) {
	c := parse(t, good)
	for kind, want := range map[string]struct{ instruction, ref, base string }{
		"issue_comment": {"fix the failing test\nplease", "main", "main"},
		"issues":        {"Spelling error\n\ncommit has two t's", "main", "main"},
		"pull_request":  {"Review and fix the tests", "refs/pull/2/head", "changes"},
		"push":          {"Keep the tests green", "refs/heads/main", "main"},
	} {
		ev := event(kind)
		r, reason := c.Match(ev)
		if r == nil {
			t.Errorf("%s: not matched: %s", kind, reason)
			continue
		}
		req := triggers.Render(ev, r)
		if req.Instruction != want.instruction {
			t.Errorf("%s: instruction %q, want %q", kind, req.Instruction, want.instruction)
		}
		g := req.Source.Git
		if g.URL != "file:///srv/mirrors/octo-repo.git" || g.Ref != want.ref || g.Commit != ev.Commit {
			t.Errorf("%s: source %+v", kind, g)
		}
		tr := req.Trigger
		if tr == nil || tr.Event != kind || tr.Delivery != "d-1" || tr.Actor != "octocat" || tr.BaseBranch != want.base ||
			tr.Outputs != (belay.TriggerOutputs{Branch: true, PullRequest: true}) {
			t.Errorf("%s: trigger %+v", kind, tr)
		}
		lim := limits
		lim.GitURLs = triggers.OperatorGitURLs
		if _, err := lim.Validate(req); err != nil {
			t.Errorf("%s: the rendered request is invalid: %v", kind, err)
		}
	}
}

func TestMatchSaysWhyNot(t *testing.T) {
	c := parse(t, good)
	cases := map[string]struct {
		edit func(*belay.RepoEvent)
		kind string
		want string
	}{
		"unlisted repository": {func(e *belay.RepoEvent) { e.Repository = "octo-org/other" }, "push", "not in the triggers file"},
		"no command":          {func(e *belay.RepoEvent) { e.Comment.Body = "looks good" }, "issue_comment", "does not start with /belay"},
		"command in a word":   {func(e *belay.RepoEvent) { e.Comment.Body = "/belayed it" }, "issue_comment", "does not start with /belay"},
		"no write access":     {func(e *belay.RepoEvent) { e.Association = "CONTRIBUTOR" }, "issue_comment", "association with octo-org/octo-repo is CONTRIBUTOR"},
		"no association":      {func(e *belay.RepoEvent) { e.Association = "" }, "issue_comment", "is NONE"},
		"edited comment":      {func(e *belay.RepoEvent) { e.Action = "edited" }, "issue_comment", "only new comments"},
		"empty command":       {func(e *belay.RepoEvent) { e.Comment.Body = "/belay   " }, "issue_comment", "no instruction"},
		"other label":         {func(e *belay.RepoEvent) { e.Label = "bug" }, "issues", `label "bug" is not one of`},
		"closed PR":           {func(e *belay.RepoEvent) { e.Action = "closed" }, "pull_request", "action closed is not one of"},
		"belay's own PR":      {func(e *belay.RepoEvent) { e.PullRequest.HeadRef = "belay/run_x" }, "pull_request", "belay's own"},
		"PR from outside":     {func(e *belay.RepoEvent) { e.Association = "NONE" }, "pull_request", "is NONE"},
		"other branch":        {func(e *belay.RepoEvent) { e.Ref = "refs/heads/dev" }, "push", "branch dev is not one of"},
		"belay branch push":   {func(e *belay.RepoEvent) { e.Ref = "refs/heads/belay/run_x" }, "push", "belay's own output"},
		"tag push":            {func(e *belay.RepoEvent) { e.Ref = "refs/tags/v1" }, "push", "is not a branch"},
	}
	for name, tc := range cases {
		ev := event(tc.kind)
		tc.edit(&ev)
		r, reason := c.Match(ev)
		if r != nil || !strings.Contains(reason, tc.want) {
			t.Errorf("%s: Match = %v, %q; want no match saying %q", name, r != nil, reason, tc.want)
		}
	}
	// An event the file does not list for the repository.
	only := parse(t, strings.Replace(good, `"issues": {"labels": ["belay"]},`, ``, 1))
	if r, reason := only.Match(event("issues")); r != nil || !strings.Contains(reason, "no runs on issues events") {
		t.Errorf("unlisted event: %v %q", r != nil, reason)
	}
}
