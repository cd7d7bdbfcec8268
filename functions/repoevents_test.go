package functions_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	belayevents "github.com/belay-dev/belay/events"
	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dispatch"
	"github.com/belay-dev/belay/internal/github/githubtest"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
	"github.com/belay-dev/belay/internal/publish"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/wire"
)

// The secret the webhook testdata events are signed with, and the bus the
// functions are configured with.
const (
	testdataWebhookSecret = "belay-testdata-webhook-secret"
	testBus               = "belay-events"
	repoToken             = "ghs_functions_CANARY_git"
)

// eventBridge is a stand-in for EventBridge, which cannot run here: an
// awstest server that checks each PutEvents request the SDK sends and
// accepts it.
func eventBridge(t *testing.T) *awstest.Server {
	t.Helper()
	eb := awstest.New(t, "AWSEvents.")
	eb.Handle("PutEvents", func(body map[string]any) (int, any) {
		entries, _ := body["Entries"].([]any)
		out := make([]map[string]any, len(entries))
		for i := range entries {
			out[i] = map[string]any{"EventId": fmt.Sprintf("eb-%d", i)}
		}
		return http.StatusOK, map[string]any{"FailedEntryCount": 0, "Entries": out}
	})
	return eb
}

// putEntries returns the entries of every PutEvents call, each checked
// against the schema in events/ its source names.
func putEntries(t *testing.T, eb *awstest.Server) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, call := range eb.Calls("PutEvents") {
		for _, e := range call["Entries"].([]any) {
			entry := e.(map[string]any)
			if entry["EventBusName"] != testBus {
				t.Errorf("an event went to bus %v, not %s", entry["EventBusName"], testBus)
			}
			schema := belayevents.RepoEventSchema
			if entry["Source"] == belay.RunStatusSource {
				schema = belayevents.RunStatusSchema
			}
			doc, _ := json.Marshal(map[string]any{"version": "0", "id": "x", "detail-type": entry["DetailType"], "source": entry["Source"],
				"account": "123456789012", "time": "2026-11-20T09:15:02Z", "region": "eu-west-1", "resources": []string{},
				"detail": json.RawMessage(entry["Detail"].(string))})
			if err := belayevents.Validate(schema, doc); err != nil {
				t.Errorf("the %v event put on the bus is not an instance of %s: %v", entry["DetailType"], schema, err)
			}
			out = append(out, entry)
		}
	}
	return out
}

func triggersFor(url string) string {
	return fmt.Sprintf(`{"repositories": [
	  {"repository": "octo-org/octo-repo", "cloneUrl": %q,
	   "on": {"issue_comment": {"command": "/belay"}},
	   "allowedPaths": ["calc.py"], "checks": [["python3", "-m", "pytest", "-q"]]},
	  {"provider": "codecommit", "repository": "octo-repo", "cloneUrl": %q,
	   "on": {"push": {"branches": ["main"], "instruction": "Keep the tests green"}},
	   "allowedPaths": ["calc.py"], "checks": [["python3", "-m", "pytest", "-q"]]}]}`, url, url)
}

// TestWebhookFunction: the webhook bootstrap answers its testdata events
// under the emulator: a signed comment command is accepted with a run id
// and put on the bus as a normalized repository event; its redelivery
// answers the same run and puts nothing; an unsigned one is 401; a ping
// is 200.
func TestWebhookFunction(t *testing.T) {
	p := startPeers(t)
	eb := eventBridge(t)
	fn := rie.Start(t, "webhook", p.env(map[string]string{
		"BELAY_TRIGGERS":              triggersFor("https://github.com/octo-org/octo-repo.git"),
		"BELAY_GITHUB_WEBHOOK_SECRET": testdataWebhookSecret,
		"BELAY_EVENT_BUS":             testBus,
		"BELAY_EVENTBRIDGE_ENDPOINT":  eb.URL,
	}))
	invoke := func(name string) (events.APIGatewayProxyResponse, wire.WebhookResponse) {
		t.Helper()
		raw, err := os.ReadFile("webhook/testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		var resp events.APIGatewayProxyResponse
		fn.Result(t, raw, &resp)
		var ans wire.WebhookResponse
		_ = json.Unmarshal([]byte(resp.Body), &ans)
		return resp, ans
	}

	resp, ans := invoke("issue-comment.json")
	if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(ans.RunID, "run_") {
		t.Fatalf("issue-comment.json: %d %s, want 202 with a run id", resp.StatusCode, resp.Body)
	}
	entries := putEntries(t, eb)
	if len(entries) != 1 || entries[0]["Source"] != belay.RepoEventSource || entries[0]["DetailType"] != belay.RepoEventDetailType {
		t.Fatalf("put %+v, want one repository event", entries)
	}
	ev, err := belay.ParseRepoEvent([]byte(entries[0]["Detail"].(string)))
	if err != nil || ev.RunID != ans.RunID || ev.Comment.Body != "/belay fix the failing test in calc.py" || ev.Repository != "octo-org/octo-repo" {
		t.Errorf("the event on the bus is %+v (%v), want the comment with run %s", ev, err, ans.RunID)
	}

	resp, again := invoke("issue-comment.json")
	if resp.StatusCode != http.StatusAccepted || again.RunID != ans.RunID {
		t.Errorf("the redelivery: %d %s, want 202 with run %s", resp.StatusCode, resp.Body, ans.RunID)
	}
	if resp, _ := invoke("unsigned.json"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned.json: %d %s, want 401", resp.StatusCode, resp.Body)
	}
	if resp, ping := invoke("ping.json"); resp.StatusCode != http.StatusOK || !ping.Pong {
		t.Errorf("ping.json: %d %s, want 200 pong", resp.StatusCode, resp.Body)
	}
	if n := len(putEntries(t, eb)); n != 1 {
		t.Errorf("%d events on the bus after a redelivery, an unsigned delivery and a ping; want still 1", n)
	}
}

// calcRepoServer serves examples/calc on loopback git with a token.
func calcRepoServer(t *testing.T, name string) (*gittest.Server, *gittest.Repo, string) {
	t.Helper()
	srv := gittest.Start(t, "x-access-token", repoToken)
	root := filepath.Join("..", "examples", "calc")
	files := map[string]string{}
	for _, f := range []string{"calc.py", "tests/test_calc.py", "tests/conftest.py", "README.md"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	repo := srv.NewRepo(t, name, files, true)
	return srv, repo, strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
}

// TestDispatcherFunction: the dispatcher bootstrap answers its testdata
// events under the emulator: belay's own repository event becomes the
// promised run, fetched from the loopback git server at the default
// branch, with its bundle in S3 and its execution started (Step Functions
// stand-in); CodeCommit's push from the default bus becomes a run too,
// once however often EventBridge delivers it.
func TestDispatcherFunction(t *testing.T) {
	p := startPeers(t)
	_, repo, head := calcRepoServer(t, "octo-org/octo-repo")
	states := awstest.New(t, awstest.StepFunctions)
	states.Handle("StartExecution", func(body map[string]any) (int, any) {
		return http.StatusOK, map[string]any{"executionArn": "arn:aws:states:eu-west-1:123456789012:execution:belay-runs:" + body["name"].(string), "startDate": 1.7e9}
	})
	eb := eventBridge(t)
	fn := rie.Start(t, "dispatcher", p.env(map[string]string{
		"BELAY_TRIGGERS":             triggersFor(repo.URL),
		"BELAY_GIT_CREDENTIALS":      strings.Replace(repo.URL, "http://", "http://x-access-token:"+repoToken+"@", 1),
		"BELAY_STATE_MACHINE_ARN":    stateMachine,
		"BELAY_CLUSTER_ARN":          clusterARN,
		"BELAY_SFN_ENDPOINT":         states.URL,
		"BELAY_EVENT_BUS":            testBus,
		"BELAY_EVENTBRIDGE_ENDPOINT": eb.URL,
	}))

	raw, err := os.ReadFile("dispatcher/testdata/repo-event.json")
	if err != nil {
		t.Fatal(err)
	}
	var out dispatch.Outcome
	fn.Result(t, raw, &out)
	const promised = "run_4kx7q2m5n3p6r8s1t9u0v2w4y6" // the testdata event's runId
	if out.RunID != promised || out.Status != belay.StatusQueued {
		t.Fatalf("repo-event.json: %+v, want run %s queued", out, promised)
	}
	run, err := p.store.GetRun(t.Context(), promised)
	if err != nil {
		t.Fatal(err)
	}
	g := run.Request.GitSource()
	if g == nil || g.Commit != head || g.URL != repo.URL || run.Request.Instruction != "fix the failing test in calc.py" ||
		run.Request.Trigger == nil || run.Request.Trigger.Delivery != "72d3162e-cc78-11e3-81ab-4c9367dc0958" {
		t.Errorf("the run's request: source %+v, instruction %q, trigger %+v", g, run.Request.Instruction, run.Request.Trigger)
	}
	if rc, size, err := p.artifacts.OpenSource(t.Context(), promised); err != nil || size != g.Bundle.Size {
		t.Errorf("the run's bundle in S3: size %d, %v; want %d", size, err, g.Bundle.Size)
	} else {
		rc.Close()
	}
	if calls := states.Calls("StartExecution"); len(calls) != 1 || calls[0]["name"] != promised {
		t.Errorf("StartExecution calls %+v, want one named %s", calls, promised)
	}
	// The queued run's status went on the bus.
	if entries := putEntries(t, eb); len(entries) != 1 || entries[0]["Source"] != belay.RunStatusSource {
		t.Errorf("bus entries %+v, want one run status event", entries)
	}

	// CodeCommit's event, pointed at the loopback repository's commit.
	raw, err = os.ReadFile("dispatcher/testdata/codecommit-push.json")
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.ReplaceAll(raw, []byte("3e5f7a9b1c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f"), []byte(head))
	var cc, again dispatch.Outcome
	fn.Result(t, raw, &cc)
	if !strings.HasPrefix(cc.RunID, "run_") || cc.Status != belay.StatusQueued || cc.RunID == promised {
		t.Fatalf("codecommit-push.json: %+v, want a new queued run", cc)
	}
	fn.Result(t, raw, &again)
	if again.RunID != cc.RunID {
		t.Errorf("the same CodeCommit event again: %+v, want run %s", again, cc.RunID)
	}
	ccRun, err := p.store.GetRun(t.Context(), cc.RunID)
	if err != nil || ccRun.Request.Trigger.Provider != "codecommit" || ccRun.Request.GitSource().Commit != head ||
		ccRun.Request.Instruction != "Keep the tests green" {
		t.Errorf("the CodeCommit run: %+v (%v)", ccRun.Request, err)
	}
	if n := len(states.Calls("StartExecution")); n != 2 {
		t.Errorf("%d executions started, want 2", n)
	}
}

// TestPublisherFunction: the publisher bootstrap answers its testdata run
// status event under the emulator: the completed run's validated patch is
// pushed as belay/<runId> to the loopback git server with the control
// plane's credentials, and a pull request and a comment go to the GitHub
// stand-in (no GitHub runs here; it checks each request).
func TestPublisherFunction(t *testing.T) {
	p := startPeers(t)
	_, repo, base := calcRepoServer(t, "octo-org/octo-repo")
	creds := strings.Replace(repo.URL, "http://", "http://x-access-token:"+repoToken+"@", 1)
	api := githubtest.StartAPI(t, "ghp_functions_CANARY_api")

	raw, err := os.ReadFile("publisher/testdata/run-completed.json")
	if err != nil {
		t.Fatal(err)
	}
	var ev belay.BusEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	st, err := belay.ParseRunStatusEvent(ev.Detail)
	if err != nil {
		t.Fatal(err)
	}
	// The run the event names, as the dispatcher and the state machine
	// left it: fetched from the loopback repository, completed with a
	// patch. Its trigger is the event's, on the repository's commit.
	c, err := gitsource.ParseCredentials(strings.NewReader(creds))
	if err != nil {
		t.Fatal(err)
	}
	fetched, err := gitsource.New(gitsource.Config{Credentials: c, TempDir: t.TempDir()}).Fetch(t.Context(), belay.GitSource{URL: repo.URL, Ref: "main"}, gitsource.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	defer fetched.Close()
	trigger := *st.Trigger
	trigger.Commit = base
	tree, bundle := fetched.Tree, fetched.Bundle
	now := time.Now().UTC()
	run := belay.Run{ID: st.RunID, Status: belay.StatusQueued, CreatedAt: now, UpdatedAt: now, RequestHash: "h",
		Request: belay.RunRequest{Instruction: "fix the failing test in calc.py", Model: testModel,
			Source:       &belay.Source{Git: &belay.GitSource{URL: repo.URL, Ref: "main", Commit: base, Tree: &tree, Bundle: &bundle}},
			AllowedPaths: []string{"calc.py"}, Checks: [][]string{{"python3", "-m", "pytest", "-q"}}, MaxSteps: 12, WallTimeSeconds: 120,
			Approval: belay.ApprovalConfig{Policy: belay.PolicyDenyAll, TimeoutSeconds: 120}, Trigger: &trigger},
		Usage: belay.Usage{MaxRequests: 14}}
	if _, _, err := p.store.CreateRun(t.Context(), run, ""); err != nil {
		t.Fatal(err)
	}
	for to, event := range map[belay.RunStatus]string{belay.StatusRunning: belay.EventRunStarted} {
		if _, err := p.store.Transition(t.Context(), run.ID, belay.Transition{To: to, At: time.Now(), Attempt: 1,
			Events: []belay.EventInput{{Type: event}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.store.Transition(t.Context(), run.ID, belay.Transition{To: belay.StatusCompleted, At: time.Now(),
		ChangedFiles: []string{"calc.py"}, Events: []belay.EventInput{{Type: belay.EventRunCompleted}}}); err != nil {
		t.Fatal(err)
	}
	rc, _ := fetched.OpenBundle()
	if _, err := p.artifacts.PutSource(t.Context(), run.ID, rc, 100<<20); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	scratch := t.TempDir()
	gittest.Git(t, "", "clone", "-q", repo.Bare, scratch)
	if err := os.WriteFile(filepath.Join(scratch, "calc.py"), []byte(strings.Replace(gittest.Git(t, scratch, "show", "HEAD:calc.py"), "return a - b", "return a + b", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	patch := gittest.Git(t, scratch, "diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", "HEAD", "--")
	if err := p.artifacts.PutArtifact(t.Context(), run.ID, "patch.diff", []byte(patch)); err != nil {
		t.Fatal(err)
	}

	fn := rie.Start(t, "publisher", p.env(map[string]string{
		"BELAY_GIT_CREDENTIALS": creds,
		"BELAY_GITHUB_API_URL":  api.URL,
		"BELAY_GITHUB_TOKEN":    "ghp_functions_CANARY_api",
	}))
	var res publish.Result
	fn.Result(t, raw, &res)
	branch := "belay/" + run.ID
	if res.Branch != branch || res.PullRequest != 42 || !res.Commented {
		t.Fatalf("run-completed.json: %+v, want %s pushed, pull request 42 and a comment", res, branch)
	}
	diff := gittest.Git(t, repo.Bare, "diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", base, "refs/heads/"+branch, "--")
	if diff != patch {
		t.Errorf("the pushed branch's diff is not the patch:\n got %q\nwant %q", diff, patch)
	}
	calls := api.Calls()
	if len(calls) != 2 || calls[0].Path != "/repos/octo-org/octo-repo/pulls" || calls[0].Body["head"] != branch || calls[0].Body["base"] != "main" ||
		calls[1].Path != "/repos/octo-org/octo-repo/issues/7/comments" {
		t.Errorf("GitHub calls %+v, want a pull request of %s into main and a comment on #7", calls, branch)
	}
	// A second delivery of the event writes nothing more.
	var second publish.Result
	fn.Result(t, raw, &second)
	if second.Skipped == "" || len(api.Calls()) != 2 {
		t.Errorf("the second delivery: %+v, %d GitHub calls; want skipped and still 2", second, len(api.Calls()))
	}
	if strings.Contains(fn.Logs(), repoToken) || strings.Contains(fn.Logs(), "ghp_functions_CANARY_api") {
		t.Errorf("a token reached the publisher's log")
	}
}

// TestAPIGitSource: the api bootstrap fetches a run's git source itself
// (POST /v1/runs with source.git, as `belay run --repo` and git sessions
// send it) from the loopback git server with the control plane's git
// credentials, keeps its bundle in S3 (gofakes3) for the sandbox and
// starts the run; a repository the credentials cannot open stores no run;
// the credential is in no answer and no log line.
func TestAPIGitSource(t *testing.T) {
	p := startPeers(t)
	_, repo, head := calcRepoServer(t, "octo-org/calc")
	fn, states := startAPI(t, p, map[string]string{"BELAY_AUTH": "token", "BELAY_TOKEN": controlToken,
		"BELAY_GIT_CREDENTIALS": strings.Replace(repo.URL, "http://", "http://x-access-token:"+repoToken+"@", 1), "BELAY_GIT_LOOPBACK_HTTP": "1"})
	withSource := func(url string) func(*events.APIGatewayProxyRequest) {
		return func(ev *events.APIGatewayProxyRequest) {
			ev.Body = `{"instruction": "Fix the failing test in calc.py", "source": {"git": {"url": "` + url + `"}},
				"allowedPaths": ["calc.py"], "checks": [["python3", "-m", "pytest", "-q"]], "maxSteps": 8, "wallTimeSeconds": 120}`
			delete(ev.Headers, "Idempotency-Key")
			delete(ev.MultiValueHeaders, "Idempotency-Key")
		}
	}

	created := createRun(t, fn, p, apiEvent(t, "api", "create-run.json", withSource(repo.URL)))
	run, err := p.store.GetRun(t.Context(), created.RunID)
	if err != nil {
		t.Fatal(err)
	}
	g := run.Request.GitSource()
	if g == nil || g.URL != repo.URL || g.Commit != head || g.Tree == nil || g.Tree.Files != 4 || g.Bundle == nil {
		t.Fatalf("the run's source: %+v; want %s at %s with its 4 files and a bundle", g, repo.URL, head)
	}
	if rc, size, err := p.artifacts.OpenSource(t.Context(), created.RunID); err != nil || size != g.Bundle.Size {
		t.Errorf("the run's bundle in S3: size %d, %v; want %d", size, err, g.Bundle.Size)
	} else {
		rc.Close()
	}
	if starts := states.Calls("StartExecution"); len(starts) != 1 || starts[0]["name"] != created.RunID {
		t.Errorf("StartExecution calls %v, want one for %s", starts, created.RunID)
	}

	// A repository the server does not have: a clear refusal, no run.
	missing := strings.TrimSuffix(repo.URL, "calc.git") + "gone.git"
	resp := buffered(t, fn, apiEvent(t, "api", "create-run.json", withSource(missing)))
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, resp.Body) != belay.CodeInvalid {
		t.Errorf("a missing repository: %d %s, want 400 invalid", resp.StatusCode, resp.Body)
	}
	if n := len(states.Calls("StartExecution")); n != 1 {
		t.Errorf("%d executions started, want still 1", n)
	}
	if strings.Contains(resp.Body, repoToken) || strings.Contains(fn.Logs(), repoToken) {
		t.Error("the git credential is in an answer or the function's log")
	}

	// Credentials the operator has not put yet (the stack's secret holds a
	// generated placeholder): the function still starts and creates runs
	// from uploads; a git source is refused as unavailable, saying what to
	// fix.
	fn.Stop()
	bad, _ := startAPI(t, p, map[string]string{"BELAY_AUTH": "token", "BELAY_TOKEN": controlToken,
		"BELAY_GIT_CREDENTIALS": "placeholder-" + repoToken, "BELAY_GIT_LOOPBACK_HTTP": "1"})
	resp = buffered(t, bad, apiEvent(t, "api", "create-run.json", withSource(repo.URL)))
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, resp.Body) != belay.CodeUnavailable ||
		!strings.Contains(resp.Body, "BELAY_GIT_CREDENTIALS_SECRET_ARN") {
		t.Errorf("unreadable credentials: %d %s, want 503 unavailable naming the secret", resp.StatusCode, resp.Body)
	}
	createRun(t, bad, p, apiEvent(t, "api", "create-run.json"))
	if strings.Contains(resp.Body, repoToken) || strings.Contains(bad.Logs(), repoToken) {
		t.Error("the unreadable credential is in an answer or the function's log")
	}
}
