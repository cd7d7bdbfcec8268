package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// OpenAIConfig configures the OpenAI-compatible provider.
type OpenAIConfig struct {
	// URL is the chat-completions endpoint; see ValidateChatURL.
	URL string
	// AllowLoopbackHTTP permits plain http to a loopback host.
	AllowLoopbackHTTP bool
	// Key returns the provider key, once per call; the source should
	// cache (secrets.Cache).
	Key func(ctx context.Context) (string, error)
	// OnUnauthorized, when set, is called when the provider answers 401,
	// so a caching key source can drop a rotated key early.
	OnUnauthorized func()
	// Client sends the calls; nil means a client of its own. Redirects are
	// never followed, whichever client it is.
	Client *http.Client
}

// OpenAI forwards the canonical chat-completions body as it is to an
// OpenAI-compatible endpoint, with the provider key as a bearer token.
type OpenAI struct {
	cfg    OpenAIConfig
	client *http.Client
}

// NewOpenAI checks cfg and returns the provider.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.Key == nil {
		return nil, errors.New("upstream: OpenAIConfig.Key is required")
	}
	if err := ValidateChatURL(cfg.URL, cfg.AllowLoopbackHTTP); err != nil {
		return nil, err
	}
	return &OpenAI{cfg: cfg, client: NewHTTPClient(cfg.Client)}, nil
}

// Complete forwards call.Body and returns the provider's answer, which
// must be a JSON object no larger than the call's limit.
func (p *OpenAI) Complete(ctx context.Context, call Call) ([]byte, error) {
	key, err := p.cfg.Key(ctx)
	if err == nil && key == "" {
		err = errors.New("empty key")
	}
	if err != nil {
		// The key source's error names a file or a secret, not the key.
		return nil, KeyUnavailable(MsgKeyUnavailable, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.URL, bytes.NewReader(call.Body))
	if err != nil {
		return nil, Unreachable(fmt.Errorf("build upstream request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)

	resp, err := p.client.Do(req)
	if err != nil {
		// A transport error's text names the URL, never headers.
		return nil, Unreachable(err)
	}
	defer resp.Body.Close()
	limit := call.Limit()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		e := Unreachable(err)
		e.Status, e.Message = resp.StatusCode, "could not read the model provider's answer"
		return nil, e
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		if p.cfg.OnUnauthorized != nil {
			p.cfg.OnUnauthorized()
		}
		return nil, StatusError(resp.StatusCode, nil)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, StatusError(resp.StatusCode, nil)
	case int64(len(answer)) > limit:
		return nil, TooLarge(resp.StatusCode, limit)
	case !IsJSONObject(answer):
		return nil, NotJSON(resp.StatusCode)
	}
	return answer, nil
}

// IsJSONObject reports whether b is one valid JSON object.
func IsJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
