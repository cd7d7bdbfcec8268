package embedded_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/upstream"
)

// The AWS credentials the Bedrock end-to-end control plane signs with; the
// secret is a canary that must appear nowhere but in the signature's math.
const (
	e2eRegion      = "eu-west-3"
	e2eAccessKeyID = "AKIDE2EBEDROCK000001"
	e2eSecretKey   = "e2e-secret-access-key-canary-5f4e3d2c1b0a"
)

// TestEndToEndThroughEachProvider runs the demo's scripted session
// (examples/sessions/fix-calc.json) through the real agent loop, sandbox
// and proxy, with the proxy speaking Anthropic's Messages API and then
// Bedrock's Converse API upstream (TestEndToEndFixesTheExample covers the
// OpenAI-compatible path). Neither provider can run here: the upstream is
// the scripted model on a loopback server speaking that provider's wire
// format, checking each request as the provider would (turn order, every
// tool_use answered by its tool_result, and for Bedrock a SigV4 signature
// it recomputes with the same credentials through aws-sdk-go-v2's signer).
func TestEndToEndThroughEachProvider(t *testing.T) {
	t.Parallel()
	script, err := scriptedmodel.LoadScript(filepath.Join(embeddedtest.ModuleRoot(t), "examples", "sessions", "fix-calc.json"))
	if err != nil {
		t.Fatal(err)
	}
	creds := aws.Credentials{AccessKeyID: e2eAccessKeyID, SecretAccessKey: e2eSecretKey}
	for _, kind := range []string{upstream.KindAnthropic, upstream.KindBedrock} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var opts []scriptedmodel.Option
			if kind == upstream.KindBedrock {
				opts = append(opts, scriptedmodel.WithSigV4(creds, e2eRegion))
			}
			p := &provider{model: scriptedmodel.New(script, opts...), arrived: make(chan struct{}), release: make(chan struct{})}
			p.srv = httptest.NewServer(p)
			t.Cleanup(p.srv.Close)

			logs := &embeddedtest.Logs{}
			cfg := embeddedtest.Config(t, logs)
			cfg.ScriptedModel = ""
			cfg.Model = e2eModel
			cfg.ModelAPIURL = p.srv.URL
			cfg.Provider.Kind = kind
			secret := providerKey
			if kind == upstream.KindBedrock {
				cfg.Provider.BedrockRegion = e2eRegion
				cfg.Provider.AWSCredentials = credentials.StaticCredentialsProvider{Value: creds}
				secret = e2eSecretKey
			} else {
				cfg.ModelAPIKey = providerKey
			}
			cfg.SandboxBin = realEntry(t)
			m := embeddedtest.Start(t, cfg)
			t.Cleanup(p.srv.CloseClientConnections)
			pl := plane{m: m, c: clientOf(t, m), cfg: cfg}
			ctx := context.Background()

			created, err := pl.c.CreateRun(ctx, calcRequest(t), "")
			if err != nil {
				t.Fatal(err)
			}
			events, run := pl.finished(t, created.RunID)
			if run.Status != belay.StatusCompleted || run.ExitCode == nil || *run.ExitCode != 0 {
				t.Fatalf("run ended %s (reason %q, exit code %v); want completed with exit code 0; events: %s",
					run.Status, run.Reason, run.ExitCode, eventTypes(events))
			}
			if !slices.Equal(run.ChangedFiles, []string{"calc.py"}) || len(run.Checks) != 1 || run.Checks[0].ExitCode != 0 {
				t.Errorf("changed %q, checks %+v; want calc.py fixed and pytest passing", run.ChangedFiles, run.Checks)
			}
			checkCausalOrder(t, events)
			patch, err := pl.c.GetArtifact(ctx, created.RunID, "patch.diff")
			if err != nil {
				t.Fatal(err)
			}
			applyAndTest(t, calcRequest(t).Files, patch)

			reqs := p.model.Requests()
			if len(reqs) != len(script.Steps) || run.Usage.ModelRequests != len(reqs) {
				t.Fatalf("the provider got %d requests, usage counts %d; want one per scripted step (%d)",
					len(reqs), run.Usage.ModelRequests, len(script.Steps))
			}
			var prompt, completion int64
			for i, r := range reqs {
				prompt, completion = prompt+r.PromptTokens, completion+r.CompletionTokens
				if r.Format != kind || r.Status != 200 || r.Step != i || r.Model != e2eModel || r.MaxTokens != 4096 {
					t.Errorf("request %d: %s format, status %d, step %d, model %q, max tokens %d; want %s, 200, step %d, %q, 4096",
						i, r.Format, r.Status, r.Step, r.Model, r.MaxTokens, kind, i, e2eModel)
				}
				switch kind {
				case upstream.KindBedrock:
					if !r.Signed || r.APIKey != "" || !strings.HasPrefix(r.Authorization, "AWS4-HMAC-SHA256 Credential="+e2eAccessKeyID+"/") {
						t.Errorf("request %d: signed %v (%s), X-Api-Key %q; want SigV4 by the configured credentials and no key", i, r.Signed, r.SignatureError, r.APIKey)
					}
				default:
					if r.Authorization != "Bearer "+providerKey && r.APIKey != providerKey {
						t.Errorf("request %d did not carry the provider key", i)
					}
				}
			}
			if run.Usage.PromptTokens != prompt || run.Usage.CompletionTokens != completion {
				t.Errorf("usage %d+%d tokens, the provider reported %d+%d", run.Usage.PromptTokens, run.Usage.CompletionTokens, prompt, completion)
			}
			// Step 1 of the script asks for two reads at once: its answers
			// come back in one turn, under the provider's own tool-use ids,
			// which went through the sandbox unchanged.
			prefix := map[string]string{upstream.KindAnthropic: "toolu_scripted_", upstream.KindBedrock: "tooluse_scripted_"}[kind]
			var results []string
			for _, msg := range reqs[2].Messages {
				if msg.Role == "tool" {
					results = append(results, msg.ToolCallID)
				}
			}
			want := []string{prefix + "0_0", prefix + "1_0", prefix + "1_1"}
			if !slices.Equal(results, want) {
				t.Errorf("tool results of request 3 answer %q; want %q", results, want)
			}

			var seen strings.Builder
			seen.WriteString(logs.String())
			seen.Write(patch)
			for _, name := range []string{"result.json", "transcript.jsonl"} {
				b, err := pl.c.GetArtifact(ctx, created.RunID, name)
				if err != nil {
					t.Fatal(err)
				}
				seen.Write(b)
			}
			for _, e := range events {
				seen.Write(e.Data)
			}
			if strings.Contains(seen.String(), secret) {
				t.Errorf("the %s credential shows up in the logs, an artifact or an event", kind)
			}
			if !strings.Contains(pl.m.Upstream(), kind) {
				t.Errorf("Upstream() = %q; want it to name %s", pl.m.Upstream(), kind)
			}
		})
	}
}

// TestScriptedBedrockSession runs the demo's scripted session as
// `belay serve --scripted-model examples/sessions/fix-calc.json
// --model-provider bedrock` does: the scripted model speaks Converse on
// loopback and checks every signature against the fixed loopback-only
// credentials the control plane signs with, so the offline demo can show
// the Bedrock path without an AWS account. The run completing is the proof:
// the Bedrock provider speaks nothing but signed Converse.
func TestScriptedBedrockSession(t *testing.T) {
	t.Parallel()
	cfg := embeddedtest.Config(t, nil)
	cfg.Provider.Kind = upstream.KindBedrock
	cfg.SandboxBin = realEntry(t)
	m := embeddedtest.Start(t, cfg)
	if got := m.Upstream(); !strings.Contains(got, "scripted session") || !strings.Contains(got, "bedrock") {
		t.Errorf("Upstream() = %q; want the scripted session in bedrock's wire format", got)
	}
	pl := plane{m: m, c: clientOf(t, m), cfg: cfg}
	created, err := pl.c.CreateRun(context.Background(), calcRequest(t), "")
	if err != nil {
		t.Fatal(err)
	}
	events, run := pl.finished(t, created.RunID)
	if run.Status != belay.StatusCompleted || run.Usage.ModelRequests != 6 {
		t.Fatalf("run ended %s (reason %q) after %d model requests; want completed after 6; events: %s",
			run.Status, run.Reason, run.Usage.ModelRequests, eventTypes(events))
	}
}
