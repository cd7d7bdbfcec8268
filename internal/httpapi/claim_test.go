package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/belay-dev/belay/internal/belay"
	belays3 "github.com/belay-dev/belay/internal/s3"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

const taskARN = "arn:aws:ecs:eu-west-1:123456789012:task/belay/0123456789abcdef0123456789abcdef"

// issueClaim stores a claim for the run's attempt, as the orchestrator's
// activation does, and returns its code.
func (h *harness) issueClaim(tb testing.TB, runID string, attempt int) string {
	tb.Helper()
	code, c, err := belay.NewClaim(runID, attempt, h.clock.Now(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.store.CreateClaim(context.Background(), c); err != nil {
		tb.Fatalf("CreateClaim: %v", err)
	}
	return code.Reveal()
}

// claim posts a claim request, without a bearer, as the entry does.
func (h *harness) claim(tb testing.TB, body wire.ClaimRequest) answer {
	tb.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	return h.do(tb, "POST", "/internal/v1/claim", "", b, nil)
}

// refusedClaimReasons lists the reasons of the "claim refused" log lines.
func (h *harness) refusedClaimReasons(tb testing.TB) []string {
	tb.Helper()
	var reasons []string
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		var l struct {
			Msg    string `json:"msg"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "claim refused" {
			reasons = append(reasons, l.Reason)
		}
	}
	return reasons
}

func TestClaimExchangeWorksOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, _ := h.startRun(t, "", 5)
	code := h.issueClaim(t, id, 1)

	a := h.claim(t, wire.ClaimRequest{Claim: code, TaskArn: taskARN})
	if a.status != http.StatusOK {
		t.Fatalf("claim: %d %s", a.status, a.body)
	}
	var got wire.ClaimResponse
	a.decode(t, &got)
	run, err := h.store.GetRun(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	want := belay.SpecForRun(run)
	if got.Spec.RunID != id || got.Spec.Attempt != 1 || got.Spec.Instruction != want.Instruction ||
		len(got.Spec.Files) != len(want.Files) || got.Spec.APIBaseURL != "" || got.Spec.MaxSteps != want.MaxSteps {
		t.Errorf("spec = %+v, want the run's at attempt 1 without an API URL", got.Spec)
	}
	// Three fresh tokens, one per audience, living as long as the
	// capability (an hour from the harness's activation).
	for aud, tok := range map[token.Audience]string{token.AudienceModel: got.Tokens.Model,
		token.AudienceEvents: got.Tokens.Events, token.AudienceApprovals: got.Tokens.Approvals} {
		c, err := h.signer.Verify(tok, token.Expect{Audience: aud, RunID: id, Model: testModel})
		if err != nil {
			t.Fatalf("%s token: %v", aud, err)
		}
		if want := h.clock.Now().Add(time.Hour); !c.ExpiresAt.Equal(want) {
			t.Errorf("%s token expires %v, want with the capability at %v", aud, c.ExpiresAt, want)
		}
	}
	if len(got.Outputs) != len(belay.ArtifactNames) {
		t.Fatalf("outputs = %v, want one per artifact", got.Outputs)
	}
	for _, name := range belay.ArtifactNames {
		u := got.Outputs[name]
		if u.URL != "internal/v1/runs/"+id+"/outputs/"+name || u.Method != http.MethodPut || u.Header["Authorization"] != "Bearer "+got.Tokens.Events {
			t.Errorf("output %s: %s %s, want PUT to the outputs route with the events token", name, u.Method, u.URL)
		}
	}
	if run.SandboxRef != taskARN {
		t.Errorf("run's sandboxRef = %q, want the claiming task %q", run.SandboxRef, taskARN)
	}

	// The upload target works, and what it takes stays out of sight until
	// the control plane has validated it.
	up := got.Outputs["result.json"]
	put := h.do(t, up.Method, "/"+up.URL, strings.TrimPrefix(up.Header["Authorization"], "Bearer "), []byte(`{"version":1}`), nil)
	if put.status != http.StatusNoContent {
		t.Fatalf("upload: %d %s", put.status, put.body)
	}
	staged, err := h.artifacts.GetArtifact(t.Context(), id, belay.StagedOutputName(1, "result.json"))
	if err != nil || string(staged) != `{"version":1}` {
		t.Fatalf("staged result.json = %q, %v", staged, err)
	}
	var list wire.ArtifactList
	h.public(t, "GET", "/v1/runs/"+id+"/artifacts", "").decode(t, &list)
	if len(list.Artifacts) != 0 {
		t.Errorf("public artifact list = %v, want no staged output in it", list.Artifacts)
	}
	if a := h.public(t, "GET", "/v1/runs/"+id+"/artifacts/"+belay.StagedOutputName(1, "result.json"), ""); a.status != http.StatusNotFound {
		t.Errorf("GET of a staged output: %d, want 404", a.status)
	}

	// The code is spent.
	again := h.claim(t, wire.ClaimRequest{Claim: code})
	if again.status != http.StatusUnauthorized || again.errorCode(t) != belay.CodeUnauthorized {
		t.Fatalf("second claim: %d %s, want 401 unauthorized", again.status, again.body)
	}
	if r := h.refusedClaimReasons(t); len(r) != 1 || r[0] != string(belay.ClaimUsed) {
		t.Errorf("refusal reasons logged = %v, want [used]", r)
	}
	for _, where := range []string{h.logs.String(), string(again.body)} {
		if strings.Contains(where, code) {
			t.Error("the claim code appears in the log or an answer")
		}
	}
	if strings.Contains(h.logs.String(), "bt1.") {
		t.Error("a token appears in the log")
	}
}

// TestClaimRefusals presents each kind of bad code: every refusal is the
// same 401 to the caller, carries no token, and the log says why.
func TestClaimRefusals(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	runA, _ := h.startRun(t, "", 5)
	runB, _ := h.startRun(t, "", 5)
	ended, _ := h.startRun(t, "", 5)
	revoked, _ := h.startRun(t, "", 5)

	otherRunCode := h.issueClaim(t, runA, 1)
	wrongAttemptCode := h.issueClaim(t, runA, 2)
	endedCode := h.issueClaim(t, ended, 1)
	h.finishRun(t, ended)
	revokedCode := h.issueClaim(t, revoked, 1)
	if err := h.store.RevokeCapability(t.Context(), revoked); err != nil {
		t.Fatal(err)
	}
	expiringCode := h.issueClaim(t, runB, 1)
	unknown, _, _ := belay.NewClaim(runB, 1, h.clock.Now(), rand.Reader)

	tests := []struct {
		name   string
		body   wire.ClaimRequest
		before func()
		reason belay.ClaimRefusal
	}{
		{"malformed", wire.ClaimRequest{Claim: "not-a-claim-code"}, nil, belay.ClaimMalformed},
		{"unknown", wire.ClaimRequest{Claim: unknown.Reveal()}, nil, belay.ClaimUnknown},
		{"another_run", wire.ClaimRequest{Claim: otherRunCode, RunID: runB}, nil, belay.ClaimWrongRun},
		{"wrong_attempt", wire.ClaimRequest{Claim: wrongAttemptCode}, nil, belay.ClaimWrongAttempt},
		{"run_ended", wire.ClaimRequest{Claim: endedCode}, nil, belay.ClaimRunNotRunning},
		{"capability_revoked", wire.ClaimRequest{Claim: revokedCode}, nil, belay.ClaimCapabilityInactive},
		{"expired", wire.ClaimRequest{Claim: expiringCode}, func() { h.clock.Advance(belay.ClaimTTL) }, belay.ClaimExpired},
	}
	var message string
	for i, tt := range tests {
		if tt.before != nil {
			tt.before()
		}
		a := h.claim(t, tt.body)
		if a.status != http.StatusUnauthorized || a.errorCode(t) != belay.CodeUnauthorized {
			t.Fatalf("%s: %d %s, want 401 unauthorized", tt.name, a.status, a.body)
		}
		var e wire.ErrorBody
		a.decode(t, &e)
		if message == "" {
			message = e.Error.Message
		} else if e.Error.Message != message {
			t.Errorf("%s: message %q differs from %q: a refusal must not say why", tt.name, e.Error.Message, message)
		}
		if bytes.Contains(a.body, []byte("bt1.")) || bytes.Contains(a.body, []byte(`"tokens"`)) {
			t.Errorf("%s: the refusal carries a token: %s", tt.name, a.body)
		}
		if r := h.refusedClaimReasons(t); len(r) != i+1 || r[i] != string(tt.reason) {
			t.Fatalf("%s: reasons logged %v, want %s last", tt.name, r, tt.reason)
		}
	}
	// A code presented for another run is not spent: its own run still
	// gets it (the clock moved past its expiry above, so move back).
	h.clock.Advance(-belay.ClaimTTL)
	if a := h.claim(t, wire.ClaimRequest{Claim: otherRunCode, RunID: runA}); a.status != http.StatusOK {
		t.Errorf("claim for its own run after a refusal: %d %s", a.status, a.body)
	}
	for _, code := range []string{otherRunCode, wrongAttemptCode, endedCode, revokedCode, expiringCode, unknown.Reveal()} {
		if strings.Contains(h.logs.String(), code) {
			t.Fatal("a claim code appears in the log")
		}
	}
	if strings.Contains(h.logs.String(), "bt1.") {
		t.Error("a token appears in the log")
	}
	for _, bad := range []string{`{"claim":"x","taskArn":"has space"}`, `{"claim":"x","extra":1}`, `{"claim":"x","runId":"../x"}`} {
		if a := h.do(t, "POST", "/internal/v1/claim", "", []byte(bad), nil); a.status != http.StatusBadRequest {
			t.Errorf("claim body %s: %d, want 400", bad, a.status)
		}
	}
}

func TestOutputsRoute(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id, set := h.startRun(t, "", 5)
	path := "/internal/v1/runs/" + id + "/outputs/"
	tests := []struct {
		name   string
		bearer string
		file   string
		body   []byte
		status int
	}{
		{"model_token", set.Model, "result.json", []byte("{}"), http.StatusUnauthorized},
		{"no_token", "", "result.json", []byte("{}"), http.StatusUnauthorized},
		{"unknown_name", set.Events, "notes.txt", []byte("x"), http.StatusNotFound},
		{"staged_name", set.Events, belay.StagedOutputName(1, "result.json"), []byte("x"), http.StatusNotFound},
		{"too_large", set.Events, "transcript.jsonl", bytes.Repeat([]byte("x"), belay.MaxArtifactBytes+1), http.StatusRequestEntityTooLarge},
		{"ok", set.Events, "patch.diff", []byte("diff\n"), http.StatusNoContent},
		{"empty_ok", set.Events, "transcript.jsonl", []byte{}, http.StatusNoContent},
	}
	for _, tt := range tests {
		a := h.do(t, "PUT", path+tt.file, tt.bearer, tt.body, nil)
		if a.status != tt.status {
			t.Errorf("%s: %d %s, want %d", tt.name, a.status, a.body, tt.status)
		}
	}
	if b, err := h.artifacts.GetArtifact(t.Context(), id, belay.StagedOutputName(1, "patch.diff")); err != nil || string(b) != "diff\n" {
		t.Errorf("staged patch.diff = %q, %v", b, err)
	}
	// Once the sandbox is gone (capability revoked), or the run is over,
	// nothing more is taken.
	if err := h.store.RevokeCapability(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if a := h.do(t, "PUT", path+"result.json", set.Events, []byte("{}"), nil); a.status != http.StatusConflict {
		t.Errorf("upload after revocation: %d %s, want 409", a.status, a.body)
	}
	h.finishRun(t, id)
	if a := h.do(t, "PUT", path+"result.json", set.Events, []byte("{}"), nil); a.status != http.StatusConflict {
		t.Errorf("upload to an ended run: %d %s, want 409", a.status, a.body)
	}
	if _, err := h.artifacts.GetArtifact(t.Context(), id, belay.StagedOutputName(1, "result.json")); !belay.IsCode(err, belay.CodeNotFound) {
		t.Errorf("a refused upload was stored (%v)", err)
	}
}

// TestClaimAnswersPresignedUploads: with artifacts on S3 (gofakes3 over
// HTTP, the S3 peer), the claim answer's outputs are presigned PUTs of the
// staged names that a plain HTTP client, without any credential, can use.
func TestClaimAnswersPresignedUploads(t *testing.T) {
	faker := gofakes3.New(s3mem.New())
	srv := httptest.NewServer(faker.Server())
	t.Cleanup(srv.Close)
	client := belays3.NewLocalClient(srv.URL)
	if _, err := client.CreateBucket(t.Context(), &awss3.CreateBucketInput{Bucket: aws.String("belay-artifacts")}); err != nil {
		t.Fatal(err)
	}
	s3store := belays3.New(client, "belay-artifacts", "belay/")
	h := newHarness(t, harnessOptions{presigner: s3store})
	id, _ := h.startRun(t, "", 5)
	a := h.claim(t, wire.ClaimRequest{Claim: h.issueClaim(t, id, 1)})
	if a.status != http.StatusOK {
		t.Fatalf("claim: %d %s", a.status, a.body)
	}
	var got wire.ClaimResponse
	a.decode(t, &got)
	for _, name := range belay.ArtifactNames {
		u := got.Outputs[name]
		if !strings.HasPrefix(u.URL, srv.URL+"/belay-artifacts/belay/runs/"+id+"/"+belay.StagedOutputName(1, name)+"?") || u.Method != http.MethodPut {
			t.Fatalf("output %s: %s, want a presigned PUT of its staged name", name, u)
		}
		if _, ok := u.Header["Authorization"]; ok {
			t.Errorf("output %s: a presigned upload carries an Authorization header", name)
		}
		req, err := http.NewRequest(u.Method, u.URL, strings.NewReader(name+" content"))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range u.Header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("presigned PUT of %s: %d", name, resp.StatusCode)
		}
		b, err := s3store.GetArtifact(t.Context(), id, belay.StagedOutputName(1, name))
		if err != nil || string(b) != name+" content" {
			t.Errorf("staged %s on S3 = %q, %v", name, b, err)
		}
	}
}
