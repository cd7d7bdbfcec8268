package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/modelprovider"
	"github.com/belay-dev/belay/internal/scriptedmodel"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/upstream"
)

// The environment variables that choose the model provider (see
// internal/modelprovider, which the modelproxy Lambda reads them with
// too).
const (
	EnvModelProvider = modelprovider.EnvProvider
	EnvBedrockRegion = modelprovider.EnvBedrockRegion
)

// scriptedBedrockRegion is the region a scripted Bedrock session signs for
// when none is configured.
const scriptedBedrockRegion = "us-east-1"

// scriptedAWSCredentials sign the calls to a scripted Bedrock session when
// no credentials are configured: the session is served on loopback and
// checks the signature with these same values, so no AWS account is
// needed for the offline demo.
var scriptedAWSCredentials = aws.Credentials{
	AccessKeyID: "AKIDSCRIPTEDMODEL000", SecretAccessKey: "scripted-model-secret-access-key", Source: "scripted",
}

// ProviderConfig chooses the model provider behind the proxy. The zero
// value is the OpenAI-compatible provider at Config.ModelAPIURL.
type ProviderConfig struct {
	// Kind is upstream.KindOpenAI (when empty), KindAnthropic or
	// KindBedrock. Config.ModelAPIURL is then the chat-completions URL,
	// the Anthropic API's base URL (optional), or the Bedrock runtime
	// endpoint (optional).
	Kind string
	// BedrockRegion is Bedrock's region; empty means the AWS
	// configuration's (AWS_REGION, a profile's region).
	BedrockRegion string
	// AWSCredentials sign Bedrock's calls; nil means the default AWS
	// credential chain (environment, shared files, instance role), or,
	// for a scripted session, fixed loopback-only credentials.
	AWSCredentials aws.CredentialsProvider
}

// providerConfigFromEnv reads the provider variables through get.
func providerConfigFromEnv(get func(string) string) ProviderConfig {
	return ProviderConfig{Kind: strings.ToLower(get(EnvModelProvider)), BedrockRegion: get(EnvBedrockRegion)}
}

// providerSettings is the modelprovider configuration cfg stands for.
func providerSettings(cfg Config) modelprovider.Config {
	return modelprovider.Config{Provider: cfg.Provider.Kind, URL: cfg.ModelAPIURL,
		Region: cfg.Provider.BedrockRegion, AllowLoopbackHTTP: true}
}

// configureUpstream checks the provider, the model, the upstream URL or
// region and the provider key, or loads the scripted session that replaces
// the provider (speaking the configured provider's wire format).
func (m *Main) configureUpstream(cfg *Config) error {
	p := &cfg.Provider
	if p.Kind == "" {
		p.Kind = upstream.KindOpenAI
	}
	if err := modelprovider.CheckKind(p.Kind); err != nil {
		return fmt.Errorf("%s (--model-provider): %w", EnvModelProvider, err)
	}
	settings := providerSettings(*cfg)
	if cfg.ModelAPIKey != "" && cfg.ModelAPIKeyFile != "" {
		return fmt.Errorf("both %s and %s are set; set one", EnvModelAPIKey, EnvModelKeyFile)
	}
	hasKey := cfg.ModelAPIKey != "" || cfg.ModelAPIKeyFile != ""
	if !settings.UsesKey() && hasKey {
		return fmt.Errorf("%s=%s signs its calls with AWS credentials and takes no key: unset %s and %s",
			EnvModelProvider, p.Kind, EnvModelAPIKey, EnvModelKeyFile)
	}
	if p.BedrockRegion != "" && p.Kind != upstream.KindBedrock {
		return fmt.Errorf("%s (--bedrock-region) is set but the provider is %s; set %s=%s or unset it",
			EnvBedrockRegion, p.Kind, EnvModelProvider, upstream.KindBedrock)
	}
	if cfg.ScriptedModel != "" {
		if cfg.ModelAPIURL != "" {
			return fmt.Errorf("both %s and %s are set; a scripted session replaces the upstream, so set one", EnvScriptedModel, EnvModelAPIURL)
		}
		script, err := scriptedmodel.LoadScript(cfg.ScriptedModel)
		if err != nil {
			return fmt.Errorf("%s (--scripted-model): %w", EnvScriptedModel, err)
		}
		m.script = &script
		if cfg.Model == "" {
			cfg.Model = DefaultScriptedModelName
		}
	}
	if cfg.Model == "" {
		return fmt.Errorf("%s (--model) is not set: name the one model runs may use", EnvModel)
	}
	switch {
	case m.script != nil:
		if settings.UsesKey() && !hasKey {
			// The scripted server needs no key, but the proxy always
			// sends one; a fixed, harmless value.
			cfg.ModelAPIKey = "scripted-model-needs-no-key"
		}
	default:
		if err := modelprovider.CheckURL(p.Kind, cfg.ModelAPIURL, true); err != nil {
			msg := err.Error()
			if p.Kind == upstream.KindOpenAI && cfg.ModelAPIURL == "" {
				msg += fmt.Sprintf(" (or %s for an offline scripted session)", EnvScriptedModel)
			}
			return fmt.Errorf("%s (--model-api-url): %s", EnvModelAPIURL, msg)
		}
		if settings.UsesKey() && !hasKey {
			return fmt.Errorf("no provider key: set %s, or %s (--model-api-key-file) to a 0600 file holding it", EnvModelAPIKey, EnvModelKeyFile)
		}
		if p.Kind == upstream.KindBedrock && p.BedrockRegion == "" && p.AWSCredentials == nil {
			// A missing region stops the start, not the first run.
			ac, err := awsconfig.LoadDefaultConfig(context.Background())
			if err != nil {
				return fmt.Errorf("load the default AWS configuration for Bedrock: %w", err)
			}
			if ac.Region == "" {
				return fmt.Errorf("no AWS region for Bedrock: set %s (--bedrock-region) or AWS_REGION", EnvBedrockRegion)
			}
		}
	}
	switch {
	case !settings.UsesKey():
		m.apiKey = nil
	case cfg.ModelAPIKeyFile != "":
		src := secrets.NewFileSource(cfg.ModelAPIKeyFile)
		// Read it once now, so a bad file stops the start rather than
		// the first run.
		if _, err := src.Fetch(context.Background()); err != nil {
			return fmt.Errorf("%s (--model-api-key-file): %w", EnvModelKeyFile, err)
		}
		m.apiKey = src
	default:
		m.apiKey = secrets.NewStaticSource(cfg.ModelAPIKey)
	}
	return nil
}

// openUpstream builds the proxy's provider, first serving the scripted
// session on a loopback listener when one is configured. The returned
// function stops that server.
func (m *Main) openUpstream(ctx context.Context) (httpapi.Upstream, func() error, error) {
	settings := providerSettings(m.cfg)
	deps := modelprovider.Deps{Key: m.apiKey, Logger: m.log, Now: m.now}
	stop := func() error { return nil }
	if creds := m.cfg.Provider.AWSCredentials; creds != nil {
		region := settings.Region
		if region == "" && m.script != nil {
			region = scriptedBedrockRegion
		}
		deps.AWS = &aws.Config{Region: region, Credentials: aws.NewCredentialsCache(creds)}
	}
	if m.script != nil {
		opts := []scriptedmodel.Option{scriptedmodel.WithClock(m.now)}
		if settings.Provider == upstream.KindBedrock {
			if settings.Region == "" {
				settings.Region = scriptedBedrockRegion
			}
			if deps.AWS == nil {
				deps.AWS = &aws.Config{Region: settings.Region, Credentials: credentials.StaticCredentialsProvider{Value: scriptedAWSCredentials}}
			}
			creds, err := deps.AWS.Credentials.Retrieve(ctx)
			if err != nil {
				return httpapi.Upstream{}, nil, fmt.Errorf("AWS credentials for the scripted Bedrock session: %w", err)
			}
			opts = append(opts, scriptedmodel.WithSigV4(creds, settings.Region))
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return httpapi.Upstream{}, nil, fmt.Errorf("listen for the scripted model: %w", err)
		}
		model := scriptedmodel.New(*m.script, opts...)
		served := make(chan error, 1)
		go func() { served <- model.Serve(ln) }()
		stop = func() error {
			_ = ln.Close()
			return <-served
		}
		settings.URL = "http://" + ln.Addr().String()
		if settings.Provider == upstream.KindOpenAI {
			settings.URL += "/v1/chat/completions"
		}
		m.log.Info("serving a scripted model session as the upstream", "script", m.cfg.ScriptedModel,
			"provider", settings.Provider, "url", settings.URL)
	}
	provider, err := modelprovider.New(ctx, settings, deps)
	if err != nil {
		return httpapi.Upstream{}, nil, errors.Join(fmt.Errorf("model provider (%s): %w", EnvModelProvider, err), stop())
	}
	return httpapi.Upstream{Provider: provider}, stop, nil
}

// Upstream names the model provider for the operator: its kind and URL or
// region, or the scripted session.
func (m *Main) Upstream() string {
	if m.script != nil {
		return fmt.Sprintf("scripted session %s (%s wire format)", m.cfg.ScriptedModel, m.cfg.Provider.Kind)
	}
	return providerSettings(m.cfg).Describe()
}
