package belay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// TestSandboxTokensPrintRedacted checks that a spec or its tokens printed or
// logged by mistake, under any fmt verb and both slog handlers, shows no
// token.
func TestSandboxTokensPrintRedacted(t *testing.T) {
	tokens := belay.SandboxTokens{Model: "bt1.CANARY-model-4c1e", Events: "bt1.CANARY-events-9a7d", Approvals: "bt1.CANARY-approvals-2f0b"}
	spec := belay.SpecFor("run_1", belay.RunRequest{Instruction: "fix it", Model: "m"})
	spec.Tokens = tokens

	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("launch", "tokens", tokens, "spec", spec, "ptr", &spec)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("launch", "tokens", tokens, "spec", spec, "ptr", &spec)
	specJSON, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	outputs := []string{text.String(), js.String(), string(specJSON), tokens.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outputs = append(outputs, fmt.Sprintf(verb, tokens), fmt.Sprintf(verb, &tokens), fmt.Sprintf(verb, spec), fmt.Sprintf(verb, &spec))
	}
	for _, out := range outputs {
		if strings.Contains(out, "CANARY") {
			t.Errorf("output shows a token: %s", out)
		}
	}
	for _, out := range []string{text.String(), js.String(), fmt.Sprintf("%+v", spec), fmt.Sprintf("%#v", tokens)} {
		if !strings.Contains(out, "redacted") {
			t.Errorf("output %q does not say the tokens are redacted", out)
		}
	}
}

func TestCheckpointArtifactName(t *testing.T) {
	if got := belay.CheckpointArtifactName(2, 17); got != "checkpoint-2-17.json" {
		t.Fatalf("CheckpointArtifactName(2, 17) = %q", got)
	}
	for name, want := range map[string]bool{
		"checkpoint-2-17.json": true, "checkpoint-1-1.json": true,
		"checkpoint-0-1.json": false, "checkpoint-1-0.json": false, "checkpoint-01-1.json": false,
		"checkpoint-1.json": false, "checkpoint-1-1.jso": false, "checkpoint--1-1.json": false,
		"result.json": false, "sandbox-1-result.json": false,
	} {
		if got := belay.IsCheckpointArtifact(name); got != want {
			t.Errorf("IsCheckpointArtifact(%q) = %v, want %v", name, got, want)
		}
		if belay.IsPublicArtifact(name) && want {
			t.Errorf("checkpoint %q is a public artifact", name)
		}
	}
}
