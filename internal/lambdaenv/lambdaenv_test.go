package lambdaenv_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/lambdaenv"
)

func envOf(vars map[string]string) *lambdaenv.Env {
	return lambdaenv.New("test", func(k string) string { return vars[k] })
}

func TestSecretsDirectOrByARN(t *testing.T) {
	const tok = "a-control-token-of-enough-length"
	tests := []struct {
		name    string
		vars    map[string]string
		want    []string
		wantErr string
	}{
		{"direct", map[string]string{lambdaenv.EnvToken: tok}, []string{tok}, ""},
		{"rotation", map[string]string{lambdaenv.EnvToken: tok + "\n\n" + tok + "-next\n"}, []string{tok, tok + "-next"}, ""},
		{"neither", nil, nil, "neither BELAY_CONTROL_TOKEN_SECRET_ARN nor BELAY_TOKEN is set"},
		{"both", map[string]string{lambdaenv.EnvToken: tok, lambdaenv.EnvControlTokenSecretARN: "arn:aws:secretsmanager:eu-west-1:1:secret:x"}, nil, "both BELAY_TOKEN and BELAY_CONTROL_TOKEN_SECRET_ARN are set"},
		{"short", map[string]string{lambdaenv.EnvToken: "short-token"}, nil, "shorter than 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := envOf(tt.vars).ControlTokens(t.Context())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ControlTokens = %v, want an error containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "short-token") {
					t.Fatal("the error quotes the secret")
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("ControlTokens = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestSigner(t *testing.T) {
	if _, err := envOf(map[string]string{lambdaenv.EnvSigningKey: strings.Repeat("ab", 32)}).Signer(t.Context(), nil); err != nil {
		t.Fatalf("Signer with a 32-byte hex key: %v", err)
	}
	for _, bad := range []string{"not-hex-at-all-not-hex-at-all-not-hex-at-all-not-hex-at-all-xx", strings.Repeat("ab", 8)} {
		_, err := envOf(map[string]string{lambdaenv.EnvSigningKey: bad}).Signer(t.Context(), nil)
		if err == nil || !strings.Contains(err.Error(), "hex-encoded bytes") || strings.Contains(err.Error(), bad) {
			t.Fatalf("Signer(%q) = %v, want a refusal that does not quote the key", bad, err)
		}
	}
}

func TestEndpointsAndRequiredNames(t *testing.T) {
	e := envOf(map[string]string{lambdaenv.EnvAWSEndpoint: "not a url"})
	if _, err := e.DynamoDB(t.Context()); err == nil || !strings.Contains(err.Error(), lambdaenv.EnvAWSEndpoint) {
		t.Fatalf("DynamoDB with a bad endpoint = %v, want an error naming %s", err, lambdaenv.EnvAWSEndpoint)
	}
	e = envOf(map[string]string{lambdaenv.EnvAWSEndpoint: "http://127.0.0.1:1", lambdaenv.EnvS3Endpoint: "ftp://x"})
	if _, err := e.S3(t.Context()); err == nil || !strings.Contains(err.Error(), lambdaenv.EnvS3Endpoint) {
		t.Fatalf("S3 with a bad override = %v, want an error naming %s", err, lambdaenv.EnvS3Endpoint)
	}
	if _, err := e.Store(t.Context(), nil); err == nil || !strings.Contains(err.Error(), lambdaenv.EnvTable) {
		t.Fatalf("Store without a table = %v, want an error naming %s", err, lambdaenv.EnvTable)
	}
	if _, err := e.Orchestrator(t.Context(), nil, nil); err == nil || !strings.Contains(err.Error(), lambdaenv.EnvStateMachineARN) {
		t.Fatalf("Orchestrator without a state machine = %v", err)
	}
}

func TestSeconds(t *testing.T) {
	e := envOf(map[string]string{"A": "30", "B": "0", "C": "1.5"})
	if d, err := e.Seconds("A", time.Minute); err != nil || d != 30*time.Second {
		t.Fatalf("Seconds(A) = %v, %v", d, err)
	}
	if d, err := e.Seconds("unset", time.Minute); err != nil || d != time.Minute {
		t.Fatalf("Seconds(unset) = %v, %v; want the default", d, err)
	}
	for _, name := range []string{"B", "C"} {
		if _, err := e.Seconds(name, time.Minute); err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("Seconds(%s) = %v, want an error naming it", name, err)
		}
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log := envOf(map[string]string{lambdaenv.EnvLogLevel: "loud"}).Logger(&buf)
	log.Info("hello", "run_id", "run_x")
	out := buf.String()
	if !strings.Contains(out, `"function":"test"`) || !strings.Contains(out, `"run_id":"run_x"`) || !strings.Contains(out, lambdaenv.EnvLogLevel) {
		t.Fatalf("log %s: want JSON with the function, run_id, and a warning about the level", out)
	}
	buf.Reset()
	envOf(map[string]string{lambdaenv.EnvLogLevel: "warn"}).Logger(&buf).Info("quiet")
	if buf.Len() != 0 {
		t.Fatalf("an info line at level warn: %s", buf.String())
	}
}

func TestAuth(t *testing.T) {
	for v, want := range map[string]string{"": lambdaenv.AuthToken, "token": lambdaenv.AuthToken, "sigv4": lambdaenv.AuthSigV4, " sigv4 ": lambdaenv.AuthSigV4} {
		if got, err := envOf(map[string]string{lambdaenv.EnvAuth: v}).Auth(); err != nil || got != want {
			t.Errorf("Auth(%q) = %q, %v; want %q", v, got, err, want)
		}
	}
	for _, bad := range []string{"iam", "SIGV4", "none"} {
		_, err := envOf(map[string]string{lambdaenv.EnvAuth: bad}).Auth()
		if err == nil || !strings.Contains(err.Error(), "BELAY_AUTH is \""+bad+"\"") || !strings.Contains(err.Error(), `"token"`) || !strings.Contains(err.Error(), `"sigv4"`) {
			t.Errorf("Auth(%q) = %v, want an error naming the variable, the value and both allowed values", bad, err)
		}
	}
}

// Under sigv4 no control-plane token is read (none need be set); under
// token one is required, as before.
func TestPublicAuthReadsTheTokenOnlyUnderTokenAuth(t *testing.T) {
	var logs bytes.Buffer
	log := envOf(nil).Logger(&logs)
	if _, err := envOf(map[string]string{lambdaenv.EnvAuth: "sigv4"}).PublicAuth(t.Context(), log); err != nil {
		t.Fatalf("sigv4 without a token: %v", err)
	}
	if logs.Len() != 0 {
		t.Fatalf("sigv4 without a token logged %s", logs.String())
	}
	if _, err := envOf(map[string]string{lambdaenv.EnvAuth: "sigv4", lambdaenv.EnvToken: "a-control-token-of-enough-length"}).PublicAuth(t.Context(), log); err != nil {
		t.Fatalf("sigv4 with a leftover token: %v", err)
	}
	if !strings.Contains(logs.String(), "BELAY_TOKEN is set, but BELAY_AUTH=sigv4") || strings.Contains(logs.String(), "a-control-token-of-enough-length") {
		t.Fatalf("the leftover token's warning: %s", logs.String())
	}
	if _, err := envOf(nil).PublicAuth(t.Context(), log); err == nil || !strings.Contains(err.Error(), "neither BELAY_CONTROL_TOKEN_SECRET_ARN nor BELAY_TOKEN") {
		t.Fatalf("token auth without a token: %v, want the control token's error", err)
	}
}

// The functions add the operator's extensions and checks as belay serve
// does, and name the variable of a bad one.
func TestLimitsTakeTheOperatorsAdditions(t *testing.T) {
	lim, err := envOf(map[string]string{lambdaenv.EnvModel: "m", lambdaenv.EnvExtensions: ".kt", lambdaenv.EnvChecks: "go test ./..."}).Limits()
	if err != nil {
		t.Fatal(err)
	}
	if !lim.ExtensionAllowed("Main.kt") || strings.Join(lim.AllowedChecks[len(lim.AllowedChecks)-1], " ") != "go test ./..." {
		t.Fatalf("limits %v / %q: want .kt and go test added", lim.Extensions, lim.AllowedChecks)
	}
	if _, err := envOf(map[string]string{lambdaenv.EnvModel: "m", lambdaenv.EnvExtensions: "kt"}).Limits(); err == nil || !strings.Contains(err.Error(), `BELAY_EXTENSIONS "kt" is not an extension`) {
		t.Fatalf("a bad extension: %v", err)
	}
}
