package functions_test

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/awstest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/token"
)

// upstream is an OpenAI-compatible provider on HTTPS loopback whose
// certificate the function trusts (SSL_CERT_FILE names it), never a
// relaxed TLS check. It accepts only the key it is told is current.
type upstream struct {
	srv      *httptest.Server
	certFile string

	mu    sync.Mutex
	key   string
	calls int
	auths []string
}

func startUpstream(tb testing.TB, key string) *upstream {
	tb.Helper()
	u := &upstream{key: key}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.calls++
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		ok := r.Header.Get("Authorization") == "Bearer "+u.key
		u.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
			return
		}
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1796130400,"model":"` + testModel +
			`","choices":[{"index":0,"message":{"role":"assistant","content":"Done."},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`))
	}))
	tb.Cleanup(u.srv.Close)
	u.certFile = filepath.Join(tb.TempDir(), "upstream-ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(u.certFile, pemBytes, 0o600); err != nil {
		tb.Fatal(err)
	}
	return u
}

func (u *upstream) setKey(k string) {
	u.mu.Lock()
	u.key = k
	u.mu.Unlock()
}

func TestModelProxy(t *testing.T) {
	p := startPeers(t)
	// Two canary keys: the secret is rotated between them.
	oldKey, newKey := "sk-canary-old-"+randomHex(12), "sk-canary-new-"+randomHex(12)
	up := startUpstream(t, newKey)
	// Secrets Manager has no peer here: awstest checks each request the
	// function sends and answers the secret's current value.
	const secretARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:belay/model-key-AbCdEf"
	secrets := awstest.New(t, awstest.SecretsManager)
	var secretMu sync.Mutex
	current := oldKey
	secrets.Handle("GetSecretValue", func(body map[string]any) (int, any) {
		if body["SecretId"] != secretARN {
			return http.StatusBadRequest, awstest.Error("ResourceNotFoundException", "no such secret")
		}
		secretMu.Lock()
		defer secretMu.Unlock()
		return http.StatusOK, map[string]any{"ARN": secretARN, "Name": "belay/model-key", "SecretString": current,
			"VersionId": randomHex(8), "VersionStages": []string{"AWSCURRENT"}, "CreatedDate": 1796130000.0}
	})
	env := func(extra map[string]string) map[string]string {
		e := map[string]string{
			"BELAY_SIGNING_KEY":              signingKey,
			"BELAY_MODEL_API_URL":            up.srv.URL + "/v1/chat/completions",
			"BELAY_MODEL_API_KEY_SECRET_ARN": secretARN,
			"BELAY_SECRETSMANAGER_ENDPOINT":  secrets.URL,
			"SSL_CERT_FILE":                  up.certFile,
		}
		for k, v := range extra {
			e[k] = v
		}
		return p.env(e)
	}
	fn := rie.Start(t, "modelproxy", env(nil))

	run := newRunID()
	seedRun(t, p.store, run)
	startRun(t, p.store, run)
	call := func(fn *rie.Function, runID string) rie.StreamedResponse {
		return streamed(t, fn, apiEvent(t, "modelproxy", "chat-completions.json",
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceModel, runID))))
	}
	var bodies [][]byte

	t.Run("a rotated key is fetched again after a 401", func(t *testing.T) {
		// The cached key is the old one; the provider refuses it. That call
		// spent budget and fails; the next fetches the new key.
		secretMu.Lock()
		current = newKey
		secretMu.Unlock()
		first := call(fn, run)
		bodies = append(bodies, first.Body)
		if first.StatusCode != http.StatusOK {
			t.Fatalf("first call: %d %s, want 200 with the secret's current key", first.StatusCode, first.Body)
		}
		// Rotate again: the provider now wants the old key back, the
		// function still holds the new one in its cache.
		up.setKey(oldKey)
		secretMu.Lock()
		current = oldKey
		secretMu.Unlock()
		refused := call(fn, run)
		bodies = append(bodies, refused.Body)
		if refused.StatusCode != http.StatusBadGateway || errorCode(t, string(refused.Body)) != belay.CodeUpstream {
			t.Fatalf("call with a rotated-away key: %d %s, want 502 upstream_error", refused.StatusCode, refused.Body)
		}
		again := call(fn, run)
		bodies = append(bodies, again.Body)
		if again.StatusCode != http.StatusOK || !bytes.Contains(again.Body, []byte("chatcmpl-1")) {
			t.Fatalf("call after the 401: %d %s, want 200 with the provider's answer", again.StatusCode, again.Body)
		}
		if n := len(secrets.Calls("GetSecretValue")); n != 2 {
			t.Fatalf("%d GetSecretValue calls, want 2 (one at first use, one after the 401)", n)
		}
		if want := []string{"Bearer " + newKey, "Bearer " + newKey, "Bearer " + oldKey}; strings.Join(up.auths, ",") != strings.Join(want, ",") {
			t.Fatal("the provider did not get the keys in the order the secret held them")
		}
	})
	recordInit(t, fn)

	t.Run("budget", func(t *testing.T) {
		small := newRunID()
		seedRun(t, p.store, small)
		startRun(t, p.store, small)
		var last rie.StreamedResponse
		for range 8 { // the capability allows 7
			last = call(fn, small)
			bodies = append(bodies, last.Body)
		}
		if last.StatusCode != http.StatusTooManyRequests || errorCode(t, string(last.Body)) != belay.CodeBudgetExhausted {
			t.Fatalf("8th call: %d %s, want 429 %s", last.StatusCode, last.Body, belay.CodeBudgetExhausted)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// 3 + 7 calls spent budget; one was refused.
		waitMetrics(t, fn, map[string]float64{"ModelCalls": 10, "BudgetRefusals": 1})
	})

	t.Run("a slow upstream ends with a clear error", func(t *testing.T) {
		slow := rie.Start(t, "modelproxy", env(map[string]string{
			"BELAY_MODEL_API_URL":         up.srv.URL + "/slow/chat/completions",
			"BELAY_MODEL_TIMEOUT_SECONDS": "1",
		}))
		resp := call(slow, run)
		bodies = append(bodies, resp.Body)
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, string(resp.Body)) != belay.CodeUpstream {
			t.Fatalf("slow upstream: %d %s, want 502 upstream_error", resp.StatusCode, resp.Body)
		}
	})

	t.Run("the provider key reaches only the provider", func(t *testing.T) {
		stored, err := json.Marshal(runEvents(t, p.store, run))
		if err != nil {
			t.Fatal(err)
		}
		record, _ := p.store.GetRun(t.Context(), run)
		recordJSON, _ := json.Marshal(record)
		for _, key := range []string{oldKey, newKey} {
			for what, b := range map[string][]byte{
				"answers": bytes.Join(bodies, nil), "log": []byte(fn.Logs()),
				"events": stored, "run record": recordJSON,
			} {
				if bytes.Contains(b, []byte(key)) {
					t.Errorf("a provider key is in the %s", what)
				}
			}
		}
		// Only the modelproxy bootstrap can read the key's variables at
		// all: the others do not contain their names.
		for _, name := range []string{"api", "stream", "sandboxapi", "steps", "cleanup"} {
			bin, err := os.ReadFile(rie.Bootstrap(t, name))
			if err != nil {
				t.Fatal(err)
			}
			// BELAY_MODEL_API_KEY is also the prefix of ..._SECRET_ARN.
			if bytes.Contains(bin, []byte("BELAY_MODEL_API_KEY")) {
				t.Errorf("the %s bootstrap names BELAY_MODEL_API_KEY(_SECRET_ARN): it could read the provider key", name)
			}
		}
	})
}
