// Package github is belay's adapter to GitHub, through the maintained
// client library github.com/google/go-github: webhook signatures and
// payloads (normalized to belay.RepoEvent), and the REST calls of the safe
// outputs (a pull request, a comment).
package github

import (
	"errors"
	"fmt"
	"strings"
	"time"

	gh "github.com/google/go-github/v81/github"

	"github.com/belay-dev/belay/internal/belay"
)

// The headers of a GitHub webhook delivery.
const (
	SignatureHeader = "X-Hub-Signature-256"
	EventHeader     = "X-GitHub-Event"
	DeliveryHeader  = "X-GitHub-Delivery"
)

// MaxPayloadBytes is GitHub's cap on a webhook payload (25 MB): a larger
// body is not GitHub's.
const MaxPayloadBytes = 25 << 20

// ErrSignature is a delivery whose signature is missing or wrong.
var ErrSignature = errors.New("signature")

// VerifySignature checks the X-Hub-Signature-256 header value against the
// HMAC-SHA256 of the raw body with the webhook secret, in constant time
// (go-github's ValidateSignature compares with hmac.Equal). Only sha256=
// is accepted: GitHub's older SHA-1 header is not.
func VerifySignature(header string, body, secret []byte) error {
	switch {
	case header == "":
		return fmt.Errorf("%w: %s is missing", ErrSignature, SignatureHeader)
	case !strings.HasPrefix(header, "sha256="):
		return fmt.Errorf("%w: %s must be sha256=<hex>", ErrSignature, SignatureHeader)
	case len(secret) == 0:
		return fmt.Errorf("%w: no webhook secret is configured", ErrSignature)
	}
	if err := gh.ValidateSignature(header, body, secret); err != nil {
		return fmt.Errorf("%w: it does not match the payload", ErrSignature)
	}
	return nil
}

// ErrNotActed is an event type belay does not act on (not an error of the
// delivery: the answer says it was ignored).
var ErrNotActed = errors.New("belay does not act on this event")

// Normalize turns a verified delivery into a belay.RepoEvent. eventType is
// X-GitHub-Event: issue_comment, issues, pull_request and push are
// normalized; any other returns ErrNotActed. A payload that is not what its
// type says is invalid.
func Normalize(eventType, delivery string, body []byte, now time.Time) (belay.RepoEvent, error) {
	switch eventType {
	case belay.RepoEventIssueComment, belay.RepoEventIssues, belay.RepoEventPullRequest, belay.RepoEventPush:
	default:
		return belay.RepoEvent{}, fmt.Errorf("%w: %s", ErrNotActed, eventType)
	}
	parsed, err := gh.ParseWebHook(eventType, body)
	if err != nil {
		return belay.RepoEvent{}, belay.Errorf(belay.CodeInvalid, "the %s payload is not valid JSON of its kind", eventType)
	}
	ev := belay.RepoEvent{
		Version: belay.RepoEventVersion, Provider: belay.ProviderGitHub, Event: eventType,
		Delivery: delivery, ReceivedAt: now.UTC(),
	}
	repo := func(r *gh.Repository) {
		ev.Repository, ev.CloneURL, ev.DefaultBranch = r.GetFullName(), r.GetCloneURL(), r.GetDefaultBranch()
	}
	switch e := parsed.(type) {
	case *gh.IssueCommentEvent:
		repo(e.GetRepo())
		ev.Action = e.GetAction()
		c := e.GetComment()
		ev.Actor, ev.Association, ev.URL = c.GetUser().GetLogin(), c.GetAuthorAssociation(), c.GetHTMLURL()
		if ev.Actor == "" {
			ev.Actor = e.GetSender().GetLogin()
		}
		i := e.GetIssue()
		ev.Issue = &belay.RepoIssue{Number: i.GetNumber(), Title: i.GetTitle(), Body: i.GetBody(), IsPullRequest: i.IsPullRequest()}
		ev.Comment = &belay.RepoComment{ID: c.GetID(), Body: c.GetBody()}
	case *gh.IssuesEvent:
		repo(e.GetRepo())
		ev.Action, ev.Actor = e.GetAction(), e.GetSender().GetLogin()
		i := e.GetIssue()
		ev.URL = i.GetHTMLURL()
		ev.Association = i.GetAuthorAssociation()
		ev.Issue = &belay.RepoIssue{Number: i.GetNumber(), Title: i.GetTitle(), Body: i.GetBody(), IsPullRequest: i.IsPullRequest()}
		ev.Label = e.GetLabel().GetName()
	case *gh.PullRequestEvent:
		repo(e.GetRepo())
		pr := e.GetPullRequest()
		ev.Action, ev.URL = e.GetAction(), pr.GetHTMLURL()
		ev.Actor, ev.Association = pr.GetUser().GetLogin(), pr.GetAuthorAssociation()
		if ev.Action == "synchronize" || ev.Actor == "" {
			ev.Actor = e.GetSender().GetLogin()
		}
		ev.Ref, ev.Commit = "refs/heads/"+pr.GetHead().GetRef(), pr.GetHead().GetSHA()
		ev.PullRequest = &belay.RepoPullRequest{Number: pr.GetNumber(), Title: pr.GetTitle(), Body: pr.GetBody(),
			HeadRef: pr.GetHead().GetRef(), HeadSHA: pr.GetHead().GetSHA(), BaseRef: pr.GetBase().GetRef()}
	case *gh.PushEvent:
		r := e.GetRepo()
		ev.Repository, ev.CloneURL, ev.DefaultBranch = r.GetFullName(), r.GetCloneURL(), r.GetDefaultBranch()
		ev.Ref, ev.URL = e.GetRef(), e.GetCompare()
		ev.Actor = e.GetSender().GetLogin()
		if ev.Actor == "" {
			ev.Actor = e.GetPusher().GetName()
		}
		if e.GetDeleted() || strings.Trim(e.GetAfter(), "0") == "" {
			return belay.RepoEvent{}, fmt.Errorf("%w: a push that deletes %s", ErrNotActed, ev.Ref)
		}
		ev.Commit = e.GetAfter()
	}
	if err := belay.CheckRepoEvent(ev); err != nil {
		return belay.RepoEvent{}, belay.Errorf(belay.CodeInvalid, "the %s payload lacks what belay needs: %s", eventType, err.Error())
	}
	return ev, nil
}
