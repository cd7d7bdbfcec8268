// Package triggers reads the operator's triggers file (BELAY_TRIGGERS): which
// repositories may start runs from their events, on which events, and with
// what limits and outputs. Match decides whether a normalized repository
// event starts a run, and says why not when it does not; Render turns a
// matching event into the run request the dispatcher creates. Nothing here
// talks to a network: the webhook and the dispatcher both call it.
package triggers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"

	"github.com/belay-dev/belay/internal/belay"
)

// Config is the parsed triggers file.
type Config struct {
	Repositories []Repository `json:"repositories"`
}

// Repository is one repository's triggers.
type Repository struct {
	// Provider is "github" (the default) or "codecommit".
	Provider string `json:"provider,omitempty"`
	// Repository is "owner/name" on GitHub, the repository's name on
	// CodeCommit.
	Repository string `json:"repository"`
	// CloneURL is where the control plane fetches from; empty means the
	// event's own. It may name a mirror: any URL git fetches, file://
	// included.
	CloneURL        string               `json:"cloneUrl,omitempty"`
	On              On                   `json:"on"`
	AllowedPaths    []string             `json:"allowedPaths"`
	Checks          [][]string           `json:"checks"`
	MaxSteps        int                  `json:"maxSteps,omitempty"`
	WallTimeSeconds int                  `json:"wallTimeSeconds,omitempty"`
	Approval        belay.ApprovalConfig `json:"approval,omitzero"`
	// Outputs are the safe outputs; absent means all of them.
	Outputs *belay.TriggerOutputs `json:"outputs,omitempty"`
}

// On lists the events that start runs, each with its own conditions.
type On struct {
	IssueComment *IssueCommentOn `json:"issue_comment,omitempty"`
	Issues       *IssuesOn       `json:"issues,omitempty"`
	PullRequest  *PullRequestOn  `json:"pull_request,omitempty"`
	Push         *PushOn         `json:"push,omitempty"`
}

// IssueCommentOn starts a run from a new comment that begins with Command
// ("/belay"); the rest of the comment is the instruction.
type IssueCommentOn struct {
	Command string `json:"command"`
}

// IssuesOn starts a run when an issue gets one of Labels; the issue's
// title and body are the instruction.
type IssuesOn struct {
	Labels []string `json:"labels"`
}

// PullRequestOn starts a run when a pull request has one of Actions
// ("opened", "synchronize", ...), on its head commit, with Instruction.
type PullRequestOn struct {
	Actions     []string `json:"actions"`
	Instruction string   `json:"instruction"`
}

// PushOn starts a run when one of Branches gets a push, on the pushed
// commit, with Instruction. The run never pushes to that branch: its
// change goes to belay/<runId>.
type PushOn struct {
	Branches    []string `json:"branches"`
	Instruction string   `json:"instruction"`
}

// WriteAssociations are the GitHub author associations whose comments (and
// pull requests) may start runs: people with write access.
var WriteAssociations = []string{"OWNER", "MEMBER", "COLLABORATOR"}

// pullRequestActions are the pull request actions a trigger may name.
var pullRequestActions = []string{"opened", "synchronize", "reopened", "ready_for_review", "edited", "labeled"}

// OperatorGitURLs is what a triggers file's clone URLs (and events' own)
// may be: the operator wrote them, so file:// mirrors and loopback http are
// allowed.
var OperatorGitURLs = belay.GitURLPolicy{AllowFile: true, AllowLoopbackHTTP: true}

// MaxFileBytes bounds a triggers file.
const MaxFileBytes = 1 << 20

// Parse reads a triggers file strictly (unknown fields refused) and checks
// every entry against lim, the operator's run limits, so a mistake stops
// belay at start with a message naming the entry and field, not at the
// first event.
func Parse(r io.Reader, lim belay.Limits) (*Config, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("triggers: the file is larger than %d bytes", MaxFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("triggers: not a triggers file: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("triggers: data after the JSON object")
	}
	if len(c.Repositories) == 0 {
		return nil, errors.New(`triggers: "repositories" is empty: list the repositories that may start runs`)
	}
	seen := map[string]int{}
	for i := range c.Repositories {
		r := &c.Repositories[i]
		if r.Provider == "" {
			r.Provider = belay.ProviderGitHub
		}
		if r.Outputs == nil {
			r.Outputs = &belay.TriggerOutputs{Branch: true, PullRequest: true, Comment: true}
		}
		if err := r.check(lim); err != nil {
			return nil, fmt.Errorf("triggers: repositories[%d] (%s): %w", i, r.Repository, err)
		}
		key := r.Provider + "/" + strings.ToLower(r.Repository)
		if j, ok := seen[key]; ok {
			return nil, fmt.Errorf("triggers: repositories[%d]: %s is already repositories[%d]", i, r.Repository, j)
		}
		seen[key] = i
	}
	return &c, nil
}

func (r *Repository) check(lim belay.Limits) error {
	switch {
	case r.Provider != belay.ProviderGitHub && r.Provider != belay.ProviderCodeCommit:
		return fmt.Errorf("provider %q is neither %q nor %q", r.Provider, belay.ProviderGitHub, belay.ProviderCodeCommit)
	case r.Repository == "" || strings.ContainsFunc(r.Repository, unicode.IsSpace):
		return errors.New(`"repository" must name the repository ("owner/name" on GitHub)`)
	case r.Provider == belay.ProviderGitHub && strings.Count(r.Repository, "/") != 1:
		return fmt.Errorf(`"repository" %q must be "owner/name"`, r.Repository)
	}
	if r.CloneURL != "" {
		if err := belay.CheckGitURL(r.CloneURL, OperatorGitURLs); err != nil {
			msg := err.Error()
			if e, ok := errors.AsType[*belay.Error](err); ok {
				msg = e.Message
			}
			return fmt.Errorf("cloneUrl: %s", msg)
		}
	}
	on := r.On
	if on.IssueComment == nil && on.Issues == nil && on.PullRequest == nil && on.Push == nil {
		return errors.New(`"on" names no event; use issue_comment, issues, pull_request or push`)
	}
	if c := on.IssueComment; c != nil {
		if !strings.HasPrefix(c.Command, "/") || len(c.Command) < 2 || strings.ContainsFunc(c.Command, unicode.IsSpace) {
			return fmt.Errorf(`on.issue_comment.command %q must be one word starting with "/", such as "/belay"`, c.Command)
		}
	}
	if i := on.Issues; i != nil {
		if len(i.Labels) == 0 || slices.Contains(i.Labels, "") {
			return errors.New("on.issues.labels must list the labels that start a run")
		}
	}
	if p := on.PullRequest; p != nil {
		if len(p.Actions) == 0 {
			return fmt.Errorf("on.pull_request.actions must list actions from %v", pullRequestActions)
		}
		for _, a := range p.Actions {
			if !slices.Contains(pullRequestActions, a) {
				return fmt.Errorf("on.pull_request.actions: %q is not one of %v", a, pullRequestActions)
			}
		}
		if strings.TrimSpace(p.Instruction) == "" {
			return errors.New("on.pull_request.instruction is required: say what the agent should do with the pull request")
		}
	}
	if p := on.Push; p != nil {
		if len(p.Branches) == 0 {
			return errors.New("on.push.branches must list the branches whose pushes start a run")
		}
		for _, b := range p.Branches {
			if err := belay.CheckGitRef(b); err != nil || b == "" || strings.HasPrefix(b, "refs/") || strings.HasPrefix(b, "belay/") {
				return fmt.Errorf("on.push.branches: %q must be a branch name (not refs/..., not belay/...)", b)
			}
		}
		if strings.TrimSpace(p.Instruction) == "" {
			return errors.New("on.push.instruction is required: say what the agent should do after a push")
		}
	}
	// The rest is what any run request holds: check it the same way.
	probe := r.request("check the trigger", belay.GitSource{URL: "https://example.invalid/probe.git"})
	if _, err := lim.Validate(probe); err != nil {
		return err
	}
	return nil
}

// request is the run request of this repository's runs.
func (r *Repository) request(instruction string, src belay.GitSource) belay.RunRequest {
	return belay.RunRequest{
		Instruction:     instruction,
		Source:          &belay.Source{Git: &src},
		AllowedPaths:    slices.Clone(r.AllowedPaths),
		Checks:          slices.Clone(r.Checks),
		MaxSteps:        r.MaxSteps,
		WallTimeSeconds: r.WallTimeSeconds,
		Approval:        r.Approval,
	}
}

// Lookup returns the entry of provider's repository, or nil. GitHub's
// names are compared without regard to case, as GitHub does.
func (c *Config) Lookup(provider, repository string) *Repository {
	if c == nil {
		return nil
	}
	for i := range c.Repositories {
		r := &c.Repositories[i]
		if r.Provider == provider && (r.Repository == repository || provider == belay.ProviderGitHub && strings.EqualFold(r.Repository, repository)) {
			return r
		}
	}
	return nil
}

// Match returns the entry whose triggers ev meets, or nil and the reason it
// starts nothing (for the webhook's answer and the log).
func (c *Config) Match(ev belay.RepoEvent) (*Repository, string) {
	r := c.Lookup(ev.Provider, ev.Repository)
	if r == nil {
		return nil, fmt.Sprintf("repository %s is not in the triggers file", ev.Repository)
	}
	noEvent := fmt.Sprintf("the triggers file starts no runs on %s events of %s", ev.Event, ev.Repository)
	switch ev.Event {
	case belay.RepoEventIssueComment:
		on := r.On.IssueComment
		switch {
		case on == nil:
			return nil, noEvent
		case ev.Action != "created":
			return nil, fmt.Sprintf("the comment was %s; only new comments start runs", ev.Action)
		}
		rest, ok := commandText(ev.Comment.Body, on.Command)
		switch {
		case !ok:
			return nil, fmt.Sprintf("the comment does not start with %s", on.Command)
		case !slices.Contains(WriteAssociations, ev.Association):
			return nil, fmt.Sprintf("%s's association with %s is %s; only OWNER, MEMBER or COLLABORATOR comments start runs",
				ev.Actor, ev.Repository, orNone(ev.Association))
		case rest == "":
			return nil, fmt.Sprintf("%s has no instruction after it; write %s <what to do>", on.Command, on.Command)
		}
	case belay.RepoEventIssues:
		on := r.On.Issues
		switch {
		case on == nil:
			return nil, noEvent
		case ev.Action != "labeled":
			return nil, fmt.Sprintf("the issue was %s; issues start runs when labeled", ev.Action)
		case !slices.Contains(on.Labels, ev.Label):
			return nil, fmt.Sprintf("label %q is not one of %v", ev.Label, on.Labels)
		}
	case belay.RepoEventPullRequest:
		on := r.On.PullRequest
		switch {
		case on == nil:
			return nil, noEvent
		case !slices.Contains(on.Actions, ev.Action):
			return nil, fmt.Sprintf("pull request action %s is not one of %v", ev.Action, on.Actions)
		case strings.HasPrefix(ev.PullRequest.HeadRef, "belay/"):
			return nil, "the pull request is belay's own (its head is a belay/ branch)"
		case !slices.Contains(WriteAssociations, ev.Association):
			return nil, fmt.Sprintf("%s's association with %s is %s; only OWNER, MEMBER or COLLABORATOR pull requests start runs",
				ev.Actor, ev.Repository, orNone(ev.Association))
		}
	case belay.RepoEventPush:
		on := r.On.Push
		branch, isBranch := strings.CutPrefix(ev.Ref, "refs/heads/")
		switch {
		case on == nil:
			return nil, noEvent
		case !isBranch:
			return nil, fmt.Sprintf("%s is not a branch", ev.Ref)
		case strings.HasPrefix(branch, "belay/"):
			return nil, "the push is to a belay/ branch: belay's own output"
		case !slices.Contains(on.Branches, branch):
			return nil, fmt.Sprintf("branch %s is not one of %v", branch, on.Branches)
		}
	default:
		return nil, fmt.Sprintf("belay does not act on %s events", ev.Event)
	}
	return r, ""
}

func orNone(s string) string {
	if s == "" {
		return "NONE"
	}
	return s
}

// commandText reports whether body starts with command (after leading
// white space) as a word of its own, and returns the text after it,
// trimmed.
func commandText(body, command string) (string, bool) {
	body = strings.TrimLeftFunc(body, unicode.IsSpace)
	rest, ok := strings.CutPrefix(body, command)
	if !ok || (rest != "" && !unicode.IsSpace(rune(rest[0]))) {
		return "", false
	}
	return strings.TrimSpace(rest), true
}

// Render is the run request of an event Match matched with r: the
// instruction (the comment after the command; the issue's title and body;
// or the trigger's text), the source (r's clone URL or the event's, at the
// event's commit or ref), r's limits, and the trigger record the run keeps.
func Render(ev belay.RepoEvent, r *Repository) belay.RunRequest {
	var instruction string
	src := belay.GitSource{URL: ev.CloneURL, Commit: ev.Commit}
	if r.CloneURL != "" {
		src.URL = r.CloneURL
	}
	t := &belay.Trigger{
		Provider: ev.Provider, Event: ev.Event, Action: ev.Action, Delivery: ev.Delivery,
		Repository: ev.Repository, Commit: ev.Commit, Ref: ev.Ref, Actor: ev.Actor, URL: ev.URL,
		Outputs: *r.Outputs,
	}
	defaultBranch := ev.DefaultBranch
	switch ev.Event {
	case belay.RepoEventIssueComment:
		instruction, _ = commandText(ev.Comment.Body, r.On.IssueComment.Command)
		t.Issue, t.PullRequest = ev.Issue.Number, ev.Issue.IsPullRequest
		if ev.Issue.IsPullRequest && ev.Provider == belay.ProviderGitHub {
			// Its head, as GitHub keeps it for every pull request.
			src.Ref = fmt.Sprintf("refs/pull/%d/head", ev.Issue.Number)
		} else {
			src.Ref = defaultBranch
			t.BaseBranch = defaultBranch
		}
	case belay.RepoEventIssues:
		instruction = ev.Issue.Title
		if body := strings.TrimSpace(ev.Issue.Body); body != "" {
			instruction += "\n\n" + body
		}
		t.Issue = ev.Issue.Number
		src.Ref, t.BaseBranch = defaultBranch, defaultBranch
	case belay.RepoEventPullRequest:
		instruction = r.On.PullRequest.Instruction
		t.Issue, t.PullRequest = ev.PullRequest.Number, true
		src.Commit = ev.PullRequest.HeadSHA
		t.Commit = ev.PullRequest.HeadSHA
		src.Ref = "refs/heads/" + ev.PullRequest.HeadRef
		if ev.Provider == belay.ProviderGitHub {
			src.Ref = fmt.Sprintf("refs/pull/%d/head", ev.PullRequest.Number)
		}
		t.BaseBranch = ev.PullRequest.HeadRef
	case belay.RepoEventPush:
		instruction = r.On.Push.Instruction
		src.Ref = ev.Ref
		t.BaseBranch = strings.TrimPrefix(ev.Ref, "refs/heads/")
	}
	if src.Ref != "" && belay.CheckGitRef(src.Ref) != nil {
		src.Ref = ""
	}
	req := r.request(instruction, src)
	req.Trigger = t
	return req
}
