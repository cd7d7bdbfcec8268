package embedded_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// rotatingProvider is the scripted model behind a check of the provider
// key, as a real provider does it: a call with any key but the current one
// is refused with 401.
type rotatingProvider struct {
	model   *scriptedmodel.Server
	srv     *httptest.Server
	current atomic.Pointer[string]
	refused atomic.Int64
	mu      sync.Mutex
	seen    []string // the key of each call, in order
}

func newRotatingProvider(tb testing.TB, script scriptedmodel.Script, key string) *rotatingProvider {
	tb.Helper()
	p := &rotatingProvider{model: scriptedmodel.New(script)}
	p.current.Store(&key)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		p.mu.Lock()
		p.seen = append(p.seen, got)
		p.mu.Unlock()
		if got != *p.current.Load() {
			p.refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`))
			return
		}
		p.model.ServeHTTP(w, r)
	}))
	tb.Cleanup(p.srv.Close)
	return p
}

func (p *rotatingProvider) keysSeen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// TestRotatedProviderKeyIsReadAgainAfterA401 rotates the provider key in
// the key file while the provider starts refusing the old one. The control
// plane caches the key (for 10 minutes); the provider's 401 must make it
// read the file again, so the run after the refused one gets through with
// the new key. It goes through embedded.Main, so it fails if the proxy's
// 401 is not wired to the key cache.
func TestRotatedProviderKeyIsReadAgainAfterA401(t *testing.T) {
	t.Parallel()
	const oldKey, newKey = "sk-rotate-canary-old-0123456789", "sk-rotate-canary-new-9876543210"
	keyFile := filepath.Join(t.TempDir(), "provider-key")
	if err := os.WriteFile(keyFile, []byte(oldKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := scriptedmodel.Script{Name: "short", Steps: []scriptedmodel.Step{
		step("read_file", map[string]string{"path": "calc.py"}),
		finish("Looked at it."),
	}}
	p := newRotatingProvider(t, script, oldKey)
	logs := &embeddedtest.Logs{}
	cfg := embeddedtest.Config(t, logs)
	cfg.ScriptedModel = ""
	cfg.Model = e2eModel
	cfg.ModelAPIURL = p.srv.URL + "/v1/chat/completions"
	cfg.ModelAPIKeyFile = keyFile
	cfg.SandboxBin = realEntry(t)
	m := embeddedtest.Start(t, cfg)
	c := clientOf(t, m)
	ctx := context.Background()
	req := calcRequest(t)
	req.Checks = [][]string{{"git", "diff", "--check"}}

	runOnce := func(what string) (belay.RunStatus, string) {
		t.Helper()
		created, err := c.CreateRun(ctx, req, "")
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		follow(t, c, created.RunID)
		run, err := c.GetRun(ctx, created.RunID)
		if err != nil {
			t.Fatal(err)
		}
		return run.Status, run.Reason
	}

	if st, reason := runOnce("first run"); st != belay.StatusCompleted {
		t.Fatalf("first run ended %s (%q)", st, reason)
	}
	if p.refused.Load() != 0 {
		t.Fatalf("the provider refused the first run's key %d times", p.refused.Load())
	}

	// The operator rotates the key; from now on the provider takes only
	// the new one.
	if err := os.WriteFile(keyFile, []byte(newKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rotated := newKey
	p.current.Store(&rotated)

	// The next call still carries the cached old key and is refused; the
	// run it belongs to fails on it.
	runOnce("run during the rotation")
	if n := p.refused.Load(); n != 1 {
		t.Fatalf("the provider refused %d calls after the rotation, want exactly 1 (the cached key, once)", n)
	}
	// The refusal made the control plane read the key file again: the next
	// run gets through with the new key.
	before := len(p.keysSeen())
	if st, reason := runOnce("run after the rotation"); st != belay.StatusCompleted {
		t.Fatalf("the run after the rotation ended %s (%q): the old key is still in use", st, reason)
	}
	after := p.keysSeen()[before:]
	if len(after) != len(script.Steps) {
		t.Fatalf("the run after the rotation made %d calls, want %d", len(after), len(script.Steps))
	}
	for _, k := range after {
		if k != newKey {
			t.Fatal("a call after the rotation carried the old key")
		}
	}
	if p.refused.Load() != 1 {
		t.Errorf("the provider refused %d calls in all, want 1", p.refused.Load())
	}
	for _, k := range []string{oldKey, newKey} {
		if strings.Contains(logs.String(), k) {
			t.Error("a provider key appears in the control plane's log")
		}
	}
}
