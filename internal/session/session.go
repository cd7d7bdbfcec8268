// Package session runs multi-turn sessions (DESIGN.md "Sessions
// (multi-turn)") on top of runs: each message starts a turn, which is a run
// created through intake like any other (same validation, budget,
// approvals, sandbox and events), started from the workspace as the
// earlier turns left it and with their conversation, compacted
// (belay.CompactConversation), in the agent's context.
//
// The workspace is rebuilt in memory for each turn (belay.Workspaces;
// internal/gitsource implements it with go-git):
// the session's base (the uploaded tree, or the commit the first turn
// fetched) with each completed turn's validated patch committed on top, in
// order. A turn's change is kept when its run ended with a validated
// patch (also when its checks failed: the person sees the change and says
// what next); a turn cancelled or lost before that leaves the workspace as
// it was.
// The next turn of an uploaded tree gets the head's files; the next turn of
// a git source gets a bundle whose commit is the head, so its sandbox's
// base is the head and its patch only its own change. The session's patch
// (Patch) is the diff from the base to the head: the sum of the turns.
//
// A session's state follows its runs: whoever reads or changes a session
// first records the end of a turn whose run has ended (Refresh), so the
// same code serves the embedded control plane and the Lambda functions,
// with no hook in the orchestrators.
package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/intake"
)

// Config is what a Service needs. Store, Artifacts, Workspaces, Intake,
// Cancel and NewID are required; Sources enables git sources.
type Config struct {
	Store     belay.Store
	Artifacts belay.ArtifactStore
	// Workspaces builds each turn's workspace.
	Workspaces belay.Workspaces
	// Sources keeps runs' git source bundles: the first turn's fetched
	// one, and those the service builds for later turns.
	Sources belay.SourceStore
	Intake  *intake.Service
	// Cancel is the cancel sequence of a run (record, revoke, stop), the
	// same the cancel route runs. conflict for a terminal run is fine.
	Cancel func(ctx context.Context, runID string) error
	// NewID returns a fresh id with the prefix ("ses_", "run_").
	NewID  func(prefix string) string
	Now    func() time.Time
	Logger *slog.Logger
}

// Service creates sessions and runs their turns. It is safe for
// concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil, cfg.Artifacts == nil, cfg.Workspaces == nil, cfg.Intake == nil, cfg.Cancel == nil, cfg.NewID == nil:
		return nil, errors.New("session: Config.Store, Artifacts, Workspaces, Intake, Cancel and NewID are required")
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

// Create stores a new idle session for req (already validated:
// belay.ParseSessionRequest). A git source is refused when the control
// plane fetches none.
func (s *Service) Create(ctx context.Context, req belay.SessionRequest) (belay.Session, error) {
	if req.Source != nil && (s.cfg.Sources == nil || !s.cfg.Intake.TakesGitSources()) {
		return belay.Session{}, belay.FieldErrorf(belay.CodeInvalid, "source.git", "this control plane does not fetch git sources; upload files instead")
	}
	now := s.now().UTC()
	sess := belay.Session{ID: s.cfg.NewID("ses_"), Status: belay.SessionIdle, Request: req, CreatedAt: now, UpdatedAt: now}
	if err := s.cfg.Store.CreateSession(ctx, sess); err != nil {
		return belay.Session{}, err
	}
	s.log.Info("session created", "session_id", sess.ID, "git", req.Source != nil, "skills", len(req.Skills))
	return sess, nil
}

// Get returns the session, with the end of a turn whose run has ended
// recorded first (Refresh). Returns not_found.
func (s *Service) Get(ctx context.Context, id string) (belay.Session, error) {
	sess, err := s.cfg.Store.GetSession(ctx, id)
	if err != nil {
		return belay.Session{}, err
	}
	return s.Refresh(ctx, sess)
}

// Refresh records the end of sess's last turn when its run has ended, and
// otherwise shows the run's live status (queued or running) on the turn.
func (s *Service) Refresh(ctx context.Context, sess belay.Session) (belay.Session, error) {
	last := sess.LastTurn()
	if last == nil || last.Status.Terminal() {
		return sess, nil
	}
	run, err := s.cfg.Store.GetRun(ctx, last.RunID)
	switch {
	case belay.IsCode(err, belay.CodeNotFound) && s.now().Sub(last.CreatedAt) < runCreateGrace:
		// Send records the turn, then creates its run (after a fetch,
		// for a git source): until then the turn is queued.
		return sess, nil
	case belay.IsCode(err, belay.CodeNotFound):
		// The turn was recorded but its run never stored (the service
		// stopped between the two): it ends failed.
		out, err := s.cfg.Store.FinishTurn(ctx, sess.ID, belay.TurnEnd{Turn: last.Turn, Status: belay.StatusFailed,
			At: s.now().UTC(), Reason: "the turn's run was never created"})
		if belay.IsCode(err, belay.CodeConflict) {
			return s.cfg.Store.GetSession(ctx, sess.ID)
		}
		return out, err
	case err != nil:
		return belay.Session{}, err
	case !run.Status.Terminal():
		sess.Turns[len(sess.Turns)-1].Status = run.Status
		return sess, nil
	}
	end := belay.TurnEnd{Turn: last.Turn, Status: run.Status, At: run.FinishedAt, Reason: run.Reason,
		ChangedFiles: run.ChangedFiles, Usage: run.Usage}
	if end.At.IsZero() {
		end.At = run.UpdatedAt
	}
	if raw, err := s.cfg.Artifacts.GetArtifact(ctx, run.ID, "result.json"); err == nil {
		var res struct {
			Summary string `json:"summary"`
		}
		if json.Unmarshal(raw, &res) == nil {
			end.Summary = res.Summary
		}
	} else if !belay.IsCode(err, belay.CodeNotFound) {
		return belay.Session{}, fmt.Errorf("read the result of turn %d: %w", last.Turn, err)
	}
	out, err := s.cfg.Store.FinishTurn(ctx, sess.ID, end)
	if belay.IsCode(err, belay.CodeConflict) {
		// Another reader recorded the end and the next turn started
		// since sess was read: what is stored now is the answer.
		return s.cfg.Store.GetSession(ctx, sess.ID)
	}
	if err != nil {
		return belay.Session{}, err
	}
	s.log.Info("session turn ended", "session_id", sess.ID, "run_id", run.ID, "turn", last.Turn, "status", run.Status)
	return out, nil
}

// runCreateGrace is how long after its turn was recorded a turn's run may
// still be missing (Send creates it right after, a git source's fetch
// first) before the turn counts as one whose run was never created.
const runCreateGrace = 10 * time.Minute

// Send starts the session's next turn with text: a run from the workspace
// as the earlier turns left it, with their conversation. Returns the turn
// (queued, with its run id). Returns not_found; conflict while a turn runs
// or when the session is closed; the run request's errors (invalid text,
// a git source that cannot be fetched); unavailable when the run could not
// be started.
func (s *Service) Send(ctx context.Context, id, text string) (belay.Turn, error) {
	sess, err := s.Get(ctx, id)
	if err != nil {
		return belay.Turn{}, err
	}
	n := len(sess.Turns) + 1
	// The early check gives the caller the store's answer without
	// building a workspace for nothing; StartTurn decides for good.
	if _, err := sess.StartTurn(belay.Turn{Turn: n, RunID: "run_check", CreatedAt: s.now()}); err != nil {
		return belay.Turn{}, err
	}
	tc := belay.TurnContext{SessionID: sess.ID, Turn: n, Conversation: belay.CompactConversation(sess.Turns), Skills: sess.Request.Skills}
	req := sess.Request.TurnRequest(text, tc)
	var prepared *intake.PreparedSource
	ws, err := s.workspace(ctx, sess)
	if err != nil {
		return belay.Turn{}, err
	}
	if ws != nil && ws.Changed() && sess.Request.Source == nil {
		if req.Files, err = ws.Files(); err != nil {
			return belay.Turn{}, fmt.Errorf("session %s: files of the workspace: %w", id, err)
		}
	}
	if ws != nil && sess.Request.Source != nil {
		if prepared, err = s.prepare(sess, ws); err != nil {
			return belay.Turn{}, err
		}
	}
	// Validate before the turn is recorded, so a bad text records nothing.
	if _, err := s.cfg.Intake.Limits().Validate(req); err != nil {
		return belay.Turn{}, err
	}
	turn := belay.Turn{Turn: n, RunID: s.cfg.NewID("run_"), Status: belay.StatusQueued, Text: text, CreatedAt: s.now().UTC()}
	if _, err := s.cfg.Store.StartTurn(ctx, id, turn); err != nil {
		return belay.Turn{}, err
	}
	log := s.log.With("run_id", turn.RunID, "session_id", id, "turn", n)
	// The turn is recorded: create its run even if the caller hangs up.
	ctx = context.WithoutCancel(ctx)
	if _, _, err := s.cfg.Intake.Create(ctx, intake.Request{Run: req, RunID: turn.RunID, Prepared: prepared}); err != nil {
		reason := "the turn's run could not be created: " + belay.ErrorMessage(err)
		if _, ferr := s.cfg.Intake.CreateFailed(ctx, turn.RunID, req, nil, reason); ferr != nil && !belay.IsCode(ferr, belay.CodeConflict) {
			log.Error("store the failed turn's run", "err", ferr.Error())
		}
		if _, ferr := s.cfg.Store.FinishTurn(ctx, id, belay.TurnEnd{Turn: n, Status: belay.StatusFailed, At: s.now().UTC(), Reason: reason}); ferr != nil {
			log.Error("record the failed turn", "err", ferr.Error())
		}
		return belay.Turn{}, err
	}
	log.Info("session turn started", "conversation_messages", len(tc.Conversation))
	return turn, nil
}

// Stop cancels the running turn, if any. Returns not_found.
func (s *Service) Stop(ctx context.Context, id string) (belay.Session, error) {
	sess, err := s.Get(ctx, id)
	if err != nil {
		return belay.Session{}, err
	}
	if last := sess.LastTurn(); last != nil && !last.Status.Terminal() {
		if err := s.cfg.Cancel(ctx, last.RunID); err != nil && !belay.IsCode(err, belay.CodeConflict) {
			return belay.Session{}, err
		}
	}
	return sess, nil
}

// Close closes the session and stops its running turn. Closing a closed
// session changes nothing. Returns not_found.
func (s *Service) Close(ctx context.Context, id string) (belay.Session, error) {
	sess, err := s.cfg.Store.CloseSession(ctx, id, s.now().UTC())
	if err != nil {
		return belay.Session{}, err
	}
	if last := sess.LastTurn(); last != nil && !last.Status.Terminal() {
		if err := s.cfg.Cancel(ctx, last.RunID); err != nil && !belay.IsCode(err, belay.CodeConflict) {
			return belay.Session{}, err
		}
	}
	return s.Refresh(ctx, sess)
}

// Patch returns the session's change so far: the diff from its base to
// the workspace after its last completed turn (empty before any).
func (s *Service) Patch(ctx context.Context, id string) ([]byte, error) {
	sess, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	ws, err := s.workspace(ctx, sess)
	if err != nil || ws == nil {
		return nil, err
	}
	return ws.Diff()
}

// workspace builds the session's workspace; nil for a git source none of
// whose turns has fetched it yet.
func (s *Service) workspace(ctx context.Context, sess belay.Session) (belay.Workspace, error) {
	var ws belay.Workspace
	from := 0 // the turn whose run's bundle is the base (git sources)
	var err error
	if sess.Request.Source == nil {
		if ws, err = s.cfg.Workspaces.FromFiles(sess.Request.Files, sess.CreatedAt); err != nil {
			return nil, fmt.Errorf("session %s: %w", sess.ID, err)
		}
	} else {
		// The base is the commit the first turn that fetched fetched.
		for _, t := range sess.Turns {
			run, err := s.cfg.Store.GetRun(ctx, t.RunID)
			if belay.IsCode(err, belay.CodeNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			g := run.Request.GitSource()
			if g == nil || g.Bundle == nil || !belay.IsObjectName(g.Commit) {
				continue
			}
			rc, _, err := s.cfg.Sources.OpenSource(ctx, run.ID)
			if belay.IsCode(err, belay.CodeNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			ws, err = s.cfg.Workspaces.FromBundle(rc)
			rc.Close()
			if err != nil {
				return nil, fmt.Errorf("session %s: the source of turn %d: %w", sess.ID, t.Turn, err)
			}
			from = t.Turn
			break
		}
		if ws == nil {
			return nil, nil
		}
	}
	for _, t := range sess.Turns {
		if !t.Status.Terminal() || t.Turn < from {
			continue
		}
		patch, err := s.cfg.Artifacts.GetArtifact(ctx, t.RunID, "patch.diff")
		if belay.IsCode(err, belay.CodeNotFound) || (err == nil && len(bytes.TrimSpace(patch)) == 0) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("session %s: the patch of turn %d: %w", sess.ID, t.Turn, err)
		}
		if err := ws.Apply(patch, fmt.Sprintf("belay: session %s turn %d\n", sess.ID, t.Turn), t.FinishedAt); err != nil {
			return nil, fmt.Errorf("session %s: apply the patch of turn %d: %w", sess.ID, t.Turn, err)
		}
	}
	return ws, nil
}

// prepare makes the git source of a turn that continues from the
// workspace's head: its bundle (the head with its whole history), which
// intake stores for the new run.
func (s *Service) prepare(sess belay.Session, ws belay.Workspace) (*intake.PreparedSource, error) {
	data, commit, tree, bundle, paths, err := ws.Bundle(belay.RepoMaxBytes(s.cfg.Intake.Limits()))
	if err != nil {
		return nil, err
	}
	g := *sess.Request.Source.Git
	g.Commit, g.Tree, g.Bundle = commit, &tree, &bundle
	return &intake.PreparedSource{Git: g, Paths: paths, Open: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}}, nil
}
