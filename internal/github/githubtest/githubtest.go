// Package githubtest helps tests of GitHub's side of belay: GitHub's own
// example webhook payloads (the npm package @octokit/webhooks-examples,
// pinned in package.json), signing them as GitHub does, and a stand-in for
// the few REST calls of the safe outputs.
//
// No GitHub runs here: the REST stand-in is an httptest server that checks
// each request it gets (method, path, token, JSON body) against what
// GitHub's API documents for it, and records it for the test to assert on.
// It answers as GitHub would, with only the fields belay reads.
package githubtest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
)

// Examples returns GitHub's example payloads by event name, each as raw
// JSON, from node_modules/@octokit/webhooks-examples (npm ci installs it).
// Without it the test skips outside CI and fails under CI=true.
func Examples(tb testing.TB) map[string][]json.RawMessage {
	tb.Helper()
	path := filepath.Join(moduleRoot(tb), "node_modules", "@octokit", "webhooks-examples", "api.github.com", "index.json")
	b, err := os.ReadFile(path)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("GitHub's example payloads are missing (%v); CI installs them with npm ci", err)
		}
		tb.Skipf("GitHub's example payloads are missing (%v); run npm ci", err)
	}
	var index []struct {
		Name     string            `json:"name"`
		Examples []json.RawMessage `json:"examples"`
	}
	if err := json.Unmarshal(b, &index); err != nil {
		tb.Fatalf("read %s: %v", path, err)
	}
	out := map[string][]json.RawMessage{}
	for _, e := range index {
		out[e.Name] = e.Examples
	}
	return out
}

// Example returns the first example of event whose action is action ("" for
// events without one), decoded so a test can change a field, and fails the
// test when there is none.
func Example(tb testing.TB, all map[string][]json.RawMessage, event, action string) map[string]any {
	tb.Helper()
	for _, raw := range all[event] {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			tb.Fatal(err)
		}
		if a, _ := m["action"].(string); a == action {
			return m
		}
	}
	tb.Fatalf("no %s example with action %q", event, action)
	return nil
}

// Sign returns the X-Hub-Signature-256 value GitHub sends for body.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func moduleRoot(tb testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("githubtest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Call is one REST call the stand-in took.
type Call struct {
	Method, Path string
	Body         map[string]any
}

// API is the stand-in for GitHub's REST API.
type API struct {
	URL   string
	Token string

	mu     sync.Mutex
	calls  []Call
	errs   []string
	notify chan Call
	// Heads answers GET /repos/{o}/{r}/pulls/{n}: the head branch of each
	// pull request number.
	Heads map[int]string
}

var (
	pullsPath          = regexp.MustCompile(`^/repos/([^/]+)/([^/]+)/pulls$`)
	pullPath           = regexp.MustCompile(`^/repos/([^/]+)/([^/]+)/pulls/(\d+)$`)
	issueCommentsPath  = regexp.MustCompile(`^/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$`)
	commitCommentsPath = regexp.MustCompile(`^/repos/([^/]+)/([^/]+)/commits/([0-9a-f]{40})/comments$`)
)

// StartAPI starts the stand-in; every call must carry token as a bearer.
func StartAPI(tb testing.TB, token string) *API {
	tb.Helper()
	a := &API{Token: token, notify: make(chan Call, 100), Heads: map[int]string{}}
	srv := httptest.NewServer(http.HandlerFunc(a.serve))
	tb.Cleanup(srv.Close)
	tb.Cleanup(func() {
		for _, e := range a.Errors() {
			tb.Errorf("GitHub stand-in: %s", e)
		}
	})
	a.URL = srv.URL + "/"
	return a
}

func (a *API) fail(w http.ResponseWriter, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	a.mu.Lock()
	a.errs = append(a.errs, msg)
	a.mu.Unlock()
	http.Error(w, `{"message":"`+msg+`"}`, status)
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	if got := r.Header.Get("Authorization"); got != "Bearer "+a.Token {
		a.fail(w, http.StatusUnauthorized, "%s %s without the token", r.Method, r.URL.Path)
		return
	}
	var body map[string]any
	if r.Method == http.MethodPost {
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			a.fail(w, http.StatusUnsupportedMediaType, "%s %s with Content-Type %q", r.Method, r.URL.Path, ct)
			return
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &body); err != nil {
			a.fail(w, http.StatusBadRequest, "%s %s: body is not a JSON object", r.Method, r.URL.Path)
			return
		}
	}
	need := func(fields ...string) bool {
		for _, f := range fields {
			if s, _ := body[f].(string); s == "" {
				a.fail(w, http.StatusUnprocessableEntity, "%s %s: %q is missing", r.Method, r.URL.Path, f)
				return false
			}
		}
		return true
	}
	p := r.URL.Path
	var answer any
	status := http.StatusCreated
	switch {
	case r.Method == http.MethodPost && pullsPath.MatchString(p):
		if !need("title", "head", "base") {
			return
		}
		answer = map[string]any{"number": 42, "html_url": "https://github.invalid" + p + "/42"}
	case r.Method == http.MethodGet && pullPath.MatchString(p):
		n, _ := strconv.Atoi(pullPath.FindStringSubmatch(p)[3])
		head, ok := a.Heads[n]
		if !ok {
			a.fail(w, http.StatusNotFound, "no pull request %d", n)
			return
		}
		status = http.StatusOK
		answer = map[string]any{"number": n, "head": map[string]any{"ref": head}, "base": map[string]any{"ref": "main"}}
	case r.Method == http.MethodPost && issueCommentsPath.MatchString(p):
		if !need("body") {
			return
		}
		answer = map[string]any{"id": 1, "body": body["body"]}
	case r.Method == http.MethodPost && commitCommentsPath.MatchString(p):
		if !need("body") {
			return
		}
		answer = map[string]any{"id": 2, "body": body["body"]}
	default:
		a.fail(w, http.StatusNotFound, "unexpected call %s %s", r.Method, p)
		return
	}
	c := Call{Method: r.Method, Path: p, Body: body}
	a.mu.Lock()
	a.calls = append(a.calls, c)
	a.mu.Unlock()
	select {
	case a.notify <- c:
	default:
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(answer)
}

// Calls returns the calls taken so far.
func (a *API) Calls() []Call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Call(nil), a.calls...)
}

// Errors returns what the stand-in refused.
func (a *API) Errors() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errs...)
}

// Next returns the next call, or false when none comes before done.
func (a *API) Next(done <-chan struct{}) (Call, bool) {
	select {
	case c := <-a.notify:
		return c, true
	case <-done:
		return Call{}, false
	}
}
