// Package intake creates runs: the one path by which POST /v1/runs and the
// dispatcher of repository events turn a request into a stored, submitted
// run. It validates the request, fetches a git source (with the control
// plane's credentials, under the repository limits) and checks its
// allowedPaths against the fetched tree, stores the run, stores the
// source's bundle for the sandbox, and hands the run to the orchestrator.
// Nothing is stored for a request that is refused.
package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// Config is what a Service needs. Store, Orchestrator and NewID are
// required; Git and Sources together enable git sources.
type Config struct {
	Store        belay.Store
	Orchestrator belay.Orchestrator
	// Git fetches git sources; Sources keeps their bundles. Without both,
	// a request with a git source is refused.
	Git     belay.SourceFetcher
	Sources belay.SourceStore
	Limits  belay.Limits
	// NewID returns a fresh run id ("run_...").
	NewID  func() string
	Now    func() time.Time
	Logger *slog.Logger
}

// Service creates runs. It is safe for concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("intake: Config.Store is required")
	case cfg.Orchestrator == nil:
		return nil, errors.New("intake: Config.Orchestrator is required")
	case cfg.NewID == nil:
		return nil, errors.New("intake: Config.NewID is required")
	case (cfg.Git == nil) != (cfg.Sources == nil):
		return nil, errors.New("intake: Config.Git and Config.Sources go together")
	}
	s := &Service{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// TakesGitSources reports whether the service can fetch git sources.
func (s *Service) TakesGitSources() bool { return s.cfg.Git != nil }

// Limits are the operator's run limits the service validates with.
func (s *Service) Limits() belay.Limits { return s.cfg.Limits }

// Request is one run to create.
type Request struct {
	// Run is the request; it is validated (belay.Limits.Validate) here.
	Run belay.RunRequest
	// RunID is the id the run gets; empty for a fresh one. The dispatcher
	// uses the id the webhook already answered the host with.
	RunID string
	// IdempotencyKey, when set, makes a repeat return the first run.
	IdempotencyKey string
	// GitURLs overrides the limits' policy for this request's source URL:
	// the operator's triggers file may name file:// mirrors, a caller of
	// the API may not.
	GitURLs *belay.GitURLPolicy
}

// Create validates, fetches and stores the run, and submits it. It returns
// the stored run and whether this call created it (false for a repeated
// idempotency key, or a run id that exists with the same request).
//
// Errors are the validation's (invalid, too_large), the fetch's (invalid
// for a repository, ref or commit that is not there, too_large past the
// repository limits, unavailable), the store's (conflict for a key used
// with another request, or a run id that exists), and unavailable when the
// run was stored but could not be started (it is then failed, not left
// queued).
func (s *Service) Create(ctx context.Context, r Request) (belay.Run, bool, error) {
	lim := s.cfg.Limits
	if r.GitURLs != nil {
		lim.GitURLs = *r.GitURLs
	}
	req, err := lim.Validate(r.Run)
	if err != nil {
		return belay.Run{}, false, err
	}
	// The hash is of the request as asked, before the fetch resolves it,
	// so a retry with the same key is the same request even if the branch
	// moved meanwhile.
	hash := belay.RequestHash(req)
	id := r.RunID
	if id == "" {
		id = s.cfg.NewID()
	}
	log := s.log.With("run_id", id)

	var fetched *belay.FetchedSource
	if g := req.GitSource(); g != nil {
		if s.cfg.Git == nil {
			return belay.Run{}, false, belay.FieldErrorf(belay.CodeInvalid, "source",
				"this control plane does not fetch git sources; upload files instead")
		}
		fetched, err = s.cfg.Git.FetchSource(ctx, *g, s.cfg.Limits)
		if err != nil {
			return belay.Run{}, false, err
		}
		defer fetched.Data.Close()
		if err := belay.CheckAllowedPathsInTree(req.AllowedPaths, fetched.Paths); err != nil {
			return belay.Run{}, false, fmt.Errorf("in commit %s: %w", fetched.Commit, err)
		}
		resolved := *g
		resolved.Commit = fetched.Commit
		if resolved.Ref == "" {
			resolved.Ref = fetched.Ref
		}
		tree, bundle := fetched.Tree, fetched.Bundle
		resolved.Tree, resolved.Bundle = &tree, &bundle
		req.Source = &belay.Source{Git: &resolved}
		if req.Trigger != nil && req.Trigger.Commit == "" {
			t := *req.Trigger
			t.Commit = fetched.Commit
			req.Trigger = &t
		}
	}

	now := s.now()
	run := belay.Run{
		ID:          id,
		Status:      belay.StatusQueued,
		Request:     req,
		RequestHash: hash,
		CreatedAt:   now,
		UpdatedAt:   now,
		Usage:       belay.Usage{MaxRequests: req.MaxRequests()},
	}
	stored, created, err := s.cfg.Store.CreateRun(ctx, run, r.IdempotencyKey)
	if err != nil {
		return belay.Run{}, false, err
	}
	if !created {
		return stored, false, nil
	}
	// The run is stored: finish starting it even if the caller hangs up.
	ctx = context.WithoutCancel(ctx)
	if fetched != nil {
		if err := s.storeBundle(ctx, id, fetched); err != nil {
			log.Error("store source bundle", "err", err.Error())
			s.fail(ctx, log, id, "the source could not be stored for the sandbox")
			return belay.Run{}, false, belay.Errorf(belay.CodeUnavailable, "could not store the fetched source; try again")
		}
	}
	if err := s.cfg.Orchestrator.Submit(ctx, id); err != nil {
		log.Error("submit run", "err", err.Error())
		s.fail(ctx, log, id, "the orchestrator did not accept the run")
		return belay.Run{}, false, belay.Errorf(belay.CodeUnavailable, "could not start the run; try again")
	}
	if g := req.GitSource(); g != nil {
		log.Info("run created from a git source", "url", g.URL, "commit", g.Commit, "files", g.Tree.Files)
	}
	return stored, true, nil
}

// storeBundle copies the fetched bundle into the source store and checks
// it arrived whole.
func (s *Service) storeBundle(ctx context.Context, runID string, f *belay.FetchedSource) error {
	rc, err := f.Data.OpenBundle()
	if err != nil {
		return err
	}
	defer rc.Close()
	got, err := s.cfg.Sources.PutSource(ctx, runID, rc, belay.RepoMaxBytes(s.cfg.Limits))
	if err != nil {
		return err
	}
	if got != f.Bundle {
		return fmt.Errorf("the stored bundle (%d bytes, %s) is not the fetched one (%d bytes, %s)", got.Size, got.SHA256, f.Bundle.Size, f.Bundle.SHA256)
	}
	return nil
}

// CreateFailed stores a run that cannot start (its source could not be
// fetched, say) as failed with reason, so the id a webhook already answered
// with names a run that says why. The request is validated as Create
// validates it, without fetching. Returns conflict if the id exists.
func (s *Service) CreateFailed(ctx context.Context, runID string, r belay.RunRequest, gitURLs *belay.GitURLPolicy, reason string) (belay.Run, error) {
	lim := s.cfg.Limits
	if gitURLs != nil {
		lim.GitURLs = *gitURLs
	}
	req, err := lim.Validate(r)
	if err != nil {
		return belay.Run{}, err
	}
	now := s.now()
	run := belay.Run{ID: runID, Status: belay.StatusQueued, Request: req, RequestHash: belay.RequestHash(req),
		CreatedAt: now, UpdatedAt: now, Usage: belay.Usage{MaxRequests: req.MaxRequests()}}
	if _, _, err := s.cfg.Store.CreateRun(ctx, run, ""); err != nil {
		return belay.Run{}, err
	}
	log := s.log.With("run_id", runID)
	return s.fail(context.WithoutCancel(ctx), log, runID, reason), nil
}

// fail ends a stored run that will not start, so it does not sit queued
// forever with nothing to drive it.
func (s *Service) fail(ctx context.Context, log *slog.Logger, id, reason string) belay.Run {
	now := s.now()
	data, _ := json.Marshal(struct {
		Reason string `json:"reason"`
	}{reason})
	run, err := s.cfg.Store.Transition(ctx, id, belay.Transition{
		To: belay.StatusFailed, At: now, Reason: reason,
		Events: []belay.EventInput{{Time: now, Type: belay.EventRunFailed, Data: data}},
	})
	if err != nil && !belay.IsCode(err, belay.CodeConflict) {
		log.Error("fail run", "err", err.Error())
	}
	return run
}
