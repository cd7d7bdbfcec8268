package functions_test

import (
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/rie"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

func TestSandboxAPI(t *testing.T) {
	p := startPeers(t)
	fn := rie.Start(t, "sandboxapi", p.env(map[string]string{"BELAY_SIGNING_KEY": signingKey}))
	run := newRunID()
	seedRun(t, p.store, run)
	startRun(t, p.store, run)

	t.Run("append events", func(t *testing.T) {
		ev := apiEvent(t, "sandboxapi", "append-events.json", forRun(run),
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceEvents, run)))
		resp := buffered(t, fn, ev)
		var got wire.EventBatchResponse
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &got) != nil || len(got.Events) != 1 {
			t.Fatalf("append: %d %s", resp.StatusCode, resp.Body)
		}
		stored := runEvents(t, p.store, run)
		if last := stored[len(stored)-1]; last.Type != belay.EventSandboxReady || last.Seq != got.Events[0].Seq {
			t.Fatalf("last stored event %+v, want the appended sandbox.ready", last)
		}
		// The batch id makes a retry append nothing.
		if again := buffered(t, fn, ev); again.StatusCode != http.StatusOK || len(runEvents(t, p.store, run)) != len(stored) {
			t.Fatalf("retry: %d, %d events (was %d)", again.StatusCode, len(runEvents(t, p.store, run)), len(stored))
		}
	})
	recordInit(t, fn)

	t.Run("a token of another audience", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "sandboxapi", "append-events.json", forRun(run),
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceModel, run))))
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
			t.Fatalf("model token on the events route: %d %s, want 401", resp.StatusCode, resp.Body)
		}
	})

	t.Run("not the model proxy", func(t *testing.T) {
		resp := buffered(t, fn, apiEvent(t, "sandboxapi", "chat-completions.json",
			withHeader("Authorization", "Bearer "+issue(t, token.AudienceModel, run))))
		if resp.StatusCode != http.StatusNotFound || errorCode(t, resp.Body) != belay.CodeNotFound {
			t.Fatalf("chat completions through sandboxapi: %d %s, want 404", resp.StatusCode, resp.Body)
		}
		if c, _ := p.store.GetCapability(t.Context(), run); c.UsedRequests != 0 {
			t.Fatalf("sandboxapi spent %d model requests", c.UsedRequests)
		}
	})
}

// claimEvent is the claim event of the testdata with the given code (and
// expected run, when not empty).
func claimEvent(tb testing.TB, code, runID string) []byte {
	tb.Helper()
	return apiEvent(tb, "sandboxapi", "claim.json", func(ev *events.APIGatewayProxyRequest) {
		var body wire.ClaimRequest
		if err := json.Unmarshal([]byte(ev.Body), &body); err != nil {
			tb.Fatal(err)
		}
		body.Claim, body.RunID = code, runID
		b, _ := json.Marshal(body)
		ev.Body = string(b)
	})
}

// The claim exchange through the sandboxapi bootstrap, on DynamoDB Local
// and gofakes3: a code works once; a second use, an expired code, another
// run's code and a code for another attempt are refused, and no refusal
// carries a token.
func TestClaimExchange(t *testing.T) {
	p := startPeers(t)
	fn := rie.Start(t, "sandboxapi", p.env(map[string]string{"BELAY_SIGNING_KEY": signingKey}))
	newCode := func(runID string, attempt int, at time.Time) string {
		code, claim, err := belay.NewClaim(runID, attempt, at, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.store.CreateClaim(t.Context(), claim); err != nil {
			t.Fatal(err)
		}
		return code.Reveal()
	}
	run, other := newRunID(), newRunID()
	for _, id := range []string{run, other} {
		seedRun(t, p.store, id)
		startRun(t, p.store, id)
	}
	code := newCode(run, 1, time.Now())
	var refusals []string

	t.Run("works once", func(t *testing.T) {
		resp := buffered(t, fn, claimEvent(t, code, ""))
		var got wire.ClaimResponse
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &got) != nil {
			t.Fatalf("claim: %d %s", resp.StatusCode, resp.Body)
		}
		if got.Spec.RunID != run || got.Spec.Attempt != 1 || got.Tokens.Model == "" || got.Tokens.Events == "" || got.Tokens.Approvals == "" {
			t.Fatalf("claim answer for %s: spec %s attempt %d, tokens set: %v", run, got.Spec.RunID, got.Spec.Attempt, got.Tokens.Model != "")
		}
		stored, _ := p.store.GetRun(t.Context(), run)
		if stored.SandboxRef != "arn:aws:ecs:eu-west-1:123456789012:task/belay-sandboxes/3f1d5e0b9c8a4e7f8a6b5c4d3e2f1a0b" {
			t.Fatalf("the task ARN was not recorded: %q", stored.SandboxRef)
		}
		// The outputs go straight to S3 (gofakes3 here) by presigned PUT,
		// under the attempt's staged names.
		up, ok := got.Outputs["result.json"]
		if !ok || !strings.HasPrefix(up.URL, p.s3URL) || !strings.Contains(up.URL, "X-Amz-Signature=") {
			t.Fatalf("result.json target %+v, want a presigned S3 URL", up)
		}
		req, _ := http.NewRequestWithContext(t.Context(), up.Method, up.URL, strings.NewReader(`{"version":1}`))
		for k, v := range up.Header {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("presigned PUT: %v %v", res, err)
		}
		res.Body.Close()
		if b, err := p.artifacts.GetArtifact(t.Context(), run, belay.StagedOutputName(1, "result.json")); err != nil || string(b) != `{"version":1}` {
			t.Fatalf("staged output %q, %v", b, err)
		}
	})
	recordInit(t, fn)

	for _, tt := range []struct {
		name  string
		event func() []byte
	}{
		{"second use", func() []byte { return claimEvent(t, code, "") }},
		{"expired", func() []byte { return claimEvent(t, newCode(run, 1, time.Now().Add(-belay.ClaimTTL-time.Second)), "") }},
		{"another run's code", func() []byte { return claimEvent(t, newCode(other, 1, time.Now()), run) }},
		{"wrong attempt", func() []byte { return claimEvent(t, newCode(other, 2, time.Now()), "") }},
		{"not a code", func() []byte { return claimEvent(t, "not-a-claim-code", "") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := buffered(t, fn, tt.event())
			refusals = append(refusals, resp.Body)
			if resp.StatusCode != http.StatusUnauthorized || errorCode(t, resp.Body) != belay.CodeUnauthorized {
				t.Fatalf("%s: %d %s, want 401 unauthorized", tt.name, resp.StatusCode, resp.Body)
			}
			if strings.Contains(resp.Body, "tokens") || strings.Contains(resp.Body, "outputs") {
				t.Fatalf("a refusal carries more than the error: %s", resp.Body)
			}
		})
	}

	t.Run("refusals counted, no code or token in the log", func(t *testing.T) {
		waitMetrics(t, fn, map[string]float64{"ClaimRefusals": 5})
		if strings.Contains(fn.Logs(), code) {
			t.Fatal("the claim code is in the function's log")
		}
		if other, _ := p.store.GetRun(t.Context(), other); other.SandboxRef != "" {
			t.Fatalf("a refused claim recorded a task on the other run: %q", other.SandboxRef)
		}
	})
}
