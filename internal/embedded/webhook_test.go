package embedded_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dispatch"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/github/githubtest"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
	"github.com/belay-dev/belay/internal/sqlite"
	"github.com/belay-dev/belay/internal/wire"
)

// webhookSecret signs the test's deliveries; gitToken is what the loopback
// git server takes; githubToken what the GitHub stand-in takes. None may
// reach a log line.
const (
	webhookSecret = "whsec-CANARY-3f9a1b77c2"
	gitToken      = "ghs_CANARY_git_7d1e5c"
	githubToken   = "ghp_CANARY_api_0b4d2a"
)

// hookHarness is belay serve with triggers for Codertocat/Hello-World (the
// repository of GitHub's example payloads), whose clone URL is a real git
// server on loopback.
type hookHarness struct {
	t          *testing.T
	m          *embedded.Main
	repo       *gittest.Repo
	commit     string
	api        *githubtest.API
	logs       *embeddedtest.Logs
	dispatched chan dispatch.Outcome
	base       string
	cfg        embedded.Config
	srv        *gittest.Server
}

func (h *hookHarness) repoServer() *gittest.Server { return h.srv }

// hookOptions vary the harness: the sandbox entry, the model (nil: the
// scripted example session), the approval policy of the trigger.
type hookOptions struct {
	sandbox  string
	provider *provider
	approval string
}

func startHookHarness(t *testing.T, o hookOptions) *hookHarness {
	t.Helper()
	srv := gittest.Start(t, "x-access-token", gitToken)
	calc := filepath.Join(embeddedtest.ModuleRoot(t), "examples", "calc")
	files := map[string]string{}
	for _, f := range treeFiles(t, calc) {
		files[f.Path] = f.Content
	}
	repo := srv.NewRepo(t, "Codertocat/Hello-World", files, true)
	h := &hookHarness{t: t, repo: repo, srv: srv, api: githubtest.StartAPI(t, githubToken), logs: &embeddedtest.Logs{},
		dispatched: make(chan dispatch.Outcome, 32)}
	h.commit = strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
	// GitHub's examples say the default branch is master.
	gittest.Git(t, repo.Dir, "push", "-q", "origin", "HEAD:refs/heads/master")
	triggersFile := fmt.Sprintf(`{"repositories": [{
	  "repository": "Codertocat/Hello-World",
	  "cloneUrl": %q,
	  "on": {"issue_comment": {"command": "/belay"},
	         "issues": {"labels": ["bug"]},
	         "pull_request": {"actions": ["opened", "synchronize"], "instruction": "Make the tests pass on this pull request"},
	         "push": {"branches": ["master"], "instruction": "Keep the tests green after this push"}},
	  "allowedPaths": ["calc.py"], "checks": [["python3", "-m", "pytest", "-q"]],
	  "maxSteps": 12, "wallTimeSeconds": 120, "approval": {"policy": %q},
	  "outputs": {"branch": true, "pullRequest": true, "comment": true}}]}`, repo.URL, cmp.Or(o.approval, "deny_all"))
	cfg := embeddedtest.Config(t, h.logs)
	cfg.Model = e2eModel
	cfg.SandboxBin = o.sandbox
	if o.provider != nil {
		cfg.ScriptedModel = ""
		cfg.ModelAPIURL = o.provider.srv.URL + "/v1/chat/completions"
		cfg.ModelAPIKey = providerKey
		t.Cleanup(func() {
			o.provider.Release()
			o.provider.srv.CloseClientConnections()
		})
	}
	h.cfg = cfg
	cfg.RepoEvents = embedded.RepoEventsConfig{
		Triggers:       triggersFile,
		WebhookSecret:  webhookSecret,
		GitCredentials: strings.Replace(srv.URL, "http://", "http://x-access-token:"+gitToken+"@", 1),
		GitHubAPIURL:   h.api.URL,
		GitHubToken:    githubToken,
	}
	cfg.OnDispatched = func(_ belay.RepoEvent, out dispatch.Outcome, err error) {
		if err != nil {
			t.Errorf("dispatch: %v", err)
		}
		h.dispatched <- out
	}
	h.m = embeddedtest.Start(t, cfg)
	h.base = "http://" + h.m.Addr()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane log:\n%s", h.logs.String())
		}
		for _, secret := range []string{webhookSecret, gitToken, githubToken} {
			if strings.Contains(h.logs.String(), secret) {
				t.Errorf("a secret reached the log")
			}
		}
	})
	return h
}

// deliver posts a payload as GitHub would, signed with sign (the real
// secret, a wrong one, or none when empty).
func (h *hookHarness) deliver(event, delivery string, body []byte, signature string) (int, wire.WebhookResponse, wire.ErrorBody) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.base+wire.GitHubWebhookPath, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/test")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", delivery)
	if signature != "" {
		req.Header.Set("X-Hub-Signature-256", signature)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var ok wire.WebhookResponse
	var bad wire.ErrorBody
	if resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, &ok); err != nil {
			h.t.Fatalf("answer %s: %v", raw, err)
		}
	} else {
		_ = json.Unmarshal(raw, &bad)
	}
	return resp.StatusCode, ok, bad
}

func (h *hookHarness) signed(event, delivery string, payload map[string]any) (int, wire.WebhookResponse, wire.ErrorBody) {
	h.t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.deliver(event, delivery, body, githubtest.Sign(webhookSecret, body))
}

// waitDispatched returns the next dispatch's outcome.
func (h *hookHarness) waitDispatched() dispatch.Outcome {
	h.t.Helper()
	select {
	case out := <-h.dispatched:
		return out
	case <-time.After(runDeadline):
		h.t.Fatal("no dispatch")
	}
	return dispatch.Outcome{}
}

// runCount is how many runs the control plane has.
func (h *hookHarness) runCount() int {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.base+"/v1/runs?limit=100", nil)
	req.Header.Set("Authorization", "Bearer "+h.m.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list wire.RunList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		h.t.Fatal(err)
	}
	return len(list.Runs)
}

// storedRun reads a run from the SQLite file the control plane writes.
func (h *hookHarness) storedRun(id string) belay.Run {
	h.t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(h.m.DataDir(), "belay.db"), sqlite.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	defer st.Close()
	run, err := st.GetRun(context.Background(), id)
	if err != nil {
		h.t.Fatalf("GetRun(%s): %v", id, err)
	}
	return run
}

// TestGitHubWebhooks delivers GitHub's own example payloads, signed, to
// POST /v1/webhooks/github: the ones the triggers match create a run with
// the right instruction, source and trigger; bad signatures, a replay, an
// unlisted repository, an author without write access and an oversized
// body create nothing.
func TestGitHubWebhooks(t *testing.T) {
	gittest.NeedGit(t)
	h := startHookHarness(t, hookOptions{sandbox: embeddedtest.InertSandbox(t)})
	examples := githubtest.Examples(t)

	// ping
	ping := githubtest.Example(t, examples, "ping", "")
	if status, ans, _ := h.signed("ping", "ping-1", ping); status != http.StatusOK || !ans.Pong {
		t.Errorf("ping: %d %+v, want 200 pong", status, ans)
	}

	comment := githubtest.Example(t, examples, "issue_comment", "created")
	comment["comment"].(map[string]any)["body"] = "/belay fix the failing test in calc.py"
	labeled := githubtest.Example(t, examples, "issues", "labeled")
	opened := githubtest.Example(t, examples, "pull_request", "opened")
	// The examples' commits are not in the loopback repository: point
	// them at its commit, keeping everything else as GitHub sends it.
	opened["pull_request"].(map[string]any)["head"].(map[string]any)["sha"] = h.commit
	var push map[string]any
	for _, raw := range examples["push"] {
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		if m["ref"] == "refs/heads/master" {
			push = m
			break
		}
	}
	push["after"] = h.commit

	matching := []struct {
		event, delivery string
		payload         map[string]any
		instruction     string
		action          string
		issue           int
	}{
		{"issue_comment", "d-comment", comment, "fix the failing test in calc.py", "created", 1},
		{"issues", "d-labeled", labeled, "Spelling error in the README file\n\nIt looks like you accidently spelled 'commit' with two 't's.", "labeled", 1},
		{"pull_request", "d-pr", opened, "Make the tests pass on this pull request", "opened", 2},
		{"push", "d-push", push, "Keep the tests green after this push", "", 0},
	}
	runs := map[string]string{}
	for _, c := range matching {
		status, ans, eb := h.signed(c.event, c.delivery, c.payload)
		if status != http.StatusAccepted || ans.RunID == "" || ans.Ignored != "" {
			t.Fatalf("%s: %d %+v %+v, want 202 with a run", c.event, status, ans, eb)
		}
		out := h.waitDispatched()
		if out.RunID != ans.RunID || out.Status != belay.StatusQueued {
			t.Fatalf("%s: dispatched %+v, want run %s queued", c.event, out, ans.RunID)
		}
		runs[c.delivery] = ans.RunID
		run := h.storedRun(ans.RunID)
		req := run.Request
		if req.Instruction != c.instruction {
			t.Errorf("%s: instruction %q, want %q", c.event, req.Instruction, c.instruction)
		}
		g := req.GitSource()
		if g == nil || g.URL != h.repo.URL || g.Commit != h.commit || g.Tree == nil || g.Tree.Files != 4 || g.Bundle == nil {
			t.Errorf("%s: source %+v, want the loopback repository at %s", c.event, g, h.commit)
		}
		tr := req.Trigger
		if tr == nil || tr.Provider != "github" || tr.Event != c.event || tr.Action != c.action || tr.Delivery != c.delivery ||
			tr.Repository != "Codertocat/Hello-World" || tr.Actor != "Codertocat" || tr.Commit != h.commit || tr.Issue != c.issue {
			t.Errorf("%s: trigger %+v", c.event, tr)
		}
		if len(req.Files) != 0 || strings.Join(req.AllowedPaths, ",") != "calc.py" {
			t.Errorf("%s: files %d, allowedPaths %v", c.event, len(req.Files), req.AllowedPaths)
		}
	}
	if n := h.runCount(); n != len(matching) {
		t.Fatalf("%d runs after the matching deliveries, want %d", n, len(matching))
	}

	// A replayed delivery answers the same run and creates nothing.
	if status, ans, _ := h.signed("issue_comment", "d-comment", comment); status != http.StatusAccepted || ans.RunID != runs["d-comment"] {
		t.Errorf("replay: %d %+v, want 202 with run %s", status, ans, runs["d-comment"])
	}

	// Deliveries that start nothing, with the reason in the answer.
	unlisted := githubtest.Example(t, examples, "issue_comment", "created")
	unlisted["comment"].(map[string]any)["body"] = "/belay fix it"
	unlisted["repository"].(map[string]any)["full_name"] = "octo-org/unlisted"
	outsider := githubtest.Example(t, examples, "issue_comment", "created")
	outsider["comment"].(map[string]any)["body"] = "/belay fix it"
	outsider["comment"].(map[string]any)["author_association"] = "CONTRIBUTOR"
	plain := githubtest.Example(t, examples, "issue_comment", "created")
	edited := githubtest.Example(t, examples, "issue_comment", "edited")
	edited["comment"].(map[string]any)["body"] = "/belay fix it"
	otherLabel := githubtest.Example(t, examples, "issues", "labeled")
	otherLabel["label"].(map[string]any)["name"] = "question"
	for _, c := range []struct {
		event, delivery string
		payload         map[string]any
		want            string
	}{
		{"issue_comment", "d-unlisted", unlisted, "repository octo-org/unlisted is not in the triggers file"},
		{"issue_comment", "d-outsider", outsider, "association with Codertocat/Hello-World is CONTRIBUTOR"},
		{"issue_comment", "d-plain", plain, "does not start with /belay"},
		{"issue_comment", "d-edited", edited, "only new comments"},
		{"issues", "d-question", otherLabel, `label "question" is not one of`},
		{"release", "d-release", ping, "does not act on"},
	} {
		status, ans, eb := h.signed(c.event, c.delivery, c.payload)
		if status != http.StatusAccepted || ans.RunID != "" || !strings.Contains(ans.Ignored, c.want) {
			t.Errorf("%s: %d %+v %+v, want 202 ignored: %s", c.delivery, status, ans, eb, c.want)
		}
		if !strings.Contains(h.logs.String(), "webhook ignored") {
			t.Errorf("%s: no log line says it was ignored", c.delivery)
		}
	}

	// Refused deliveries store nothing: the same delivery id is still new
	// afterwards.
	body, _ := json.Marshal(comment)
	good := githubtest.Sign(webhookSecret, body)
	tampered := bytes.Replace(body, []byte("fix the failing test"), []byte("delete every test"), 1)
	for name, c := range map[string]struct {
		body []byte
		sig  string
	}{
		"tampered body":    {tampered, good},
		"wrong secret":     {body, githubtest.Sign("not-the-secret", body)},
		"missing":          {body, ""},
		"sha1 only":        {body, "sha1=" + strings.TrimPrefix(good, "sha256=")[:40]},
		"garbage":          {body, "sha256=zz"},
		"empty body":       {[]byte{}, good},
		"signature of sha": {body, "sha256=" + strings.Repeat("0", 64)},
	} {
		status, ans, eb := h.deliver("issue_comment", "d-refused", c.body, c.sig)
		if status != http.StatusUnauthorized || eb.Error.Code != belay.CodeUnauthorized || ans.RunID != "" {
			t.Errorf("%s: %d %+v, want 401 unauthorized", name, status, eb)
		}
	}
	big := append(append([]byte(`{"pad": "`), bytes.Repeat([]byte("a"), 25<<20)...), []byte(`"}`)...)
	if status, _, eb := h.deliver("issue_comment", "d-refused", big, githubtest.Sign(webhookSecret, big)); status != http.StatusRequestEntityTooLarge || eb.Error.Code != belay.CodeTooLarge {
		t.Errorf("oversized: %d %+v, want 413 too_large", status, eb)
	}
	if n := h.runCount(); n != len(matching) {
		t.Errorf("%d runs after refused and ignored deliveries, want still %d", n, len(matching))
	}
	// Nothing was recorded for d-refused: delivered properly now, it
	// starts a run.
	status, ans, _ := h.signed("issue_comment", "d-refused", comment)
	if status != http.StatusAccepted || ans.RunID == "" || ans.RunID == runs["d-comment"] {
		t.Errorf("d-refused after the refusals: %d %+v, want a new run", status, ans)
	}
	h.waitDispatched()

	// The inert sandbox fails every run: each failed run comments its
	// reason where its event happened (the issue; the commit for a push).
	want := map[string]bool{
		"/repos/Codertocat/Hello-World/issues/1/comments":                 false,
		"/repos/Codertocat/Hello-World/issues/2/comments":                 false,
		"/repos/Codertocat/Hello-World/commits/" + h.commit + "/comments": false,
	}
	var mu sync.Mutex
	deadline := time.After(runDeadline)
	done := make(chan struct{})
	go func() { <-deadline; close(done) }()
	for {
		mu.Lock()
		all := true
		for _, seen := range want {
			all = all && seen
		}
		mu.Unlock()
		if all {
			break
		}
		c, ok := h.api.Next(done)
		if !ok {
			t.Fatalf("comments seen %v; the GitHub stand-in got %+v", want, h.api.Calls())
		}
		if _, ok := want[c.Path]; ok {
			body, _ := c.Body["body"].(string)
			if !strings.Contains(body, "failed:") || !strings.Contains(body, "sandbox exited with code 64") {
				t.Errorf("comment on %s says %q, want the failure and its reason", c.Path, body)
			}
			want[c.Path] = true
		}
	}
	for _, c := range h.api.Calls() {
		if strings.HasSuffix(c.Path, "/pulls") {
			t.Errorf("a failed run opened a pull request: %+v", c)
		}
	}
}
