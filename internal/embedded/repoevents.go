package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dispatch"
	"github.com/belay-dev/belay/internal/github"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/intake"
	"github.com/belay-dev/belay/internal/publish"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/triggers"
	"github.com/belay-dev/belay/internal/webhook"
)

// The environment variables of runs from git sources and repository
// events (DESIGN.md "Repository events").
const (
	// EnvTriggers is the triggers file: its JSON, or the path of a file
	// holding it. Set, it enables POST /v1/webhooks/github.
	EnvTriggers = "BELAY_TRIGGERS"
	// EnvWebhookSecret (or EnvWebhookSecretFile, a 0600 file) is GitHub's
	// webhook secret, required with EnvTriggers.
	EnvWebhookSecret     = "BELAY_GITHUB_WEBHOOK_SECRET"
	EnvWebhookSecretFile = "BELAY_GITHUB_WEBHOOK_SECRET_FILE"
	// EnvGitCredentials (or EnvGitCredentialsFile, a 0600 file) holds the
	// control plane's git credentials in git's credential-store format,
	// one https://USER:TOKEN@HOST[/PATH] a line.
	EnvGitCredentials     = "BELAY_GIT_CREDENTIALS"
	EnvGitCredentialsFile = "BELAY_GIT_CREDENTIALS_FILE"
	// EnvGitHubToken (or EnvGitHubTokenFile) authorizes the safe outputs'
	// REST calls (pull request, comment); unset, the git credential for
	// the repository's GitHub URL is used. EnvGitHubAPIURL is the REST API
	// (default https://api.github.com/).
	EnvGitHubToken     = "BELAY_GITHUB_TOKEN"
	EnvGitHubTokenFile = "BELAY_GITHUB_TOKEN_FILE"
	EnvGitHubAPIURL    = "BELAY_GITHUB_API_URL"
	// EnvRepoMaxFiles and EnvRepoMaxBytes are the repository limits of a
	// git source (default 20000 files, 104857600 bytes).
	EnvRepoMaxFiles = "BELAY_REPO_MAX_FILES"
	EnvRepoMaxBytes = "BELAY_REPO_MAX_BYTES"
)

// RepoEventsConfig configures git sources, webhooks and safe outputs.
type RepoEventsConfig struct {
	Triggers                           string
	WebhookSecret, WebhookSecretFile   string
	GitCredentials, GitCredentialsFile string
	GitHubToken, GitHubTokenFile       string
	GitHubAPIURL                       string
	RepoMaxFiles                       int
	RepoMaxBytes                       int64
}

func repoEventsConfigFromEnv(get func(string) string) RepoEventsConfig {
	return RepoEventsConfig{
		Triggers:           get(EnvTriggers),
		WebhookSecret:      get(EnvWebhookSecret),
		WebhookSecretFile:  get(EnvWebhookSecretFile),
		GitCredentials:     get(EnvGitCredentials),
		GitCredentialsFile: get(EnvGitCredentialsFile),
		GitHubToken:        get(EnvGitHubToken),
		GitHubTokenFile:    get(EnvGitHubTokenFile),
		GitHubAPIURL:       get(EnvGitHubAPIURL),
		RepoMaxFiles:       int(positiveFromEnv(get(EnvRepoMaxFiles))),
		RepoMaxBytes:       positiveFromEnv(get(EnvRepoMaxBytes)),
	}
}

// repoEvents is what New prepared from RepoEventsConfig.
type repoEvents struct {
	triggers    *triggers.Config // nil: no webhooks
	secret      secrets.Source
	credentials *gitsource.Credentials
	githubToken secrets.Source
	githubAPI   string
	maxFiles    int
	maxBytes    int64
}

// prepareRepoEvents checks the configuration at start, so a mistake names
// its variable before anything is served.
func prepareRepoEvents(cfg RepoEventsConfig, lim belay.Limits) (*repoEvents, error) {
	re := &repoEvents{githubAPI: cfg.GitHubAPIURL, maxFiles: cfg.RepoMaxFiles, maxBytes: cfg.RepoMaxBytes}
	switch {
	case re.maxFiles < 0:
		return nil, fmt.Errorf("%s must be a positive whole number", EnvRepoMaxFiles)
	case re.maxBytes < 0:
		return nil, fmt.Errorf("%s must be a positive whole number", EnvRepoMaxBytes)
	}
	creds, err := secretText(cfg.GitCredentials, cfg.GitCredentialsFile, EnvGitCredentials, EnvGitCredentialsFile)
	if err != nil {
		return nil, err
	}
	if re.credentials, err = gitsource.ParseCredentials(strings.NewReader(creds)); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvGitCredentials, err)
	}
	if re.githubToken, err = secretSource(cfg.GitHubToken, cfg.GitHubTokenFile, EnvGitHubToken, EnvGitHubTokenFile); err != nil {
		return nil, err
	}
	if _, err := github.NewClient(cfg.GitHubAPIURL, nil, nil); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvGitHubAPIURL, err)
	}
	if cfg.Triggers == "" {
		if cfg.WebhookSecret != "" || cfg.WebhookSecretFile != "" {
			return nil, fmt.Errorf("%s is set but %s is not: without triggers no webhook is served", EnvWebhookSecret, EnvTriggers)
		}
		return re, nil
	}
	text := cfg.Triggers
	if !strings.HasPrefix(strings.TrimSpace(text), "{") {
		b, err := os.ReadFile(text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvTriggers, err)
		}
		text = string(b)
	}
	lim.GitURLs = triggers.OperatorGitURLs
	if re.triggers, err = triggers.Parse(strings.NewReader(text), lim); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvTriggers, err)
	}
	if re.secret, err = secretSource(cfg.WebhookSecret, cfg.WebhookSecretFile, EnvWebhookSecret, EnvWebhookSecretFile); err != nil {
		return nil, err
	}
	if re.secret == nil {
		return nil, fmt.Errorf("%s is set, so GitHub's webhooks are served: set %s (or %s), the secret GitHub signs them with", EnvTriggers, EnvWebhookSecret, EnvWebhookSecretFile)
	}
	return re, nil
}

// secretSource is a secret given directly or as a 0600 file, or nil.
func secretSource(value, file, env, envFile string) (secrets.Source, error) {
	switch {
	case value != "" && file != "":
		return nil, fmt.Errorf("both %s and %s are set; set one", env, envFile)
	case file != "":
		src := secrets.NewFileSource(file)
		if _, err := src.Fetch(context.Background()); err != nil {
			return nil, fmt.Errorf("%s: %w", envFile, err)
		}
		return src, nil
	case value != "":
		return secrets.NewStaticSource(value), nil
	}
	return nil, nil
}

// secretText reads a secret given directly or as a file, "" when neither.
func secretText(value, file, env, envFile string) (string, error) {
	src, err := secretSource(value, file, env, envFile)
	if err != nil || src == nil {
		return "", err
	}
	return src.Fetch(context.Background())
}

// limits applies the repository limits to lim.
func (re *repoEvents) limits(lim belay.Limits) belay.Limits {
	if re.maxFiles > 0 {
		lim.RepoMaxFiles = re.maxFiles
	}
	if re.maxBytes > 0 {
		lim.RepoMaxBytes = re.maxBytes
	}
	return lim
}

// githubTokenFor is the token of the safe outputs' REST calls for a
// repository: BELAY_GITHUB_TOKEN, else the git credential for the
// repository's URL on the API's host.
func (re *repoEvents) githubTokenFor(repository string) (string, bool) {
	if re.githubToken != nil {
		tok, err := re.githubToken.Fetch(context.Background())
		return tok, err == nil && tok != ""
	}
	host := "github.com"
	if re.githubAPI != "" {
		if u, err := url.Parse(re.githubAPI); err == nil && u.Host != "api.github.com" {
			host = u.Host
		}
	}
	_, tok, ok := re.credentials.For("https://" + host + "/" + repository + ".git")
	return tok, ok
}

// repoEventsRuntime is what Run builds: the dispatcher's bus and the
// publisher, and what shutting them down waits for.
type repoEventsRuntime struct {
	bus       *dispatch.AsyncBus
	publisher *publish.Publisher
	log       *slog.Logger
	mu        sync.Mutex
	closed    bool
	wg        sync.WaitGroup
}

// onStatus publishes the safe outputs of a run a repository event started,
// once it has ended, in the background.
func (rt *repoEventsRuntime) onStatus(_ context.Context, run belay.Run) {
	if rt == nil || rt.publisher == nil || !run.Status.Terminal() || run.Request.Trigger == nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		rt.log.Warn("safe outputs not written: shutting down", "run_id", run.ID)
		return
	}
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		res, err := rt.publisher.Publish(context.Background(), run.ID)
		if err != nil {
			rt.log.Error("write safe outputs", "run_id", run.ID, "err", err.Error())
			return
		}
		rt.log.Info("safe outputs written", "run_id", run.ID, "branch", res.Branch, "pull_request", res.PullRequest,
			"commented", res.Commented, "skipped", res.Skipped)
	}()
}

// close waits for dispatches and publishes in flight.
func (rt *repoEventsRuntime) close(ctx context.Context) error {
	var errs []error
	if rt.bus != nil {
		errs = append(errs, rt.bus.Close(ctx))
	}
	rt.mu.Lock()
	rt.closed = true
	rt.mu.Unlock()
	done := make(chan struct{})
	go func() { rt.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("safe outputs still being written: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// buildRepoEvents makes the intake service (git sources on), and, with
// triggers, the webhook handler with its dispatcher and the publisher.
func (m *Main) buildRepoEvents(store belay.Store, artifacts belay.ArtifactStore, orch belay.Orchestrator, lim belay.Limits,
	rt *repoEventsRuntime) (*intake.Service, *webhook.Handler, error) {
	re := m.repoEvents
	sources, ok := artifacts.(belay.SourceStore)
	if !ok {
		return nil, nil, errors.New("the artifact store cannot keep git sources")
	}
	git := gitsource.New(gitsource.Config{Credentials: re.credentials, Logger: m.log})
	svc, err := intake.New(intake.Config{
		Store: store, Orchestrator: orch, Git: git, Sources: sources, Limits: lim,
		NewID: webhook.NewRunID, Now: m.now, Logger: m.log,
	})
	if err != nil {
		return nil, nil, err
	}
	if re.triggers == nil {
		return svc, nil, nil
	}
	gh, err := github.NewClient(re.githubAPI, nil, re.githubTokenFor)
	if err != nil {
		return nil, nil, err
	}
	if rt.publisher, err = publish.New(publish.Config{
		Store: store, Artifacts: artifacts, Sources: sources, Git: git, GitHub: gh, Logger: m.log, Now: m.now,
	}); err != nil {
		return nil, nil, err
	}
	d, err := dispatch.New(dispatch.Config{Triggers: re.triggers, Intake: svc, Store: store, NewID: webhook.NewRunID, Now: m.now, Logger: m.log})
	if err != nil {
		return nil, nil, err
	}
	rt.bus = dispatch.NewAsyncBus(d, m.log)
	rt.bus.OnDispatched = m.cfg.OnDispatched
	secret := secrets.NewCache(re.secret, 0, m.now)
	h, err := webhook.New(webhook.Config{
		Secret: secret.Get, Triggers: re.triggers, Deliveries: store, Runs: store, Bus: rt.bus,
		NewID: webhook.NewRunID, Now: m.now, Logger: m.log,
	})
	if err != nil {
		return nil, nil, err
	}
	return svc, h, nil
}
