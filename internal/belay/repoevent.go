package belay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Repository events: what a repository host (GitHub's webhooks, CodeCommit's
// EventBridge events) tells belay, normalized to one shape. The webhook
// publishes a RepoEvent on the event bus; the dispatcher turns it into a run.
// events/repo-event.schema.json is its JSON Schema.

// The providers of repository events.
const (
	ProviderGitHub     = "github"
	ProviderCodeCommit = "codecommit"
)

// The repository events belay knows. A trigger names them in its "on".
const (
	RepoEventIssueComment = "issue_comment"
	RepoEventIssues       = "issues"
	RepoEventPullRequest  = "pull_request"
	RepoEventPush         = "push"
)

// RepoEventTypes lists the event names a trigger may use.
var RepoEventTypes = []string{RepoEventIssueComment, RepoEventIssues, RepoEventPullRequest, RepoEventPush}

// EventBridge names of what belay puts on its bus.
const (
	// RepoEventSource and RepoEventDetailType mark a normalized repository
	// event (RepoEvent is its detail).
	RepoEventSource     = "belay.repo"
	RepoEventDetailType = "Repository Event"
	// RunStatusSource and RunStatusDetailType mark a run status change
	// (RunStatusEvent is its detail).
	RunStatusSource     = "belay.runs"
	RunStatusDetailType = "Run Status Change"
)

// RepoEventVersion is the version of RepoEvent's shape.
const RepoEventVersion = "1"

// RepoEvent is one repository event, normalized. What the trigger matched
// on and what the dispatcher renders the run from are all here, so the
// dispatcher needs neither the raw payload nor the host's API.
type RepoEvent struct {
	Version  string `json:"version"`
	Provider string `json:"provider"`
	// Event is one of RepoEventTypes; Action the host's action
	// ("created", "labeled", "opened", ...), empty for a push.
	Event  string `json:"event"`
	Action string `json:"action,omitempty"`
	// Delivery identifies the delivery at the host (X-GitHub-Delivery, or
	// the EventBridge event's id): a redelivery has the same one.
	Delivery string `json:"delivery"`
	// RunID is the run the webhook promised the host for this delivery;
	// empty for an event that came straight from the bus (CodeCommit), for
	// which the dispatcher picks one.
	RunID string `json:"runId,omitempty"`
	// Repository is "owner/name" (GitHub) or the repository's name
	// (CodeCommit); CloneURL where git fetches it.
	Repository string `json:"repository"`
	CloneURL   string `json:"cloneUrl"`
	// Ref is the full ref the event concerns (refs/heads/main), and
	// Commit the commit to run on, when the event names one (a push, a
	// pull request's head). A comment on an issue names none: the
	// dispatcher then fetches DefaultBranch as it is.
	Ref           string `json:"ref,omitempty"`
	Commit        string `json:"commit,omitempty"`
	DefaultBranch string `json:"defaultBranch,omitempty"`
	// Actor is who caused the event, and Association their relation to the
	// repository (OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR, NONE, ...).
	Actor       string `json:"actor"`
	Association string `json:"association,omitempty"`
	// URL is the event's page at the host, for people.
	URL         string           `json:"url,omitempty"`
	Issue       *RepoIssue       `json:"issue,omitempty"`
	Comment     *RepoComment     `json:"comment,omitempty"`
	PullRequest *RepoPullRequest `json:"pullRequest,omitempty"`
	Label       string           `json:"label,omitempty"`
	ReceivedAt  time.Time        `json:"receivedAt"`
}

// RepoIssue is the issue (or pull request, on GitHub) a comment or label
// is on.
type RepoIssue struct {
	Number        int    `json:"number"`
	Title         string `json:"title"`
	Body          string `json:"body,omitempty"`
	IsPullRequest bool   `json:"isPullRequest,omitempty"`
}

// RepoComment is a comment on an issue or pull request.
type RepoComment struct {
	ID   int64  `json:"id"`
	Body string `json:"body"`
}

// RepoPullRequest is a pull request's heads, for runs on its head commit.
type RepoPullRequest struct {
	Number  int    `json:"number"`
	Title   string `json:"title"`
	Body    string `json:"body,omitempty"`
	HeadRef string `json:"headRef"`
	HeadSHA string `json:"headSha"`
	BaseRef string `json:"baseRef"`
}

// MaxRepoEventBytes bounds a normalized event: EventBridge takes entries of
// at most 256 KB, and the event carries a comment or issue body.
const MaxRepoEventBytes = 200 << 10

// ParseRepoEvent decodes a normalized event strictly (unknown fields and
// trailing data refused) and checks it (CheckRepoEvent). Returns invalid.
func ParseRepoEvent(b []byte) (RepoEvent, error) {
	var ev RepoEvent
	if err := decodeStrictJSON(b, &ev); err != nil {
		return RepoEvent{}, Errorf(CodeInvalid, "repository event: %v", err)
	}
	if err := CheckRepoEvent(ev); err != nil {
		return RepoEvent{}, err
	}
	return ev, nil
}

// CheckRepoEvent returns invalid for an event the dispatcher cannot act
// on: an unknown version, provider or event, no delivery, repository,
// clone URL or actor, a commit that is not a full object name, or the
// parts an event of its kind needs missing.
func CheckRepoEvent(ev RepoEvent) error {
	bad := func(field, format string, args ...any) error {
		return FieldErrorf(CodeInvalid, field, format, args...)
	}
	switch {
	case ev.Version != RepoEventVersion:
		return bad("version", "is %q; this belay reads version %q", ev.Version, RepoEventVersion)
	case ev.Provider != ProviderGitHub && ev.Provider != ProviderCodeCommit:
		return bad("provider", "is %q; it must be %q or %q", ev.Provider, ProviderGitHub, ProviderCodeCommit)
	case !isRepoEventType(ev.Event):
		return bad("event", "is %q; it must be one of %v", ev.Event, RepoEventTypes)
	case ev.Delivery == "" || len(ev.Delivery) > 128 || !isPrintableText(ev.Delivery):
		return bad("delivery", "must be 1 to 128 printable characters")
	case ev.Repository == "" || len(ev.Repository) > 256:
		return bad("repository", "must be 1 to 256 characters")
	case ev.CloneURL == "":
		return bad("cloneUrl", "is empty")
	case ev.Actor == "":
		return bad("actor", "is empty")
	case ev.Commit != "" && !IsObjectName(ev.Commit):
		return bad("commit", "%q is not a full commit id", ev.Commit)
	case ev.ReceivedAt.IsZero():
		return bad("receivedAt", "is unset")
	}
	if ev.RunID != "" && CheckArtifactRunID(ev.RunID) != nil {
		return bad("runId", "is not a run id")
	}
	switch ev.Event {
	case RepoEventIssueComment:
		if ev.Issue == nil || ev.Comment == nil {
			return bad("comment", "an issue_comment event needs issue and comment")
		}
	case RepoEventIssues:
		if ev.Issue == nil {
			return bad("issue", "an issues event needs issue")
		}
	case RepoEventPullRequest:
		if ev.PullRequest == nil || !IsObjectName(ev.PullRequest.HeadSHA) {
			return bad("pullRequest", "a pull_request event needs pullRequest with a full headSha")
		}
	case RepoEventPush:
		if ev.Ref == "" || ev.Commit == "" {
			return bad("commit", "a push event needs ref and commit")
		}
	}
	return nil
}

func isRepoEventType(e string) bool {
	for _, t := range RepoEventTypes {
		if t == e {
			return true
		}
	}
	return false
}

// RunStatusEvent is the detail of a "Run Status Change" event belay puts
// on its bus whenever a run reaches a state, so users can hook into runs
// (and the publisher writes a finished run's safe outputs).
// events/run-status.schema.json is its JSON Schema.
type RunStatusEvent struct {
	Version      string    `json:"version"`
	RunID        string    `json:"runId"`
	Status       RunStatus `json:"status"`
	Reason       string    `json:"reason,omitempty"`
	ExitCode     *int      `json:"exitCode,omitempty"`
	ChangedFiles []string  `json:"changedFiles,omitempty"`
	Time         time.Time `json:"time"`
	Trigger      *Trigger  `json:"trigger,omitempty"`
}

// RunStatusEventVersion is the version of RunStatusEvent's shape.
const RunStatusEventVersion = "1"

// RunStatusEventOf is the status event of run as it stands.
func RunStatusEventOf(run Run) RunStatusEvent {
	t := run.UpdatedAt
	if run.Status.Terminal() && !run.FinishedAt.IsZero() {
		t = run.FinishedAt
	}
	return RunStatusEvent{
		Version: RunStatusEventVersion, RunID: run.ID, Status: run.Status, Reason: run.Reason,
		ExitCode: run.ExitCode, ChangedFiles: run.ChangedFiles, Time: t.UTC(), Trigger: run.Request.Trigger,
	}
}

// ParseRunStatusEvent decodes a run status event strictly and checks it.
// Returns invalid.
func ParseRunStatusEvent(b []byte) (RunStatusEvent, error) {
	var ev RunStatusEvent
	if err := decodeStrictJSON(b, &ev); err != nil {
		return RunStatusEvent{}, Errorf(CodeInvalid, "run status event: %v", err)
	}
	switch {
	case ev.Version != RunStatusEventVersion:
		return RunStatusEvent{}, FieldErrorf(CodeInvalid, "version", "is %q; this belay reads version %q", ev.Version, RunStatusEventVersion)
	case CheckArtifactRunID(ev.RunID) != nil:
		return RunStatusEvent{}, FieldErrorf(CodeInvalid, "runId", "is not a run id")
	case !ev.Status.Valid():
		return RunStatusEvent{}, FieldErrorf(CodeInvalid, "status", "%q is not a run status", ev.Status)
	case ev.Time.IsZero():
		return RunStatusEvent{}, FieldErrorf(CodeInvalid, "time", "is unset")
	}
	if ev.Trigger != nil {
		if err := CheckTrigger(*ev.Trigger); err != nil {
			return RunStatusEvent{}, err
		}
	}
	return ev, nil
}

// decodeStrictJSON decodes exactly one JSON value into v, refusing unknown
// fields and trailing data.
func decodeStrictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

func isPrintableText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// BusEvent is an EventBridge event as a Lambda target receives it: the
// envelope, with its detail kept raw for the detail's own strict decoder.
type BusEvent struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       time.Time       `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

// CodeCommit's native event of a repository's refs, from the default bus.
const (
	CodeCommitSource     = "aws.codecommit"
	CodeCommitDetailType = "CodeCommit Repository State Change"
)

// codeCommitDetail is the part of CodeCommit's "Repository State Change"
// detail belay reads.
type codeCommitDetail struct {
	Event             string `json:"event"`
	RepositoryName    string `json:"repositoryName"`
	ReferenceType     string `json:"referenceType"`
	ReferenceFullName string `json:"referenceFullName"`
	CommitID          string `json:"commitId"`
	CallerUserArn     string `json:"callerUserArn"`
}

// RepoEventOf returns the repository event a bus event carries: belay's
// own normalized event (source belay.repo), or CodeCommit's "Repository
// State Change" of a branch (created or updated), normalized as a push.
// ignored is set, with no error, for an event that is no push (a deleted
// branch, a tag). Returns invalid for anything else or a malformed detail.
func RepoEventOf(ev BusEvent) (re RepoEvent, ignored string, err error) {
	switch {
	case ev.Source == RepoEventSource && ev.DetailType == RepoEventDetailType:
		re, err = ParseRepoEvent(ev.Detail)
		return re, "", err
	case ev.Source == CodeCommitSource && ev.DetailType == CodeCommitDetailType:
	default:
		return RepoEvent{}, "", Errorf(CodeInvalid, "an event from %q of type %q is not a repository event", ev.Source, ev.DetailType)
	}
	var d codeCommitDetail
	if err := json.Unmarshal(ev.Detail, &d); err != nil {
		return RepoEvent{}, "", Errorf(CodeInvalid, "the CodeCommit event's detail is malformed: %v", err)
	}
	if d.ReferenceType != "branch" || d.Event == "referenceDeleted" {
		return RepoEvent{}, fmt.Sprintf("CodeCommit %s of %s %s is not a push to a branch", d.Event, d.ReferenceType, d.ReferenceFullName), nil
	}
	re = RepoEvent{
		Version: RepoEventVersion, Provider: ProviderCodeCommit, Event: RepoEventPush, Action: d.Event,
		Delivery: ev.ID, Repository: d.RepositoryName,
		CloneURL: "https://git-codecommit." + ev.Region + ".amazonaws.com/v1/repos/" + d.RepositoryName,
		Ref:      d.ReferenceFullName, Commit: d.CommitID, Actor: d.CallerUserArn, ReceivedAt: ev.Time.UTC(),
	}
	if re.Actor == "" {
		re.Actor = "unknown"
	}
	if err := CheckRepoEvent(re); err != nil {
		return RepoEvent{}, "", err
	}
	return re, "", nil
}
