package modelprovider_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/bedrock"
	"github.com/belay-dev/belay/internal/modelprovider"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/upstream"
)

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

var awsCfg = &aws.Config{Region: "eu-west-3", Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")}

// TestFromEnv builds the provider each configuration names, as the
// modelproxy Lambda does, and refuses the ones that cannot work, naming
// the variable.
func TestFromEnv(t *testing.T) {
	key := secrets.NewStaticSource("sk-test")
	tests := []struct {
		name     string
		env      map[string]string
		key      secrets.Source
		wantType any
		wantErr  []string
	}{
		{"default is openai", map[string]string{"BELAY_MODEL_API_URL": "https://api.openai.com/v1/chat/completions"}, key, &upstream.OpenAI{}, nil},
		{"openai needs its URL", map[string]string{"BELAY_MODEL_PROVIDER": "openai"}, key, nil, []string{"BELAY_MODEL_API_URL", "is not set"}},
		{"openai over http beyond loopback", map[string]string{"BELAY_MODEL_API_URL": "http://127.0.0.1:1/v1/chat/completions"}, key, nil, []string{"BELAY_MODEL_API_URL", "https"}},
		{"anthropic, default URL", map[string]string{"BELAY_MODEL_PROVIDER": "Anthropic"}, key, &anthropic.Provider{}, nil},
		{"anthropic with a gateway", map[string]string{"BELAY_MODEL_PROVIDER": "anthropic", "BELAY_MODEL_API_URL": "https://gw.example/anthropic"}, key, &anthropic.Provider{}, nil},
		{"anthropic needs a key", map[string]string{"BELAY_MODEL_PROVIDER": "anthropic"}, nil, nil, []string{"needs a key", "BELAY_MODEL_API_KEY"}},
		{"anthropic URL with a query", map[string]string{"BELAY_MODEL_PROVIDER": "anthropic", "BELAY_MODEL_API_URL": "https://api.anthropic.com?x=1"}, key, nil, []string{"BELAY_MODEL_API_URL", "query"}},
		{"bedrock with a region", map[string]string{"BELAY_MODEL_PROVIDER": "bedrock", "BELAY_BEDROCK_REGION": "eu-west-3"}, nil, &bedrock.Provider{}, nil},
		{"bedrock with a VPC endpoint", map[string]string{"BELAY_MODEL_PROVIDER": "bedrock", "BELAY_MODEL_API_URL": "https://vpce-1.bedrock-runtime.eu-west-3.vpce.amazonaws.com"}, nil, &bedrock.Provider{}, nil},
		{"bedrock takes no key", map[string]string{"BELAY_MODEL_PROVIDER": "bedrock"}, key, nil, []string{"takes no key", "BELAY_MODEL_API_KEY"}},
		{"region for another provider", map[string]string{"BELAY_MODEL_PROVIDER": "anthropic", "BELAY_BEDROCK_REGION": "eu-west-3"}, key, nil, []string{"BELAY_BEDROCK_REGION"}},
		{"unknown provider", map[string]string{"BELAY_MODEL_PROVIDER": "vertex"}, key, nil, []string{"BELAY_MODEL_PROVIDER", "openai, anthropic, bedrock"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, cfg, err := modelprovider.FromEnv(context.Background(), lookup(tt.env), modelprovider.Deps{Key: tt.key, AWS: awsCfg})
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("FromEnv accepted %v", tt.env)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("FromEnv: %v", err)
			}
			if got, want := kindOf(p), kindOf(tt.wantType); got != want {
				t.Errorf("provider %s, want %s", got, want)
			}
			if cfg.Provider == "" {
				t.Error("the returned configuration has no provider")
			}
		})
	}
}

func kindOf(v any) string {
	switch v.(type) {
	case *upstream.OpenAI:
		return "openai"
	case *anthropic.Provider:
		return "anthropic"
	case *bedrock.Provider:
		return "bedrock"
	}
	return "other"
}

func TestDescribe(t *testing.T) {
	for cfg, want := range map[modelprovider.Config]string{
		{Provider: "openai", URL: "https://api.openai.com/v1/chat/completions"}: "openai-compatible https://api.openai.com/v1/chat/completions",
		{Provider: "anthropic"}:                            "anthropic https://api.anthropic.com",
		{Provider: "bedrock", Region: "eu-west-3"}:         "bedrock, region eu-west-3",
		{Provider: "bedrock", URL: "https://vpce.example"}: "bedrock, the AWS configuration's region at https://vpce.example",
	} {
		if got := cfg.Describe(); got != want {
			t.Errorf("Describe(%+v) = %q, want %q", cfg, got, want)
		}
	}
}
