// Package anthropic is the model proxy's provider for Anthropic's Messages
// API, through Anthropic's official Go SDK. The sandbox keeps speaking
// chat completions; Request and Completion translate (pure functions, see
// their rules), and Provider sends one call with the provider key, which
// is handled as the OpenAI-compatible provider handles it: fetched from
// its source per call (a secrets.Cache), dropped on a 401, sent only to the
// configured host, never retried.
package anthropic

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/belay-dev/belay/internal/upstream"
)

// DefaultBaseURL is Anthropic's API, the base URL when none is configured.
const DefaultBaseURL = "https://api.anthropic.com"

// messagesPath is the path the SDK adds to the base URL; a configured URL
// ending in it is taken as its base.
const messagesPath = "/v1/messages"

// Config configures the provider.
type Config struct {
	// BaseURL is the API's base URL (DefaultBaseURL when empty); the SDK
	// adds /v1/messages. https, or plain http to a loopback host with
	// AllowLoopbackHTTP.
	BaseURL           string
	AllowLoopbackHTTP bool
	// Key returns the provider key, once per call; the source should
	// cache (secrets.Cache). Required.
	Key func(ctx context.Context) (string, error)
	// OnUnauthorized, when set, is called when the API answers 401, so a
	// caching key source can drop a rotated key early.
	OnUnauthorized func()
	// Client sends the calls; nil means a client of its own. Redirects are
	// never followed.
	Client *http.Client
	// Now stamps the answers' "created"; nil means time.Now.
	Now func() time.Time
}

// Provider sends chat-completions calls to the Messages API.
type Provider struct {
	cfg    Config
	client sdk.Client
}

// BaseURL returns the base URL a configured URL stands for: DefaultBaseURL
// for "", the URL without a trailing /v1/messages or slash otherwise.
func BaseURL(configured string) string {
	if configured == "" {
		return DefaultBaseURL
	}
	return strings.TrimSuffix(strings.TrimSuffix(configured, "/"), messagesPath)
}

// New checks cfg and builds the provider.
func New(cfg Config) (*Provider, error) {
	if cfg.Key == nil {
		return nil, errors.New("anthropic: Config.Key is required")
	}
	cfg.BaseURL = BaseURL(cfg.BaseURL)
	if err := upstream.ValidateBaseURL(cfg.BaseURL, cfg.AllowLoopbackHTTP); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Provider{cfg: cfg}
	// WithoutEnvironmentDefaults: the SDK must not pick up ANTHROPIC_*
	// variables (another key, a base URL, extra headers) from the
	// process's environment; belay sends exactly what it is configured
	// to. No retries: the run paid for one call.
	p.client = sdk.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(cfg.BaseURL+"/"),
		option.WithHTTPClient(upstream.NewHTTPClient(cfg.Client)),
		option.WithMaxRetries(0),
	)
	return p, nil
}

// Complete translates the call, sends it with the key, and translates the
// answer back.
func (p *Provider) Complete(ctx context.Context, call upstream.Call) ([]byte, error) {
	chat, err := upstream.ParseChatRequest(call.Body)
	if err != nil {
		return nil, err
	}
	params, err := Request(chat)
	if err != nil {
		return nil, err
	}
	key, err := p.cfg.Key(ctx)
	if err == nil && key == "" {
		err = errors.New("empty key")
	}
	if err != nil {
		return nil, upstream.KeyUnavailable(upstream.MsgKeyUnavailable, err)
	}
	opts := []option.RequestOption{option.WithAPIKey(key)}
	if d, ok := ctx.Deadline(); ok {
		// The proxy's deadline bounds the call; the SDK would otherwise
		// work out a timeout of its own from max_tokens.
		opts = append(opts, option.WithRequestTimeout(time.Until(d)))
	}
	limit := call.Limit()
	tracked, x := upstream.Track(ctx, limit)
	msg, err := p.client.Messages.New(tracked, params, opts...)
	return p.answer(msg, err, x, chat.Model, limit)
}

// answer classifies what the call came to. The provider's status decides
// first (a redirect or an error status is named as it is, whatever the SDK
// made of the body); the SDK's error text is never used, since it carries
// the answer's body.
func (p *Provider) answer(msg *sdk.Message, err error, x *upstream.Exchange, model string, limit int64) ([]byte, error) {
	status := x.Status()
	switch {
	case x.Exceeded():
		return nil, upstream.TooLarge(status, limit)
	case status == http.StatusUnauthorized:
		if p.cfg.OnUnauthorized != nil {
			p.cfg.OnUnauthorized()
		}
		return nil, upstream.StatusError(status, apiDetail(err))
	case status != 0 && (status < 200 || status > 299):
		return nil, upstream.StatusError(status, apiDetail(err))
	case status == 0:
		if err == nil {
			err = errors.New("no answer")
		}
		// No answer came, so the error holds no body: a transport
		// error names the URL, never a header.
		return nil, upstream.Unreachable(err)
	case err != nil || msg == nil:
		if !upstream.IsJSONObject(x.Body()) {
			return nil, upstream.NotJSON(status)
		}
		return nil, upstream.Malformed(status, fmt.Errorf("decode the Messages answer: %T", err))
	}
	c, err := Completion(msg, model, p.cfg.Now())
	if err != nil {
		return nil, upstream.Malformed(status, err)
	}
	return c.Answer(status, limit)
}

// apiDetail is what the log may say of an API error: its type and request
// id, never its message or body.
func apiDetail(err error) error {
	if e, ok := errors.AsType[*sdk.Error](err); ok {
		return fmt.Errorf("anthropic error type %q, request id %q", string(e.Type()), e.RequestID)
	}
	return nil
}
