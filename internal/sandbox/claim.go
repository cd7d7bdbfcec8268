package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
	"github.com/belay-dev/belay/internal/wire"
)

// claimTimeout bounds the claim exchange, retries included. The code
// expires belay.ClaimTTL after it was issued anyway.
const claimTimeout = 60 * time.Second

// claimEnv is claim mode's configuration, from the environment.
type claimEnv struct {
	code    string
	apiURL  string
	socket  string
	peer    *APIPeer
	ws      Workspace
	taskARN string
}

// readClaimEnv reads and checks the workspace.Env* variables. Errors name
// the variable, never the code.
func readClaimEnv(getenv func(string) string) (claimEnv, error) {
	c := claimEnv{
		code:   strings.TrimSpace(getenv(workspace.EnvClaim)),
		apiURL: strings.TrimSpace(getenv(workspace.EnvAPIURL)),
		socket: strings.TrimSpace(getenv(workspace.EnvAPISocket)),
		ws:     Workspace(strings.TrimSpace(getenv(workspace.EnvWorkspace))),
	}
	if c.code == "" {
		return claimEnv{}, fmt.Errorf("%s is not set: claim mode needs the run's claim code (or use --workspace DIR)", workspace.EnvClaim)
	}
	u, err := url.Parse(c.apiURL)
	if c.apiURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return claimEnv{}, fmt.Errorf("%s %q is not an http(s) URL without query or fragment", workspace.EnvAPIURL, c.apiURL)
	}
	if u.Scheme == "http" && c.socket == "" && !isLoopbackHost(u.Hostname()) {
		return claimEnv{}, fmt.Errorf("%s %q is plain http to a remote host; use https, or %s", workspace.EnvAPIURL, c.apiURL, workspace.EnvAPISocket)
	}
	if uid := strings.TrimSpace(getenv(workspace.EnvAPIPeerUID)); uid != "" {
		n, err := strconv.Atoi(uid)
		if err != nil || n < 0 {
			return claimEnv{}, fmt.Errorf("%s %q is not a uid", workspace.EnvAPIPeerUID, uid)
		}
		c.peer = &APIPeer{UID: n}
	}
	if c.socket != "" && c.peer == nil {
		return claimEnv{}, fmt.Errorf("%s is set without %s: the entry checks who listens on the socket and needs that uid", workspace.EnvAPISocket, workspace.EnvAPIPeerUID)
	}
	if c.ws == "" {
		c.ws = workspace.DefaultClaimWorkspace
	}
	if !filepath.IsAbs(string(c.ws)) {
		return claimEnv{}, fmt.Errorf("%s %q is not an absolute path", workspace.EnvWorkspace, c.ws)
	}
	return c, nil
}

// claimMode exchanges the claim code for the run and runs it.
func (e *entry) claimMode(ctx context.Context, getenv func(string) string) error {
	start := e.now()
	// The settings are copied out first: Harden clears the environment
	// (the code with it), and nothing but this process has run yet that
	// could have read it.
	env, err := readClaimEnv(getenv)
	if err := Harden(); err != nil {
		return err
	}
	if err != nil {
		return err
	}
	if err := checkAncestors(string(env.ws)); err != nil {
		return err
	}
	if e.taskARN != nil {
		env.taskARN = e.taskARN(ctx)
	}
	api, err := NewAPIClient(env.socket, env.peer)
	if err != nil {
		return err
	}
	answer, err := e.claim(ctx, api, env)
	if err != nil {
		return err
	}
	spec := answer.Spec
	spec.APIBaseURL, spec.APISocket = env.apiURL, env.socket
	if env.peer != nil {
		uid := env.peer.UID
		spec.APIPeerUID = &uid
	}
	if err := checkSpec(spec); err != nil {
		return fmt.Errorf("claim answer: %w", err)
	}
	tokens := belay.SandboxTokens{Model: answer.Tokens.Model, Events: answer.Tokens.Events, Approvals: answer.Tokens.Approvals}
	if tokens.Model == "" || tokens.Events == "" || tokens.Approvals == "" {
		return errors.New("claim answer: a token is missing")
	}
	for _, name := range belay.ArtifactNames {
		if _, ok := answer.Outputs[name]; !ok {
			return fmt.Errorf("claim answer: no upload target for %s", name)
		}
	}
	if err := os.MkdirAll(string(env.ws), 0o700); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	e.log.Info("claimed the run", "run_id", spec.RunID, "attempt", spec.Attempt)
	if spec.Source != nil && answer.Source == nil {
		return errors.New("claim answer: the run has a git source but no download target for it")
	}
	return e.run(ctx, start, session{ws: env.ws, spec: spec, tokens: tokens, api: api, uploads: answer.Outputs, source: answer.Source})
}

// claim sends the code once; a transport failure or a 5xx is retried with
// the same code (a code the control plane consumed but whose answer was
// lost is refused the second time: the run then fails and, once
// checkpoints land, resumes with a new attempt). A refusal is final.
func (e *entry) claim(ctx context.Context, api *http.Client, env claimEnv) (wire.ClaimResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	route := apiRoute{client: api, base: env.apiURL}
	body := wire.ClaimRequest{Claim: env.code, TaskArn: env.taskARN}
	wait := uploadBackoff
	for attempt := 1; ; attempt++ {
		var answer wire.ClaimResponse
		err := route.do(ctx, http.MethodPost, route.url("internal", "v1", "claim"), body, &answer)
		if err == nil {
			return answer, nil
		}
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			return wire.ClaimResponse{}, fmt.Errorf("claim refused: the code is unknown, used or expired (%w)", err)
		}
		if !retryable(err) || attempt == uploadAttempts || !sleepCtx(ctx, wait) {
			return wire.ClaimResponse{}, fmt.Errorf("claim: %w", err)
		}
		e.log.Warn("claim failed; trying again", "attempt", attempt, "err", err)
		wait *= 2
	}
}
