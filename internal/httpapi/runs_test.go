package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

func TestHTTPStatusTable(t *testing.T) {
	for _, tc := range []struct {
		code belay.Code
		want int
	}{
		{belay.CodeInvalid, 400},
		{belay.CodeTooLarge, 413},
		{belay.CodeUnauthorized, 401},
		{belay.CodeInactiveRunToken, 401},
		{belay.CodeForbidden, 403},
		{belay.CodeNotFound, 404},
		{belay.CodeConflict, 409},
		{belay.CodeBudgetExhausted, 429},
		{belay.CodeEventsExpired, 410},
		{belay.CodeUpstream, 502},
		{belay.CodeUnavailable, 503},
		{belay.CodeInternal, 500},
		{belay.Code("made_up"), 500},
	} {
		if got := httpapi.HTTPStatus(tc.code); got != tc.want {
			t.Errorf("HTTPStatus(%q) = %d, want %d", tc.code, got, tc.want)
		}
	}
}

func TestValidateUpstreamURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		loopback bool
		ok       bool
	}{
		{"https://api.openai.com/v1/chat/completions", false, true},
		{"https://models.example/openai/deployments/x/chat/completions", false, true},
		{"http://api.openai.com/v1/chat/completions", false, false},
		{"http://api.openai.com/v1/chat/completions", true, false},
		{"http://127.0.0.1:8080/v1/chat/completions", false, false},
		{"http://127.0.0.1:8080/v1/chat/completions", true, true},
		{"http://[::1]:8080/v1/chat/completions", true, true},
		{"http://localhost:11434/v1/chat/completions", true, true},
		{"http://10.0.0.1/v1/chat/completions", true, false},
		{"https://api.openai.com/v1/chat/completions?key=x", false, false},
		{"https://api.openai.com/v1/chat/completions?", false, false},
		{"https://api.openai.com/v1/chat/completions#frag", false, false},
		{"https://api.openai.com/v1/chat/completions#", false, false},
		{"https://user:pw@api.openai.com/v1/chat/completions", false, false},
		{"https://api.openai.com/v1/completions", false, false},
		{"https://api.openai.com/v1/chat/completions/", false, false},
		{"ftp://api.openai.com/v1/chat/completions", false, false},
		{"/v1/chat/completions", false, false},
		{"", false, false},
		{"https:///chat/completions", false, false},
	} {
		err := httpapi.ValidateUpstreamURL(tc.url, tc.loopback)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateUpstreamURL(%q, %v) = %v, want ok=%v", tc.url, tc.loopback, err, tc.ok)
		}
		if err != nil && strings.Contains(tc.url, "pw@") && strings.Contains(err.Error(), "pw") {
			t.Errorf("error repeats the URL's credentials: %v", err)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	good := func() httpapi.Config {
		return httpapi.Config{
			Store: h.store, Artifacts: h.artifacts, Orchestrator: h.orch, Signer: h.signer,
			Limits: belay.DefaultLimits(testModel), ControlTokens: []string{h.controlToken},
			Upstream: httpapi.Upstream{URL: "https://api.example/v1/chat/completions",
				Key: func(context.Context) (string, error) { return "k", nil }},
		}
	}
	if _, err := httpapi.New(good()); err != nil {
		t.Fatalf("New(good config) = %v", err)
	}
	for name, mutate := range map[string]func(*httpapi.Config){
		"no store":           func(c *httpapi.Config) { c.Store = nil },
		"no artifacts":       func(c *httpapi.Config) { c.Artifacts = nil },
		"no orchestrator":    func(c *httpapi.Config) { c.Orchestrator = nil },
		"no signer":          func(c *httpapi.Config) { c.Signer = nil },
		"no model":           func(c *httpapi.Config) { c.Limits.Model = "" },
		"no body limit":      func(c *httpapi.Config) { c.Limits.MaxBodyBytes = 0 },
		"no control token":   func(c *httpapi.Config) { c.ControlTokens = nil },
		"short control tok":  func(c *httpapi.Config) { c.ControlTokens = []string{"short"} },
		"no key source":      func(c *httpapi.Config) { c.Upstream.Key = nil },
		"http upstream":      func(c *httpapi.Config) { c.Upstream.URL = "http://api.example/v1/chat/completions" },
		"upstream query":     func(c *httpapi.Config) { c.Upstream.URL += "?a=b" },
		"loopback w/o allow": func(c *httpapi.Config) { c.Upstream.URL = "http://127.0.0.1/v1/chat/completions" },
	} {
		cfg := good()
		mutate(&cfg)
		if _, err := httpapi.New(cfg); err == nil {
			t.Errorf("New(%s) succeeded, want an error", name)
		}
	}
}

func TestControlPlaneAuth(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct {
		name   string
		header string
		want   int
	}{
		{"no header", "", 401},
		{"basic scheme", "Basic " + h.controlToken, 401},
		{"wrong token", "Bearer ctl-" + randomHex(t, 24), 401},
		{"prefix of token", "Bearer " + h.controlToken[:len(h.controlToken)-1], 401},
		{"right token", "Bearer " + h.controlToken, 200},
		{"lower-case scheme", "bearer " + h.controlToken, 200},
	} {
		hdr := http.Header{}
		if tc.header != "" {
			hdr.Set("Authorization", tc.header)
		}
		a := h.do(t, "GET", "/v1/runs", "", nil, hdr)
		if a.status != tc.want {
			t.Errorf("%s: status %d, want %d: %s", tc.name, a.status, tc.want, a.body)
		}
		if tc.want == 401 && a.errorCode(t) != belay.CodeUnauthorized {
			t.Errorf("%s: code %q, want unauthorized", tc.name, a.errorCode(t))
		}
	}
	// An unknown public path is refused before routing: no route
	// enumeration without the token.
	if a := h.do(t, "GET", "/v1/nope", "", nil, nil); a.status != 401 {
		t.Errorf("GET /v1/nope without token: %d, want 401", a.status)
	}
	a := h.public(t, "GET", "/v1/nope", "")
	if a.status != 404 || a.errorCode(t) != belay.CodeNotFound {
		t.Errorf("GET /v1/nope: %d %s, want 404 not_found", a.status, a.body)
	}
	a = h.public(t, "DELETE", "/v1/runs", "")
	if a.status != 404 || a.errorCode(t) != belay.CodeNotFound {
		t.Errorf("DELETE /v1/runs: %d %s, want 404 not_found", a.status, a.body)
	}
}

func TestCommonHeadersAndErrorShape(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.public(t, "GET", "/v1/runs/run_missing", "")
	if a.status != 404 {
		t.Fatalf("status %d, want 404", a.status)
	}
	var e wire.ErrorBody
	a.decode(t, &e)
	rid := a.header.Get(wire.RequestIDHeader)
	if rid == "" || e.Error.RequestID != rid {
		t.Errorf("requestId %q, header %q: want equal and non-empty", e.Error.RequestID, rid)
	}
	if e.Error.Code != belay.CodeNotFound || e.Error.Message == "" {
		t.Errorf("error body %+v", e)
	}
	for k, want := range map[string]string{
		"Cache-Control":          "no-store",
		"X-Content-Type-Options": "nosniff",
		"Content-Type":           "application/json",
	} {
		if got := a.header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	b := h.public(t, "GET", "/v1/runs", "")
	if b.header.Get(wire.RequestIDHeader) == rid {
		t.Error("two requests got the same request id")
	}
}

func TestCreateRun(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.public(t, "POST", "/v1/runs", runBody(""))
	if a.status != http.StatusAccepted {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	var cr wire.CreateRunResponse
	a.decode(t, &cr)
	if !strings.HasPrefix(cr.RunID, "run_") || cr.Status != belay.StatusQueued {
		t.Errorf("answer %+v, want run_ id and queued", cr)
	}
	if cr.Links != wire.LinksFor(cr.RunID) || cr.Links.Cancel != "/v1/runs/"+cr.RunID+"/cancel" {
		t.Errorf("links %+v", cr.Links)
	}
	if got := a.header.Get("Location"); got != "/v1/runs/"+cr.RunID {
		t.Errorf("Location %q", got)
	}
	if sub, _ := h.orch.calls(); len(sub) != 1 || sub[0] != cr.RunID {
		t.Errorf("orchestrator submitted %v, want [%s]", sub, cr.RunID)
	}
	run, err := h.store.GetRun(context.Background(), cr.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Usage.MaxRequests != 5 || run.Request.Model != testModel || run.RequestHash == "" {
		t.Errorf("stored run: usage %+v, model %q, hash %q", run.Usage, run.Request.Model, run.RequestHash)
	}

	g := h.public(t, "GET", cr.Links.Self, "")
	if g.status != 200 {
		t.Fatalf("get: %d %s", g.status, g.body)
	}
	if strings.Contains(string(g.body), fileCanary) || strings.Contains(string(g.body), "return a - b") {
		t.Errorf("run view carries file contents: %s", g.body)
	}
	var v wire.RunView
	g.decode(t, &v)
	if v.RunID != cr.RunID || v.Status != belay.StatusQueued || v.Usage.MaxRequests != 5 ||
		len(v.Request.Files) != 2 || v.Request.Files[0] != "calc.py" || v.Model != testModel || v.CreatedAt.IsZero() {
		t.Errorf("run view %+v", v)
	}
}

func TestCreateRunIdempotency(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	key := http.Header{wire.IdempotencyKeyHeader: {"deploy-42"}}
	first := h.do(t, "POST", "/v1/runs", h.controlToken, []byte(runBody("")), key)
	again := h.do(t, "POST", "/v1/runs", h.controlToken, []byte(runBody("")), key)
	var a, b wire.CreateRunResponse
	first.decode(t, &a)
	again.decode(t, &b)
	if first.status != 202 || again.status != 202 || a.RunID != b.RunID {
		t.Errorf("same key and body: %d %s / %d %s, want one run", first.status, a.RunID, again.status, b.RunID)
	}
	if sub, _ := h.orch.calls(); len(sub) != 1 {
		t.Errorf("orchestrator submitted %v, want once", sub)
	}
	other := h.do(t, "POST", "/v1/runs", h.controlToken, []byte(runBody(`"wallTimeSeconds":60`)), key)
	if other.status != 409 || other.errorCode(t) != belay.CodeConflict {
		t.Errorf("same key, other body: %d %s, want 409 conflict", other.status, other.body)
	}
	bad := h.do(t, "POST", "/v1/runs", h.controlToken, []byte(runBody("")),
		http.Header{wire.IdempotencyKeyHeader: {strings.Repeat("k", 256)}})
	if bad.status != 400 || bad.errorCode(t) != belay.CodeInvalid {
		t.Errorf("oversize key: %d %s, want 400 invalid", bad.status, bad.body)
	}
}

func TestCreateRunRefusesBadInputAndStoresNothing(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	huge := `{"instruction":"` + strings.Repeat("x", 800<<10) + `"}`
	for _, tc := range []struct {
		name string
		body string
		want int
		code belay.Code
	}{
		{"oversize body", huge, 413, belay.CodeTooLarge},
		{"unknown field", runBody(`"priority":1`), 400, belay.CodeInvalid},
		{"other model", runBody(`"model":"gpt-other"`), 400, belay.CodeInvalid},
		{"not JSON", `{"instruction":`, 400, belay.CodeInvalid},
		{"empty", ``, 400, belay.CodeInvalid},
		{"check not allowed", strings.Replace(runBody(""), `"pytest","-q"`, `"pytest","-x"`, 1), 400, belay.CodeInvalid},
		{"bad path", strings.Replace(runBody(""), `"path":"calc.py"`, `"path":"../`+fileCanary+`.py"`, 1), 400, belay.CodeInvalid},
	} {
		a := h.public(t, "POST", "/v1/runs", tc.body)
		if a.status != tc.want || a.errorCode(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, clipBody(a.body), tc.want, tc.code)
		}
	}
	page, err := h.store.ListRuns(context.Background(), belay.ListRunsQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 0 {
		t.Errorf("refused requests stored %d runs", len(page.Runs))
	}
	if sub, _ := h.orch.calls(); len(sub) != 0 {
		t.Errorf("orchestrator submitted %v for refused requests", sub)
	}
	if strings.Contains(h.logs.String(), fileCanary) {
		t.Error("the log repeats request contents")
	}
}

func clipBody(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

func TestCreateRunSubmitFailure(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.orch.submitErr = errors.New("state machine down")
	a := h.public(t, "POST", "/v1/runs", runBody(""))
	if a.status != 503 || a.errorCode(t) != belay.CodeUnavailable {
		t.Fatalf("%d %s, want 503 unavailable", a.status, a.body)
	}
	if strings.Contains(string(a.body), "state machine down") {
		t.Errorf("answer leaks the internal error: %s", a.body)
	}
	page, err := h.store.ListRuns(context.Background(), belay.ListRunsQuery{Limit: 10})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("runs %v, %v", page.Runs, err)
	}
	if got := page.Runs[0].Status; got != belay.StatusFailed {
		t.Errorf("unsubmitted run is %s, want failed", got)
	}
	if !strings.Contains(h.logs.String(), "state machine down") {
		t.Error("the orchestrator error was not logged")
	}
}

func TestListRuns(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var ids []string
	for range 5 {
		ids = append(ids, h.createRun(t, ""))
		h.clock.Advance(1e9)
	}
	running, _ := h.startRun(t, "", 5)
	ids = append(ids, running)

	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		a := h.public(t, "GET", "/v1/runs?limit=4&cursor="+cursor, "")
		if a.status != 200 {
			t.Fatalf("list: %d %s", a.status, a.body)
		}
		var l wire.RunList
		a.decode(t, &l)
		for _, r := range l.Runs {
			got = append(got, r.RunID)
		}
		if l.NextCursor == "" {
			break
		}
		cursor = l.NextCursor
	}
	if len(got) != len(ids) {
		t.Fatalf("listed %v, want %d runs", got, len(ids))
	}
	for i := range ids {
		if got[i] != ids[len(ids)-1-i] {
			t.Errorf("listed %v, want newest first %v", got, ids)
			break
		}
	}

	var l wire.RunList
	h.public(t, "GET", "/v1/runs?status=running", "").decode(t, &l)
	if len(l.Runs) != 1 || l.Runs[0].RunID != running {
		t.Errorf("status=running listed %+v", l.Runs)
	}
	h.public(t, "GET", "/v1/runs", "").decode(t, &l)
	if len(l.Runs) != 6 {
		t.Errorf("default limit listed %d runs", len(l.Runs))
	}
	for _, q := range []string{"?status=bogus", "?limit=0", "?limit=x", "?limit=-1", "?cursor=not-a-cursor"} {
		a := h.public(t, "GET", "/v1/runs"+q, "")
		if a.status != 400 || a.errorCode(t) != belay.CodeInvalid {
			t.Errorf("GET /v1/runs%s: %d %s, want 400 invalid", q, a.status, a.body)
		}
	}
	if a := h.public(t, "GET", "/v1/runs?limit=1000", ""); a.status != 200 {
		t.Errorf("limit above the maximum: %d, want it clamped", a.status)
	}
}

func TestGetRunNotFound(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, p := range []string{"/v1/runs/run_nope", "/v1/runs/" + strings.Repeat("a", 100), "/v1/runs/a%20b"} {
		a := h.public(t, "GET", p, "")
		if a.status != 404 || a.errorCode(t) != belay.CodeNotFound {
			t.Errorf("GET %s: %d %s, want 404 not_found", p, a.status, a.body)
		}
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, "", 10)
	if a := h.chat(t, toks.Model, chatBody); a.status != 200 {
		t.Fatalf("model call before cancel: %d %s", a.status, a.body)
	}
	a := h.public(t, "POST", "/v1/runs/"+id+"/cancel", "")
	if a.status != 202 {
		t.Fatalf("cancel: %d %s", a.status, a.body)
	}
	var v wire.RunView
	a.decode(t, &v)
	if !v.CancelRequested || v.RunID != id {
		t.Errorf("cancel answer %+v", v)
	}
	// The capability is revoked at once: the next model call fails and
	// never reaches the upstream.
	calls := h.up.calls.Load()
	if a := h.chat(t, toks.Model, chatBody); a.status != 401 || a.errorCode(t) != belay.CodeInactiveRunToken {
		t.Errorf("model call after cancel: %d %s, want 401 inactive_run_token", a.status, a.body)
	}
	if h.up.calls.Load() != calls {
		t.Error("a model call after cancel reached the upstream")
	}
	if _, cancelled := h.orch.calls(); len(cancelled) != 1 || cancelled[0] != id {
		t.Errorf("orchestrator cancelled %v", cancelled)
	}
	if again := h.public(t, "POST", "/v1/runs/"+id+"/cancel", "{}"); again.status != 202 {
		t.Errorf("second cancel: %d %s, want 202", again.status, again.body)
	}
	if n := countType(h.allEvents(t, id), belay.EventCancelRequested); n != 1 {
		t.Errorf("%d run.cancel_requested events, want 1", n)
	}

	now := h.clock.Now()
	if _, err := h.store.Transition(context.Background(), id, belay.Transition{To: belay.StatusCancelled, At: now,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunCancelled}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, body string
		want       int
		code       belay.Code
	}{
		{"/v1/runs/" + id + "/cancel", "", 409, belay.CodeConflict},
		{"/v1/runs/run_missing/cancel", "", 404, belay.CodeNotFound},
		{"/v1/runs/" + id + "/cancel", `{"force":true}`, 400, belay.CodeInvalid},
	} {
		a := h.public(t, "POST", tc.path, tc.body)
		if a.status != tc.want || a.errorCode(t) != tc.code {
			t.Errorf("POST %s %s: %d %s, want %d %s", tc.path, tc.body, a.status, a.body, tc.want, tc.code)
		}
	}
}

func TestCancelOrchestratorFailure(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, "", 10)
	h.orch.cancelErr = errors.New("task stop failed")
	a := h.public(t, "POST", "/v1/runs/"+id+"/cancel", "")
	if a.status != 503 || a.errorCode(t) != belay.CodeUnavailable {
		t.Fatalf("cancel: %d %s, want 503 unavailable", a.status, a.body)
	}
	// Model calls are already stopped, and a retry goes through.
	if a := h.chat(t, toks.Model, chatBody); a.status != 401 {
		t.Errorf("model call: %d, want 401", a.status)
	}
	h.orch.cancelErr = nil
	if a := h.public(t, "POST", "/v1/runs/"+id+"/cancel", ""); a.status != 202 {
		t.Errorf("retried cancel: %d %s", a.status, a.body)
	}
}

func TestArtifacts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id := h.createRun(t, "")
	ctx := context.Background()
	files := map[string]string{
		"result.json":      `{"version":1}`,
		"patch.diff":       "--- a/calc.py\n+++ b/calc.py\n",
		"transcript.jsonl": "{\"role\":\"user\"}\n",
	}
	for name, content := range files {
		if err := h.artifacts.PutArtifact(ctx, id, name, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	a := h.public(t, "GET", "/v1/runs/"+id+"/artifacts", "")
	var list wire.ArtifactList
	a.decode(t, &list)
	if a.status != 200 || len(list.Artifacts) != 3 {
		t.Fatalf("list: %d %s", a.status, a.body)
	}
	for _, info := range list.Artifacts {
		if info.Size != int64(len(files[info.Name])) {
			t.Errorf("%s: size %d, want %d", info.Name, info.Size, len(files[info.Name]))
		}
	}
	for name, ct := range map[string]string{
		"result.json": "application/json", "patch.diff": "text/x-diff; charset=utf-8", "transcript.jsonl": "application/x-ndjson",
	} {
		a := h.public(t, "GET", "/v1/runs/"+id+"/artifacts/"+name, "")
		if a.status != 200 || string(a.body) != files[name] || a.header.Get("Content-Type") != ct {
			t.Errorf("%s: %d %q %q", name, a.status, a.header.Get("Content-Type"), a.body)
		}
	}
	other := h.createRun(t, "")
	for _, p := range []string{
		"/v1/runs/" + id + "/artifacts/secrets.txt",
		"/v1/runs/" + other + "/artifacts/result.json",
		"/v1/runs/run_missing/artifacts",
		"/v1/runs/" + id + "/artifacts/..%2f..%2fbelay.db",
	} {
		a := h.public(t, "GET", p, "")
		if a.status != 404 || a.errorCode(t) != belay.CodeNotFound {
			t.Errorf("GET %s: %d %s, want 404", p, a.status, a.body)
		}
	}
	var empty wire.ArtifactList
	h.public(t, "GET", "/v1/runs/"+other+"/artifacts", "").decode(t, &empty)
	if empty.Artifacts == nil || len(empty.Artifacts) != 0 {
		t.Errorf("run without artifacts lists %+v, want []", empty.Artifacts)
	}
}

func TestInternalHandlerServesOnlyInternalRoutes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, toks := h.startRun(t, "", 5)
	inner := httptestServer(t, h.api.InternalHandler())
	for _, p := range []string{"/v1/runs", "/v1/runs/" + id} {
		a := doURL(t, "GET", inner+p, h.controlToken, nil)
		if a.status != 404 {
			t.Errorf("internal handler GET %s: %d, want 404", p, a.status)
		}
	}
	a := doURL(t, "POST", inner+"/internal/v1/chat/completions", toks.Model, []byte(chatBody))
	if a.status != 200 {
		t.Errorf("internal handler model call: %d %s", a.status, a.body)
	}
}

func TestInternalErrorsAreOpaqueAndLogged(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id := h.createRun(t, "")
	// A closed database is a real internal failure: the store answers
	// with an error that has no code.
	if err := h.store.(io.Closer).Close(); err != nil {
		t.Fatal(err)
	}
	a := h.public(t, "GET", "/v1/runs/"+id, "")
	if a.status != 500 {
		t.Fatalf("%d %s, want 500", a.status, a.body)
	}
	var e wire.ErrorBody
	a.decode(t, &e)
	if e.Error.Code != belay.CodeInternal || e.Error.Message != "internal error" || e.Error.RequestID != a.header.Get(wire.RequestIDHeader) {
		t.Errorf("error body %+v", e)
	}
	var logged bool
	for line := range strings.Lines(h.logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["level"] == "ERROR" &&
			rec["request_id"] == e.Error.RequestID && rec["run_id"] == id && rec["err"] != "" {
			logged = true
		}
	}
	if !logged {
		t.Errorf("no error log line with the request id and run id:\n%s", h.logs.String())
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost":             true,
		"LocalHost":             true,
		"127.0.0.1":             true,
		"127.8.9.10":            true,
		"::1":                   true,
		"::ffff:127.0.0.1":      true,
		"":                      false,
		"10.0.0.1":              false,
		"0.0.0.0":               false,
		"::":                    false,
		"localhost.example.com": false,
		"127.0.0.1.example.com": false,
		"api.openai.com":        false,
	} {
		if got := httpapi.IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestStrictBodyErrors shows what a caller reads about a body the strict
// decoder refuses: the field it did not expect, in the API's words, and
// never more than a short line however long the name it sent.
func TestStrictBodyErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id := h.createRun(t, "")
	long := strings.Repeat("n", 3<<10) // under the cancel body's 4 KiB cap
	for _, tc := range []struct {
		body, want string
	}{
		{`{"force":true}`, `unknown field "force"`},
		{`{"` + long + `":1}`, `unknown field "nnnn`},
	} {
		a := h.public(t, "POST", "/v1/runs/"+id+"/cancel", tc.body)
		var e wire.ErrorBody
		a.decode(t, &e)
		if a.status != 400 || e.Error.Code != belay.CodeInvalid || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("cancel with %s: %d %s, want 400 invalid naming %q", clipBody([]byte(tc.body)), a.status, clipBody(a.body), tc.want)
		}
		if strings.Contains(e.Error.Message, "json:") || len(e.Error.Message) > 400 {
			t.Errorf("message %q: want the API's own words, at most 400 bytes", clipBody([]byte(e.Error.Message)))
		}
	}
}
