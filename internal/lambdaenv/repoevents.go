package lambdaenv

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/eventbridge"
	"github.com/belay-dev/belay/internal/secrets"
	"github.com/belay-dev/belay/internal/triggers"
)

// The variables of the repository-event functions (webhook, dispatcher,
// publisher), and of every function that changes a run's state when the
// stack has a bus (run status events).
const (
	// EnvEventBus names belay's EventBridge bus (name or ARN): the webhook
	// puts repository events there; with it set, the functions that move
	// runs put a run status event there on every state.
	EnvEventBus = "BELAY_EVENT_BUS"
	// EnvTriggers is the triggers file's JSON (the stack sets it from its
	// configuration).
	EnvTriggers = "BELAY_TRIGGERS"
	// EnvWebhookSecretARN (or EnvWebhookSecret) is GitHub's webhook secret.
	EnvWebhookSecretARN = "BELAY_GITHUB_WEBHOOK_SECRET_ARN"
	EnvWebhookSecret    = "BELAY_GITHUB_WEBHOOK_SECRET"
	// EnvGitCredentialsSecretARN (or EnvGitCredentials) holds the git
	// credentials, git's credential-store format; optional.
	EnvGitCredentialsSecretARN = "BELAY_GIT_CREDENTIALS_SECRET_ARN"
	EnvGitCredentials          = "BELAY_GIT_CREDENTIALS"
	// EnvGitHubTokenSecretARN (or EnvGitHubToken) authorizes the
	// publisher's REST calls; optional (the git credential's token for
	// the repository otherwise). EnvGitHubAPIURL is the REST API.
	EnvGitHubTokenSecretARN = "BELAY_GITHUB_TOKEN_SECRET_ARN"
	EnvGitHubToken          = "BELAY_GITHUB_TOKEN"
	EnvGitHubAPIURL         = "BELAY_GITHUB_API_URL"
	// EnvRepoMaxFiles and EnvRepoMaxBytes are the repository limits.
	EnvRepoMaxFiles = "BELAY_REPO_MAX_FILES"
	EnvRepoMaxBytes = "BELAY_REPO_MAX_BYTES"
	// EnvEventBridgeEndpoint points the EventBridge client at a local
	// peer (tests).
	EnvEventBridgeEndpoint = "BELAY_EVENTBRIDGE_ENDPOINT"
)

// EventBus returns belay's bus (EnvEventBus, required).
func (e *Env) EventBus(ctx context.Context) (*eventbridge.Bus, error) {
	name, err := e.Require(EnvEventBus, "name belay's EventBridge bus")
	if err != nil {
		return nil, err
	}
	c, err := client(ctx, e, EnvEventBridgeEndpoint, func(o aws.Config) *awseb.Client { return awseb.NewFromConfig(o) })
	if err != nil {
		return nil, err
	}
	return eventbridge.New(c, name), nil
}

// RunStore returns the store of a function that moves runs from state to
// state (api, steps, cleanup, dispatcher): the DynamoDB store on EnvTable,
// which, when EnvEventBus is set, also puts each run state it writes on
// the bus as a run status event.
func (e *Env) RunStore(ctx context.Context, log *slog.Logger) (belay.Store, error) {
	store, err := e.Store(ctx, log)
	if err != nil || e.Get(EnvEventBus) == "" {
		return store, err
	}
	bus, err := e.EventBus(ctx)
	if err != nil {
		return nil, err
	}
	return belay.NotifyStore(store, bus.StatusNotifier(func(runID string, err error) {
		log.Error("put the run status event", "run_id", runID, "err", err.Error())
	})), nil
}

// RepoLimits returns the run limits (EnvModel) with the repository limits
// (EnvRepoMaxFiles, EnvRepoMaxBytes).
func (e *Env) RepoLimits() (belay.Limits, error) {
	lim, err := e.Limits()
	if err != nil {
		return belay.Limits{}, err
	}
	if lim.RepoMaxFiles, err = e.Count(EnvRepoMaxFiles, belay.DefaultRepoMaxFiles); err != nil {
		return belay.Limits{}, err
	}
	maxBytes, err := e.Count(EnvRepoMaxBytes, belay.DefaultRepoMaxBytes)
	if err != nil {
		return belay.Limits{}, err
	}
	lim.RepoMaxBytes = int64(maxBytes)
	return lim, nil
}

// Triggers parses EnvTriggers (required) against the run limits with the
// repository limits (RepoLimits), and returns those limits too: the
// webhook and the dispatcher judge repository events by the same.
func (e *Env) Triggers() (*triggers.Config, belay.Limits, error) {
	lim, err := e.RepoLimits()
	if err != nil {
		return nil, belay.Limits{}, err
	}
	v, err := e.Require(EnvTriggers, "give the triggers file's JSON")
	if err != nil {
		return nil, belay.Limits{}, err
	}
	trigLim := lim
	trigLim.GitURLs = triggers.OperatorGitURLs
	c, err := triggers.Parse(strings.NewReader(v), trigLim)
	if err != nil {
		return nil, belay.Limits{}, fmt.Errorf("%s: %w", EnvTriggers, err)
	}
	return c, lim, nil
}

// WebhookSecret returns GitHub's webhook secret, cached (required).
func (e *Env) WebhookSecret(ctx context.Context) (func(context.Context) (string, error), error) {
	src, err := e.SecretSource(ctx, EnvWebhookSecret, EnvWebhookSecretARN, "GitHub's webhook secret")
	if err != nil {
		return nil, err
	}
	return secrets.NewCache(src, 0, nil).Get, nil
}
