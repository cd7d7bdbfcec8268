// Package modelprovider builds the model proxy's upstream from the
// operator's configuration: which provider (openai, the default;
// anthropic; bedrock), its URL or region, and where its key comes from.
// `belay serve` (internal/embedded) and the modelproxy Lambda both build
// theirs here, so the two read the same variables the same way:
//
//	BELAY_MODEL_PROVIDER  openai | anthropic | bedrock (default openai)
//	BELAY_MODEL_API_URL   openai: the chat-completions URL (required);
//	                      anthropic: the API's base URL (default
//	                      https://api.anthropic.com);
//	                      bedrock: an endpoint override (default: the
//	                      region's public endpoint)
//	BELAY_BEDROCK_REGION  bedrock: the region (default: AWS_REGION, or
//	                      the profile's region)
//
// The key (openai, anthropic) comes from a secrets.Source the caller
// builds (a Secrets Manager secret on AWS, a variable or a 0600 file on
// one machine), cached here and dropped when the provider answers 401.
// Bedrock has no key: the calls are signed with the AWS credentials.
package modelprovider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/belay-dev/belay/internal/anthropic"
	"github.com/belay-dev/belay/internal/bedrock"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/upstream"
)

// The environment variables that choose the upstream.
const (
	EnvProvider      = "BELAY_MODEL_PROVIDER"
	EnvAPIURL        = "BELAY_MODEL_API_URL"
	EnvBedrockRegion = "BELAY_BEDROCK_REGION"
)

// Config is the operator's choice of upstream.
type Config struct {
	// Provider is upstream.KindOpenAI (when empty), KindAnthropic or
	// KindBedrock.
	Provider string
	// URL is the provider's URL; what it means depends on Provider (see
	// the package comment).
	URL string
	// Region is Bedrock's region; empty means the AWS configuration's.
	Region string
	// AllowLoopbackHTTP permits plain http to a loopback host (a model
	// served on the same machine, a test server): on for `belay serve`,
	// off on AWS.
	AllowLoopbackHTTP bool
}

// ConfigFromEnv reads the variables through lookup (os.LookupEnv).
func ConfigFromEnv(lookup func(string) (string, bool)) Config {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	return Config{Provider: strings.ToLower(get(EnvProvider)), URL: get(EnvAPIURL), Region: get(EnvBedrockRegion)}
}

// Check fills in the default provider and checks the settings that do not
// need the network, with messages that name the variables.
func (c *Config) Check() error {
	if c.Provider == "" {
		c.Provider = upstream.KindOpenAI
	}
	if err := CheckKind(c.Provider); err != nil {
		return fmt.Errorf("%s: %w", EnvProvider, err)
	}
	if err := CheckURL(c.Provider, c.URL, c.AllowLoopbackHTTP); err != nil {
		return fmt.Errorf("%s: %w", EnvAPIURL, err)
	}
	if c.Region != "" && c.Provider != upstream.KindBedrock {
		return fmt.Errorf("%s is set but the provider is %s; it is for %s=%s", EnvBedrockRegion, c.Provider, EnvProvider, upstream.KindBedrock)
	}
	return nil
}

// CheckKind checks a provider kind.
func CheckKind(kind string) error {
	if slices.Contains(upstream.Kinds, kind) {
		return nil
	}
	return fmt.Errorf("%q is not a provider; want one of %s", kind, strings.Join(upstream.Kinds, ", "))
}

// CheckURL checks the URL of a provider kind: for openai the
// chat-completions URL (required); for anthropic the API's base URL
// (optional); for bedrock the runtime endpoint (optional).
func CheckURL(kind, raw string, allowLoopbackHTTP bool) error {
	switch kind {
	case upstream.KindOpenAI:
		if raw == "" {
			return errors.New("is not set: give the OpenAI-compatible chat-completions URL")
		}
		return upstream.ValidateChatURL(raw, allowLoopbackHTTP)
	case upstream.KindAnthropic:
		if err := upstream.ValidateBaseURL(anthropic.BaseURL(raw), allowLoopbackHTTP); err != nil {
			return fmt.Errorf("the Anthropic API's base URL: %w", err)
		}
	case upstream.KindBedrock:
		if raw == "" {
			return nil
		}
		if err := upstream.ValidateBaseURL(raw, allowLoopbackHTTP); err != nil {
			return fmt.Errorf("the Bedrock runtime endpoint: %w", err)
		}
	}
	return nil
}

// UsesKey reports whether the provider takes a key: every one but Bedrock,
// which signs with the AWS credentials.
func (c Config) UsesKey() bool { return c.Provider != upstream.KindBedrock }

// Describe names the upstream for the operator: the provider and its URL
// (without anything after the path) or region.
func (c Config) Describe() string {
	switch c.Provider {
	case upstream.KindAnthropic:
		return "anthropic " + anthropic.BaseURL(c.URL)
	case upstream.KindBedrock:
		where := "region " + c.Region
		if c.Region == "" {
			where = "the AWS configuration's region"
		}
		if c.URL != "" {
			where += " at " + c.URL
		}
		return "bedrock, " + where
	}
	return "openai-compatible " + c.URL
}

// Deps are what the environment does not name.
type Deps struct {
	// Key is the provider key's source; required when the provider takes
	// a key, and must be nil for Bedrock (a key configured for it is a
	// mistake the operator should hear about). It is wrapped in a
	// secrets.Cache: fetched once per TTL, dropped on a 401.
	Key secrets.Source
	// AWS is the AWS configuration whose credentials sign Bedrock's calls;
	// nil loads the default one.
	AWS *aws.Config
	// HTTPClient sends the calls; nil means a client of the provider's own.
	HTTPClient *http.Client
	// Logger receives the AWS SDK's own lines; nil discards them.
	Logger *slog.Logger
	// Now is the clock of the key cache and the answers; nil is time.Now.
	Now func() time.Time
	// AllowLoopbackHTTP lets FromEnv accept plain http to a loopback host
	// (a function run locally under the Lambda emulator, against a test
	// server); never on AWS.
	AllowLoopbackHTTP bool
}

// New checks cfg and builds its provider.
func New(ctx context.Context, cfg Config, deps Deps) (upstream.Provider, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	var key func(context.Context) (string, error)
	var onUnauthorized func()
	switch {
	case cfg.UsesKey() && deps.Key == nil:
		return nil, fmt.Errorf("the %s provider needs a key: set BELAY_MODEL_API_KEY (or its file or secret)", cfg.Provider)
	case !cfg.UsesKey() && deps.Key != nil:
		return nil, fmt.Errorf("the %s provider signs with AWS credentials and takes no key: unset BELAY_MODEL_API_KEY (and its file or secret)", cfg.Provider)
	case cfg.UsesKey():
		cache := secrets.NewCache(deps.Key, 0, now)
		key, onUnauthorized = cache.Get, cache.Invalidate
	}
	switch cfg.Provider {
	case upstream.KindAnthropic:
		return anthropic.New(anthropic.Config{BaseURL: cfg.URL, AllowLoopbackHTTP: cfg.AllowLoopbackHTTP,
			Key: key, OnUnauthorized: onUnauthorized, Client: deps.HTTPClient, Now: now})
	case upstream.KindBedrock:
		p, err := bedrock.New(ctx, bedrock.Config{Region: cfg.Region, Endpoint: cfg.URL, AllowLoopbackHTTP: cfg.AllowLoopbackHTTP,
			AWS: deps.AWS, Client: deps.HTTPClient, Logger: deps.Logger, Now: now})
		if err != nil {
			return nil, fmt.Errorf("%w (set %s or AWS_REGION)", err, EnvBedrockRegion)
		}
		return p, nil
	}
	return upstream.NewOpenAI(upstream.OpenAIConfig{URL: cfg.URL, AllowLoopbackHTTP: cfg.AllowLoopbackHTTP,
		Key: key, OnUnauthorized: onUnauthorized, Client: deps.HTTPClient})
}

// FromEnv reads the configuration through lookup and builds its provider:
// the constructor of the modelproxy Lambda, which passes its key source
// (nil for Bedrock: ask Config.UsesKey first) and, for Bedrock, its AWS
// configuration. Plain http, even to loopback, only with
// deps.AllowLoopbackHTTP.
func FromEnv(ctx context.Context, lookup func(string) (string, bool), deps Deps) (upstream.Provider, Config, error) {
	cfg := ConfigFromEnv(lookup)
	cfg.AllowLoopbackHTTP = deps.AllowLoopbackHTTP
	if err := cfg.Check(); err != nil {
		return nil, cfg, err
	}
	p, err := New(ctx, cfg, deps)
	return p, cfg, err
}
