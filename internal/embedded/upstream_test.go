package embedded_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
)

// TestNewRefusesBadProviderConfig: a provider setting that cannot work
// stops the start with a message naming the variable and the flag.
func TestNewRefusesBadProviderConfig(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_PROFILE", "")
	real := func(kind, url string) func(*embedded.Config) {
		return func(c *embedded.Config) {
			c.ScriptedModel, c.Model, c.ModelAPIURL, c.ModelAPIKey = "", "m", url, "sk-test"
			c.Provider.Kind = kind
		}
	}
	tests := []struct {
		name string
		edit func(*embedded.Config)
		want []string
	}{
		{"unknown provider", real("vertex", ""), []string{"BELAY_MODEL_PROVIDER (--model-provider)", "openai, anthropic, bedrock"}},
		{"anthropic URL with a query", real("anthropic", "https://api.anthropic.com?beta=1"), []string{"BELAY_MODEL_API_URL (--model-api-url)", "query"}},
		{"anthropic over plain http", real("anthropic", "http://gw.example.com"), []string{"BELAY_MODEL_API_URL", "loopback"}},
		{"anthropic without a key", func(c *embedded.Config) { real("anthropic", "")(c); c.ModelAPIKey = "" }, []string{"BELAY_MODEL_API_KEY"}},
		{"bedrock with a key", real("bedrock", ""), []string{"takes no key", "BELAY_MODEL_API_KEY"}},
		{"bedrock with a key for a scripted session", func(c *embedded.Config) { c.Provider.Kind, c.ModelAPIKey = "bedrock", "sk-test" }, []string{"takes no key"}},
		{"bedrock without a region", func(c *embedded.Config) { real("bedrock", "")(c); c.ModelAPIKey = "" }, []string{"BELAY_BEDROCK_REGION (--bedrock-region)", "AWS_REGION"}},
		{"bedrock endpoint over plain http", func(c *embedded.Config) {
			real("bedrock", "http://bedrock.example.com")(c)
			c.ModelAPIKey, c.Provider.BedrockRegion = "", "eu-west-3"
		}, []string{"BELAY_MODEL_API_URL", "Bedrock runtime endpoint"}},
		{"a region for another provider", func(c *embedded.Config) { real("anthropic", "")(c); c.Provider.BedrockRegion = "eu-west-3" }, []string{"BELAY_BEDROCK_REGION", "--bedrock-region"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := embeddedtest.Config(t, nil)
			tt.edit(&cfg)
			_, err := embedded.New(cfg)
			if err == nil {
				t.Fatal("New accepted the configuration")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "sk-test") {
				t.Errorf("the error repeats the key: %v", err)
			}
		})
	}
}

// TestConfigFromEnvReadsTheProvider: the provider variables reach Config.
func TestConfigFromEnvReadsTheProvider(t *testing.T) {
	env := map[string]string{"BELAY_MODEL_PROVIDER": "Bedrock", "BELAY_BEDROCK_REGION": " eu-west-3 ", "BELAY_MODEL_API_URL": "https://vpce.example"}
	cfg := embedded.ConfigFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if cfg.Provider.Kind != "bedrock" || cfg.Provider.BedrockRegion != "eu-west-3" || cfg.ModelAPIURL != "https://vpce.example" {
		t.Errorf("config %+v", cfg.Provider)
	}
}
