// Package gitenv builds, from a Lambda function's environment, the git
// credentials and the GitHub client of the repository-event functions
// (dispatcher, publisher). It is apart from lambdaenv so that the other
// functions link no git or GitHub code.
package gitenv

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/github"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/lambdaenv"
	"github.com/belay-dev/belay/internal/secrets"
)

// Credentials returns the git credentials (optional: none when neither
// variable is set), read once.
func Credentials(ctx context.Context, e *lambdaenv.Env) (*gitsource.Credentials, error) {
	if e.Get(lambdaenv.EnvGitCredentials) == "" && e.Get(lambdaenv.EnvGitCredentialsSecretARN) == "" {
		return &gitsource.Credentials{}, nil
	}
	v, err := e.Secret(ctx, lambdaenv.EnvGitCredentials, lambdaenv.EnvGitCredentialsSecretARN, "the git credentials")
	if err != nil {
		return nil, err
	}
	c, err := gitsource.ParseCredentials(strings.NewReader(v))
	if err != nil {
		return nil, fmt.Errorf("the git credentials (%s or %s): %w", lambdaenv.EnvGitCredentials, lambdaenv.EnvGitCredentialsSecretARN, err)
	}
	return c, nil
}

// GitHub returns the REST client of the safe outputs: lambdaenv.EnvGitHubAPIURL,
// with lambdaenv.EnvGitHubToken (or its secret) or else the git credential for the
// repository's URL on the API's host.
func GitHub(ctx context.Context, e *lambdaenv.Env, creds *gitsource.Credentials) (*github.Client, error) {
	api := e.Get(lambdaenv.EnvGitHubAPIURL)
	var tok *secrets.Cache
	if e.Get(lambdaenv.EnvGitHubToken) != "" || e.Get(lambdaenv.EnvGitHubTokenSecretARN) != "" {
		src, err := e.SecretSource(ctx, lambdaenv.EnvGitHubToken, lambdaenv.EnvGitHubTokenSecretARN, "the GitHub token")
		if err != nil {
			return nil, err
		}
		tok = secrets.NewCache(src, 0, nil)
	}
	host := "github.com"
	if u, err := url.Parse(api); err == nil && api != "" && u.Host != "api.github.com" {
		host = u.Host
	}
	return github.NewClient(api, nil, func(repository string) (string, bool) {
		if tok != nil {
			t, err := tok.Get(context.Background())
			return t, err == nil && t != ""
		}
		_, t, ok := creds.For("https://" + host + "/" + repository + ".git")
		return t, ok
	})
}

// Fetcher fetches git sources with the credentials it reads at its first
// fetch, and again after a failure, not at start: a function whose git
// credentials are not set up yet (the stack's secret holds a generated
// placeholder until the operator puts them) still starts and serves every
// other route, and a fetch says what is wrong.
type Fetcher struct {
	env *lambdaenv.Env
	log *slog.Logger

	mu     sync.Mutex
	client *gitsource.Client
}

// NewFetcher returns a Fetcher reading the credentials from env.
func NewFetcher(env *lambdaenv.Env, log *slog.Logger) *Fetcher {
	return &Fetcher{env: env, log: log}
}

// FetchSource fetches src (belay.SourceFetcher); unavailable when the
// credentials cannot be read or parsed (the log says why).
func (f *Fetcher) FetchSource(ctx context.Context, src belay.GitSource, lim belay.Limits) (*belay.FetchedSource, error) {
	f.mu.Lock()
	if f.client == nil {
		creds, err := Credentials(ctx, f.env)
		if err != nil {
			f.mu.Unlock()
			f.log.Error("git credentials unreadable; git sources are refused until they are fixed", "err", err.Error())
			return nil, belay.Errorf(belay.CodeUnavailable,
				"the control plane's git credentials cannot be read; an operator must put valid ones in the secret named by %s", lambdaenv.EnvGitCredentialsSecretARN)
		}
		f.client = gitsource.New(gitsource.Config{Credentials: creds, Logger: f.log})
	}
	c := f.client
	f.mu.Unlock()
	return c.FetchSource(ctx, src, lim)
}
