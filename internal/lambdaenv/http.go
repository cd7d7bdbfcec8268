package lambdaenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/emf"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/upstream"
)

// HTTPParts are the adapters a function serving HTTP gives the shared
// handler. A function leaves out what its routes never use; the handler
// then gets a part that refuses everything (a signing key and a control
// token nobody knows, an orchestrator that starts nothing, no provider
// key), so a route reached by mistake fails closed.
type HTTPParts struct {
	Store belay.Store
	// Artifacts: the functions that read or write artifacts.
	Artifacts belay.ArtifactStore
	// Orchestrator: only api starts and stops runs.
	Orchestrator belay.Orchestrator
	// Signer verifies run tokens: the functions serving internal routes.
	Signer *token.Signer
	// PublicAuth authenticates the public routes: the functions serving
	// them (Env.PublicAuth, after EnvAuth).
	PublicAuth httpapi.Authenticator
	// Provider: only modelproxy calls the model provider (and holds its
	// key).
	Provider upstream.Provider
	// Presigner gives a claiming sandbox presigned S3 PUTs for its
	// outputs: sandboxapi.
	Presigner httpapi.OutputPresigner
	// Workspaces enables sessions (api and ws, with
	// gitsource.Workspaces); the other functions leave it nil and link no
	// git code.
	Workspaces belay.Workspaces
	// ReadSessions serves a session's event stream from the store alone,
	// writing nothing (httpapi.Config.ReadSessions): stream.
	ReadSessions bool
	// Git fetches git sources (POST /v1/runs and sessions with
	// source.git): api only, with gitsource and the git credentials
	// (lambdaenv/gitenv); the bundles go to Artifacts, which must keep
	// sources (belay.SourceStore).
	Git    belay.SourceFetcher
	Logger *slog.Logger
}

// placeholderUpstream is the upstream URL of a function without the model
// proxy; it is never called (its key source refuses first).
const placeholderUpstream = "https://modelproxy.invalid/chat/completions"

// HTTP builds the shared http.Handler for a function from parts and the
// environment (EnvModel; EnvModelAPIURL and EnvModelTimeoutSeconds for the
// model proxy; EnvSandboxEvents and EnvSandboxEventBytes for event append).
func (e *Env) HTTP(p HTTPParts) (*httpapi.Server, error) {
	// With the repository limits: api fetches git sources under them.
	limits, err := e.RepoLimits()
	if err != nil {
		return nil, err
	}
	if p.Artifacts == nil {
		p.Artifacts = refusingArtifacts{}
	}
	var sources belay.SourceStore
	if p.Git != nil {
		var ok bool
		if sources, ok = p.Artifacts.(belay.SourceStore); !ok {
			return nil, errors.New("lambdaenv: git sources need an artifact store that keeps them")
		}
	}
	if p.Orchestrator == nil {
		p.Orchestrator = refusingOrchestrator{}
	}
	if p.Signer == nil {
		if p.Signer, err = token.NewSigner(randomKey(), nil); err != nil {
			return nil, err
		}
	}
	var controlTokens []string
	if p.PublicAuth == nil {
		controlTokens = []string{hex.EncodeToString(randomKey())}
	}
	up := httpapi.Upstream{
		URL: placeholderUpstream,
		Key: func(context.Context) (string, error) { return "", ErrNoProvider },
	}
	if p.Provider != nil {
		up = httpapi.Upstream{Provider: p.Provider}
		if up.Timeout, err = e.Seconds(EnvModelTimeoutSeconds, httpapi.DefaultUpstreamTimeout); err != nil {
			return nil, err
		}
	}
	events := belay.DefaultSandboxEventLimits()
	if events.MaxEvents, err = e.Count(EnvSandboxEvents, events.MaxEvents); err != nil {
		return nil, err
	}
	maxBytes, err := e.Count(EnvSandboxEventBytes, int(events.MaxBytes))
	if err != nil {
		return nil, err
	}
	events.MaxBytes = int64(maxBytes)
	return httpapi.New(httpapi.Config{
		Store:         p.Store,
		Artifacts:     p.Artifacts,
		Orchestrator:  p.Orchestrator,
		Signer:        p.Signer,
		Limits:        limits,
		ControlTokens: controlTokens,
		PublicAuth:    p.PublicAuth,
		Upstream:      up,
		Logger:        p.Logger,
		Presigner:     p.Presigner,
		Workspaces:    p.Workspaces,
		ReadSessions:  p.ReadSessions,
		Git:           p.Git,
		Sources:       sources,

		SandboxEventLimits: events,
	})
}

// randomKey is a secret nobody holds: what a function that serves no
// internal (or no public) route verifies tokens against.
func randomKey() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return b
}

// refusingOrchestrator is the orchestrator of functions that start and stop
// no runs.
type refusingOrchestrator struct{}

func (refusingOrchestrator) Submit(context.Context, string) error {
	return belay.Errorf(belay.CodeUnavailable, "this function does not start runs")
}

func (refusingOrchestrator) Cancel(context.Context, string) error {
	return belay.Errorf(belay.CodeUnavailable, "this function does not cancel runs")
}

// Metrics returns the function's embedded-metric-format recorder on w.
func (e *Env) Metrics(w interface{ Write([]byte) (int, error) }) *emf.Recorder {
	return emf.New(w, e.Function, nil)
}

// ObserveHTTP counts the model proxy's and the claim route's outcomes as
// metrics (see internal/emf), from each answer's method, path and status.
func ObserveHTTP(rec *emf.Recorder) func(method, path string, status int) {
	return func(method, path string, status int) {
		switch {
		case method == "POST" && path == apigateway.ChatCompletionsPath:
			switch status {
			case 200:
				rec.Count(emf.ModelCalls, 1, "Outcome", "ok")
			case 502, 504:
				// The budget was spent; the upstream failed.
				rec.Count(emf.ModelCalls, 1, "Outcome", "upstream_error")
			case 429:
				rec.Count(emf.BudgetRefusals, 1, "", "")
			}
		case method == "POST" && path == ClaimPath && status == 401:
			rec.Count(emf.ClaimRefusals, 1, "", "")
		}
	}
}

// ClaimPath is the claim exchange's route.
const ClaimPath = "/internal/v1/claim"

// refusingArtifacts is the artifact store of functions that touch none.
type refusingArtifacts struct{}

func (refusingArtifacts) PutArtifact(context.Context, string, string, []byte) error {
	return belay.Errorf(belay.CodeUnavailable, "this function does not store artifacts")
}

func (refusingArtifacts) GetArtifact(context.Context, string, string) ([]byte, error) {
	return nil, belay.Errorf(belay.CodeUnavailable, "this function does not read artifacts")
}

func (refusingArtifacts) ListArtifacts(context.Context, string) ([]belay.ArtifactInfo, error) {
	return nil, belay.Errorf(belay.CodeUnavailable, "this function does not read artifacts")
}

func (refusingArtifacts) DeleteArtifact(context.Context, string, string) error {
	return belay.Errorf(belay.CodeUnavailable, "this function does not store artifacts")
}
