// Package publish writes a finished run's safe outputs: what the control
// plane, never the sandbox, writes back to the repository a run came from.
// The publisher Lambda does it on a run status rule on AWS; belay serve
// does it right after a run is finalized.
//
// For a completed run with a change, the validated patch (the run's
// patch.diff artifact, which the control plane checked against
// allowedPaths) is applied on the run's base commit as one commit and
// pushed, with the control plane's git credentials, as the new branch
// belay/<runId> (never any other branch: a run started by a push never
// pushes to that branch). On GitHub a pull request of that branch is opened
// and a comment says the outcome; a failed run's comment gives its reason.
// Each run is published at most once.
package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/github"
	"github.com/belay-dev/belay/internal/gitsource"
)

// Config is what a Publisher needs. Store, Artifacts, Sources and Git are
// required; without GitHub, no pull request or comment is made.
type Config struct {
	Store     belay.Store
	Artifacts belay.ArtifactStore
	Sources   belay.SourceStore
	Git       *gitsource.Client
	GitHub    *github.Client
	// Signature signs belay's commits; gitsource.DefaultSignature when
	// zero.
	Signature gitsource.Signature
	Logger    *slog.Logger
	Now       func() time.Time
}

// Publisher writes safe outputs.
type Publisher struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Publisher.
func New(cfg Config) (*Publisher, error) {
	if cfg.Store == nil || cfg.Artifacts == nil || cfg.Sources == nil || cfg.Git == nil {
		return nil, errors.New("publish: Config.Store, Artifacts, Sources and Git are required")
	}
	if cfg.Signature == (gitsource.Signature{}) {
		cfg.Signature = gitsource.DefaultSignature
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Result is what Publish wrote.
type Result struct {
	Skipped     string `json:"skipped,omitempty"`
	Branch      string `json:"branch,omitempty"`
	Commit      string `json:"commit,omitempty"`
	PullRequest int    `json:"pullRequest,omitempty"`
	Commented   bool   `json:"commented,omitempty"`
}

// publishProvider marks, in the delivery store, the runs whose outputs
// were written: each run is published at most once, whatever redelivers
// its status event.
const publishProvider = "belay-publish"

// Publish writes the safe outputs of the finished run runID. A run without
// a trigger, or not finished, is skipped; so is one already published.
// Errors from one output are logged and the rest still written; the first
// is returned.
func (p *Publisher) Publish(ctx context.Context, runID string) (Result, error) {
	run, err := p.cfg.Store.GetRun(ctx, runID)
	if err != nil {
		return Result{}, fmt.Errorf("publish %s: %w", runID, err)
	}
	t, src := run.Request.Trigger, run.Request.GitSource()
	switch {
	case t == nil || src == nil:
		return Result{Skipped: "the run was not started by a repository event"}, nil
	case !run.Status.Terminal():
		return Result{Skipped: "the run has not finished"}, nil
	}
	log := p.log.With("run_id", run.ID, "repository", t.Repository)
	_, first, err := p.cfg.Store.RecordDelivery(ctx, belay.Delivery{Provider: publishProvider, ID: run.ID, RunID: run.ID, ReceivedAt: p.now()})
	if err != nil {
		return Result{}, fmt.Errorf("publish %s: %w", runID, err)
	}
	if !first {
		log.Info("safe outputs already written")
		return Result{Skipped: "already published"}, nil
	}

	var res Result
	var errs []error
	patch, err := p.cfg.Artifacts.GetArtifact(ctx, run.ID, "patch.diff")
	if err != nil && !belay.IsCode(err, belay.CodeNotFound) {
		errs = append(errs, fmt.Errorf("read the patch: %w", err))
	}
	changed := run.Status == belay.StatusCompleted && len(bytes.TrimSpace(patch)) > 0
	if changed && t.Outputs.Branch {
		res.Branch = belay.BranchFor(run.ID)
		commit, err := p.pushBranch(ctx, run, src, patch, res.Branch)
		if err != nil {
			log.Error("push the run's branch", "branch", res.Branch, "err", err.Error())
			errs = append(errs, err)
			res.Branch = ""
		} else {
			res.Commit = commit
			log.Info("pushed the run's change", "branch", res.Branch, "commit", commit)
		}
	}
	gh := p.cfg.GitHub
	if t.Provider == belay.ProviderGitHub && gh != nil {
		if res.Branch != "" && t.Outputs.PullRequest {
			pr, err := p.openPullRequest(ctx, run, t, res.Branch)
			switch {
			case errors.Is(err, github.ErrPullRequestExists):
			case err != nil:
				log.Error("open a pull request", "err", err.Error())
				errs = append(errs, err)
			default:
				res.PullRequest = pr.Number
				log.Info("opened a pull request", "number", pr.Number)
			}
		}
		if t.Outputs.Comment {
			body := outcomeComment(run, res)
			var err error
			switch {
			case t.Issue > 0:
				err = gh.Comment(ctx, t.Repository, t.Issue, body)
			case t.Commit != "":
				err = gh.CommitComment(ctx, t.Repository, t.Commit, body)
			}
			if err != nil {
				log.Error("comment the outcome", "err", err.Error())
				errs = append(errs, err)
			} else {
				res.Commented = t.Issue > 0 || t.Commit != ""
			}
		}
	}
	return res, errors.Join(errs...)
}

// pushBranch commits the patch on the run's base (from the run's own
// bundle: exactly the commit the sandbox started from) and pushes it.
func (p *Publisher) pushBranch(ctx context.Context, run belay.Run, src *belay.GitSource, patch []byte, branch string) (string, error) {
	rc, _, err := p.cfg.Sources.OpenSource(ctx, run.ID)
	if err != nil {
		return "", fmt.Errorf("open the run's source: %w", err)
	}
	repo, tip, err := gitsource.LoadBundle(rc)
	rc.Close()
	if err != nil {
		return "", err
	}
	if tip.String() != src.Commit {
		return "", fmt.Errorf("the run's bundle is at %s, not its base %s", tip, src.Commit)
	}
	when := run.FinishedAt
	if when.IsZero() {
		when = p.now()
	}
	commit, err := gitsource.CommitPatch(repo, plumbing.NewHash(src.Commit), patch, commitMessage(run), p.cfg.Signature, when)
	if err != nil {
		return "", err
	}
	if err := p.cfg.Git.Push(ctx, repo, src.URL, commit, branch); err != nil {
		return "", err
	}
	return commit.String(), nil
}

func (p *Publisher) openPullRequest(ctx context.Context, run belay.Run, t *belay.Trigger, branch string) (github.PullRequest, error) {
	base := t.BaseBranch
	if base == "" && t.PullRequest && t.Issue > 0 {
		head, err := p.cfg.GitHub.PullRequestHead(ctx, t.Repository, t.Issue)
		if err != nil {
			return github.PullRequest{}, err
		}
		base = head
	}
	if base == "" {
		return github.PullRequest{}, errors.New("no branch to open the pull request into")
	}
	return p.cfg.GitHub.CreatePullRequest(ctx, t.Repository, branch, base, title(run), pullRequestBody(run, t))
}

// title is the first line of the instruction, short.
func title(run belay.Run) string {
	line, _, _ := strings.Cut(strings.TrimSpace(run.Request.Instruction), "\n")
	return "belay: " + clip(line, 72)
}

func commitMessage(run belay.Run) string {
	return title(run) + "\n\nRun " + run.ID + " of belay: the change the agent made, as the control plane validated it.\n"
}

func pullRequestBody(run belay.Run, t *belay.Trigger) string {
	var b strings.Builder
	fmt.Fprintf(&b, "belay run `%s`, started by a %s event", run.ID, t.Event)
	if t.URL != "" {
		fmt.Fprintf(&b, " (%s)", t.URL)
	}
	fmt.Fprintf(&b, ", on commit %s.\n\n", t.Commit)
	writeChanges(&b, run)
	return b.String()
}

// outcomeComment says how the run ended. Whatever came from the run (its
// reason, file names) is in code spans, so it cannot mention anyone or
// render as markup.
func outcomeComment(run belay.Run, res Result) string {
	var b strings.Builder
	switch run.Status {
	case belay.StatusCompleted:
		fmt.Fprintf(&b, "belay run `%s` completed.", run.ID)
		switch {
		case res.PullRequest > 0:
			fmt.Fprintf(&b, " Its change is in pull request #%d (branch `%s`).", res.PullRequest, res.Branch)
		case res.Branch != "":
			fmt.Fprintf(&b, " Its change is on branch `%s`.", res.Branch)
		case len(run.ChangedFiles) == 0:
			b.WriteString(" It changed nothing.")
		}
		b.WriteString("\n\n")
		writeChanges(&b, run)
	case belay.StatusCancelled:
		fmt.Fprintf(&b, "belay run `%s` was cancelled.", run.ID)
	default:
		fmt.Fprintf(&b, "belay run `%s` failed: %s.", run.ID, code(clip(run.Reason, 500)))
	}
	return b.String()
}

func writeChanges(b *strings.Builder, run belay.Run) {
	if len(run.ChangedFiles) > 0 {
		b.WriteString("Changed:")
		for i, f := range run.ChangedFiles {
			if i == 20 {
				fmt.Fprintf(b, " and %d more", len(run.ChangedFiles)-20)
				break
			}
			b.WriteString(" " + code(clip(f, 200)))
		}
		b.WriteString("\n")
	}
	for _, c := range run.Checks {
		fmt.Fprintf(b, "Check %s exited %d.\n", code(clip(strings.Join(c.Argv, " "), 200)), c.ExitCode)
	}
}

// code puts s in a code span, with backticks and line breaks taken out.
func code(s string) string {
	s = strings.NewReplacer("`", "'", "\n", " ", "\r", " ").Replace(s)
	if s == "" {
		s = "unknown"
	}
	return "`" + s + "`"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// HandleBusEvent is the publisher function's handler: a run status event
// from the bus. Runs that have not ended, or that no repository event
// started, are skipped.
func (p *Publisher) HandleBusEvent(ctx context.Context, ev belay.BusEvent) (Result, error) {
	if ev.Source != belay.RunStatusSource || ev.DetailType != belay.RunStatusDetailType {
		return Result{}, belay.Errorf(belay.CodeInvalid, "an event from %q of type %q is not a run status change", ev.Source, ev.DetailType)
	}
	st, err := belay.ParseRunStatusEvent(ev.Detail)
	if err != nil {
		return Result{}, err
	}
	if !st.Status.Terminal() || st.Trigger == nil {
		return Result{Skipped: "the run has not ended, or no repository event started it"}, nil
	}
	return p.Publish(ctx, st.RunID)
}
