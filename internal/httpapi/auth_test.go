package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

// A Config.PublicAuth replaces the control-plane token on the public
// routes, and only there: its coded refusals reach the caller as they
// are, any other error is a plain 401, and the control token no longer
// opens anything.
func TestPublicAuthHook(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var calls atomic.Int64
	auth := func(r *http.Request) error {
		calls.Add(1)
		switch r.Header.Get("X-Test-Identity") {
		case "alice":
			return nil
		case "mallory":
			return belay.Errorf(belay.CodeForbidden, "mallory may not")
		}
		return errors.New("no identity (a detail the caller must not see)")
	}
	cfg := httpapi.Config{
		Store: h.store, Artifacts: h.artifacts, Orchestrator: h.orch, Signer: h.signer,
		Limits: belay.DefaultLimits(testModel), PublicAuth: auth,
		Upstream: httpapi.Upstream{URL: "https://api.example/v1/chat/completions",
			Key: func(context.Context) (string, error) { return "k", nil }},
	}
	api, err := httpapi.New(cfg)
	if err != nil {
		t.Fatalf("New with PublicAuth: %v", err)
	}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)

	get := func(path string, header ...string) (int, wire.ErrorDetail) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body wire.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Error
	}

	if status, _ := get("/v1/runs", "X-Test-Identity", "alice"); status != http.StatusOK {
		t.Fatalf("accepted identity: %d, want 200", status)
	}
	status, e := get("/v1/runs")
	if status != http.StatusUnauthorized || e.Code != belay.CodeUnauthorized || strings.Contains(e.Message, "detail") {
		t.Fatalf("no identity: %d %+v, want 401 unauthorized without the authenticator's own words", status, e)
	}
	if status, e := get("/v1/runs", "X-Test-Identity", "mallory"); status != http.StatusForbidden || e.Code != belay.CodeForbidden {
		t.Fatalf("coded refusal: %d %+v, want 403 forbidden as the authenticator said", status, e)
	}
	if status, _ := get("/v1/config", "Authorization", "Bearer "+h.controlToken); status != http.StatusUnauthorized {
		t.Fatalf("a control token under PublicAuth: %d, want 401", status)
	}
	before := calls.Load()
	if status, _ := get("/internal/v1/runs/run_x/approvals/appr_1"); status != http.StatusUnauthorized {
		t.Fatalf("internal route without a run token: %d, want its own 401", status)
	}
	if calls.Load() != before {
		t.Fatal("the public authenticator ran for an internal route")
	}

	cfg.ControlTokens = []string{h.controlToken}
	if _, err := httpapi.New(cfg); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("New with ControlTokens and PublicAuth = %v, want a refusal", err)
	}
}

// ControlTokenAuth is today's check as a value: a listed token passes, a
// missing, malformed or other one gets the one refusal, and short tokens
// are refused up front.
func TestControlTokenAuth(t *testing.T) {
	const tok = "a-control-token-of-enough-length"
	auth, err := httpapi.ControlTokenAuth([]string{tok, tok + "-next"})
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]belay.Code{
		"Bearer " + tok:           "",
		"bearer " + tok + "-next": "",
		"Bearer " + tok + "x":     belay.CodeUnauthorized,
		"Basic " + tok:            belay.CodeUnauthorized,
		"Bearer ":                 belay.CodeUnauthorized,
		"":                        belay.CodeUnauthorized,
	} {
		r := httptest.NewRequest("GET", "/v1/runs", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		err := auth(r)
		if got := belay.ErrorCode(err); got != want {
			t.Errorf("Authorization %q: %v, want code %q", header, err, want)
		}
		if err != nil && strings.Contains(err.Error(), tok) {
			t.Errorf("the refusal quotes the token: %v", err)
		}
	}
	if _, err := httpapi.ControlTokenAuth(nil); err == nil {
		t.Error("ControlTokenAuth(nil) succeeded")
	}
	if _, err := httpapi.ControlTokenAuth([]string{"short"}); err == nil {
		t.Error("ControlTokenAuth with a short token succeeded")
	}
}
