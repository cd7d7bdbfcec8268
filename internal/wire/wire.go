// Package wire holds the JSON shapes of belay's HTTP API and the constants
// both sides of it share: the control plane (internal/httpapi), its Go
// client and the CLI, and the sandbox entry (internal/sandbox). It is a
// package of its own so that the sandbox entry, and each Lambda function,
// links only the types it speaks and not the server that answers them.
package wire

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// ErrorBody is every error answer: {"error":{"code","message","requestId"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of an error answer. Code is stable and what
// clients branch on; Message is for people; RequestID ties the answer to the
// server's log line.
type ErrorDetail struct {
	Code      belay.Code `json:"code"`
	Message   string     `json:"message"`
	RequestID string     `json:"requestId"`
}

// RequestIDHeader carries the request id on every answer, errors or not, so
// a caller can quote it when something goes wrong.
const RequestIDHeader = "X-Request-Id"

// IdempotencyKeyHeader names the header that makes POST /v1/runs safe to
// retry: the same key with the same body returns the same run.
const IdempotencyKeyHeader = "Idempotency-Key"

// MaxIdempotencyKeyLen bounds the Idempotency-Key header, in bytes.
const MaxIdempotencyKeyLen = 255

// CreateRunResponse answers POST /v1/runs (202).
type CreateRunResponse struct {
	RunID  string          `json:"runId"`
	Status belay.RunStatus `json:"status"`
	Links  RunLinks        `json:"links"`
}

// RunLinks are the paths of a run's resources, relative to the API's base URL,
// so a client never builds them by hand.
type RunLinks struct {
	Self      string `json:"self"`
	Events    string `json:"events"`
	Stream    string `json:"stream"`
	Approvals string `json:"approvals"`
	Cancel    string `json:"cancel"`
	Artifacts string `json:"artifacts"`
}

// LinksFor returns the links of run id.
func LinksFor(id string) RunLinks {
	self := "/v1/runs/" + id
	return RunLinks{
		Self:      self,
		Events:    self + "/events",
		Stream:    self + "/events?stream=1",
		Approvals: self + "/approvals",
		Cancel:    self + "/cancel",
		Artifacts: self + "/artifacts",
	}
}

// RunView is the public view of a run (GET /v1/runs/{id}, list entries, the
// cancel answer). It leaves out the uploaded file contents and the
// instruction: they are the caller's own input, can be large, and a listing
// of runs should not repeat them.
type RunView struct {
	RunID           string              `json:"runId"`
	Status          belay.RunStatus     `json:"status"`
	Model           string              `json:"model"`
	CreatedAt       time.Time           `json:"createdAt"`
	UpdatedAt       time.Time           `json:"updatedAt"`
	StartedAt       time.Time           `json:"startedAt,omitzero"`
	FinishedAt      time.Time           `json:"finishedAt,omitzero"`
	CancelRequested bool                `json:"cancelRequested"`
	Reason          string              `json:"reason,omitempty"`
	ExitCode        *int                `json:"exitCode,omitempty"`
	Usage           belay.Usage         `json:"usage"`
	Checks          []belay.CheckResult `json:"checks"`
	ChangedFiles    []string            `json:"changedFiles"`
	Artifacts       []string            `json:"artifacts"`
	LastSeq         int64               `json:"lastSeq"`
	// Attempt is the run's current (or last) attempt: 1, and one more for
	// each resume on a new sandbox. Attempts lists them, oldest first.
	Attempt  int           `json:"attempt"`
	Attempts []AttemptView `json:"attempts"`
	// Checkpoint is the latest checkpoint its sandbox saved, if any.
	Checkpoint *belay.CheckpointRef `json:"checkpoint,omitempty"`
	Request    RunRequestSummary    `json:"request"`
	// Trigger is the repository event that started the run, if one did.
	Trigger *belay.Trigger `json:"trigger,omitempty"`
	Links   RunLinks       `json:"links"`
}

// AttemptView is one attempt of a run: one sandbox. Lost says how its
// sandbox was lost (the run then resumed on a new one, or failed); EndedAt
// is unset while it runs.
type AttemptView struct {
	Attempt   int       `json:"attempt"`
	StartedAt time.Time `json:"startedAt,omitzero"`
	EndedAt   time.Time `json:"endedAt,omitzero"`
	Lost      string    `json:"lost,omitempty"`
}

// AttemptsOf lists r's attempts: each lost one, then the current one (when
// the run has started and its last attempt was not lost).
func AttemptsOf(r belay.Run) []AttemptView {
	out := make([]AttemptView, 0, len(r.LostAttempts)+1)
	for _, l := range r.LostAttempts {
		out = append(out, AttemptView{Attempt: l.Attempt, StartedAt: l.StartedAt, EndedAt: l.LostAt, Lost: l.Reason})
	}
	if r.Attempt > 0 && (len(r.LostAttempts) == 0 || r.LostAttempts[len(r.LostAttempts)-1].Attempt < r.Attempt) {
		out = append(out, AttemptView{Attempt: r.Attempt, StartedAt: r.AttemptStartedAt(), EndedAt: r.FinishedAt})
	}
	return out
}

// RunRequestSummary is what a run was asked to do, without file contents:
// the uploaded paths, the allowed paths, the requested checks and limits.
type RunRequestSummary struct {
	Files []string `json:"files"`
	// Source is the git source the run's tree was fetched from: URL, ref,
	// the commit fetched and the tree's size.
	Source          *belay.Source        `json:"source,omitempty"`
	AllowedPaths    []string             `json:"allowedPaths"`
	Checks          [][]string           `json:"checks"`
	MaxSteps        int                  `json:"maxSteps"`
	WallTimeSeconds int                  `json:"wallTimeSeconds"`
	Approval        belay.ApprovalConfig `json:"approval"`
}

// ViewOf builds the public view of r.
func ViewOf(r belay.Run) RunView {
	files := make([]string, len(r.Request.Files))
	for i, f := range r.Request.Files {
		files[i] = f.Path
	}
	return RunView{
		RunID:           r.ID,
		Status:          r.Status,
		Model:           r.Request.Model,
		CreatedAt:       r.CreatedAt,
		UpdatedAt:       r.UpdatedAt,
		StartedAt:       r.StartedAt,
		FinishedAt:      r.FinishedAt,
		CancelRequested: r.CancelRequested,
		Reason:          r.Reason,
		ExitCode:        r.ExitCode,
		Usage:           r.Usage,
		Checks:          NonNil(r.Checks),
		ChangedFiles:    NonNil(r.ChangedFiles),
		Artifacts:       NonNil(r.Artifacts),
		LastSeq:         r.LastSeq,
		Attempt:         r.Attempt,
		Attempts:        AttemptsOf(r),
		Checkpoint:      r.Checkpoint,
		Trigger:         r.Request.Trigger,
		Request: RunRequestSummary{
			Files:           files,
			Source:          r.Request.Source,
			AllowedPaths:    NonNil(r.Request.AllowedPaths),
			Checks:          NonNil(r.Request.Checks),
			MaxSteps:        r.Request.MaxSteps,
			WallTimeSeconds: r.Request.WallTimeSeconds,
			Approval:        r.Request.Approval,
		},
		Links: LinksFor(r.ID),
	}
}

// NonNil turns a nil slice into an empty one so JSON says [] rather than
// null: clients iterate without a nil check.
func NonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// RunList answers GET /v1/runs. NextCursor is empty on the last page.
type RunList struct {
	Runs       []RunView `json:"runs"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// ApprovalList answers GET /v1/runs/{id}/approvals, oldest first.
type ApprovalList struct {
	Approvals []belay.Approval `json:"approvals"`
}

// DecisionRequest is the body of POST /v1/runs/{id}/approvals/{approvalId}.
type DecisionRequest struct {
	Decision belay.Decision `json:"decision"`
	Reason   string         `json:"reason,omitempty"`
}

// MaxDecisionReasonLen bounds a decision's reason, in bytes.
const MaxDecisionReasonLen = 1000

// ArtifactList answers GET /v1/runs/{id}/artifacts.
type ArtifactList struct {
	Artifacts []belay.ArtifactInfo `json:"artifacts"`
}

// EventsMissedType is the type of the in-band marker that tells an event
// reader it asked for events the bounded buffer no longer keeps. In NDJSON it
// is a first line {"type":"events.missed","data":{"oldestSeq":N}} without a
// seq; in SSE it is an "event: events.missed" without an id. Events after
// the reader's position and before OldestSeq are gone.
const EventsMissedType = "events.missed"

// EventsMissed is the data of the events.missed marker.
type EventsMissed struct {
	OldestSeq int64 `json:"oldestSeq"`
}

// EventsMissedLine is the NDJSON form of the events.missed marker.
type EventsMissedLine struct {
	Type string       `json:"type"`
	Data EventsMissed `json:"data"`
}

// Headers of an NDJSON events answer that let a reader page without parsing
// the last line: the newest seq written, and whether the log has ended.
const (
	LastSeqHeader  = "Belay-Last-Seq"
	TerminalHeader = "Belay-Run-Terminal"
)

// GitHubWebhookPath is the route of GitHub's webhooks. It takes no bearer
// token: the X-Hub-Signature-256 header is the credential.
const GitHubWebhookPath = "/v1/webhooks/github"

// WebhookResponse answers a webhook delivery (202): the run it started
// (or started before, for a redelivery), or why it started none. A ping
// answers 200 with Pong.
type WebhookResponse struct {
	RunID   string `json:"runId,omitempty"`
	Ignored string `json:"ignored,omitempty"`
	Pong    bool   `json:"pong,omitempty"`
}

// Internal API (sandbox ↔ control plane).

// EventBatch is the body of POST /internal/v1/runs/{id}/events. BatchID is
// unique per batch and repeated on a retry, which then appends nothing.
type EventBatch struct {
	BatchID string             `json:"batchId"`
	Events  []belay.EventInput `json:"events"`
}

// Bounds of one event batch. A batch is one AppendEvents call, so it holds
// at most what every store takes at once (DynamoDB's transaction limit).
const (
	MaxBatchEvents  = belay.MaxAppendEvents
	MaxBatchBytes   = 256 << 10
	MaxBatchIDLen   = 128
	MaxApprovalBody = 64 << 10
)

// EventBatchResponse answers an event batch with the stored events.
type EventBatchResponse struct {
	Events []belay.Event `json:"events"`
}

// ApprovalRequest is the body of POST /internal/v1/runs/{id}/approvals: the
// tool call the sandbox wants to run.
type ApprovalRequest struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// ClaimRequest is the body of POST /internal/v1/claim, the claim exchange:
// the single-use code the sandbox was started with, the ECS task ARN it
// runs as (recorded on the run, so cancel and cleanup can stop it), and,
// optionally, the run it expects the code to be for.
type ClaimRequest struct {
	Claim   string `json:"claim"`
	TaskArn string `json:"taskArn,omitempty"`
	RunID   string `json:"runId,omitempty"`
}

// MaxClaimBody bounds the body of a claim request, in bytes.
const MaxClaimBody = 4 << 10

// ClaimResponse answers a successful claim: the run's spec (without
// tokens and without APIBaseURL, which the sandbox already has), the three
// audience tokens, issued for this attempt, and where to upload each
// output (belay.ArtifactNames).
type ClaimResponse struct {
	Spec    belay.SandboxSpec `json:"spec"`
	Tokens  ClaimTokens       `json:"tokens"`
	Outputs map[string]Upload `json:"outputs"`
	// Source, for a run from a git source, is where the sandbox downloads
	// the bundle it builds its repository from: a GET (a presigned S3 URL
	// on AWS, the source route with the events token locally).
	Source *Upload `json:"source,omitempty"`
}

// ClaimTokens are the tokens of a claim answer. Its String, Format and
// LogValue methods redact them, so an answer printed or logged by mistake
// leaks no token.
type ClaimTokens struct {
	Model     string `json:"model"`
	Events    string `json:"events"`
	Approvals string `json:"approvals"`
}

const redactedClaimTokens = "wire.ClaimTokens{Model:[redacted] Events:[redacted] Approvals:[redacted]}"

// String redacts the tokens.
func (ClaimTokens) String() string { return redactedClaimTokens }

// Format redacts the tokens under every fmt verb.
func (ClaimTokens) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redactedClaimTokens) }

// LogValue redacts the tokens in slog output.
func (ClaimTokens) LogValue() slog.Value { return slog.StringValue(redactedClaimTokens) }

// Upload is where and how a sandbox uploads one output: an HTTP request of
// Method to URL with Header, the file as its body. URL is absolute (a
// presigned S3 URL, which needs no other credential) or relative to the
// API's base URL, without a leading slash (the outputs route, with the
// events token in Header). Its Format and LogValue methods redact the URL's
// query and the header values, which are credentials.
type Upload struct {
	URL    string            `json:"url"`
	Method string            `json:"method"`
	Header map[string]string `json:"header,omitempty"`
}

// Format prints the method and the URL without its query; never a header
// value.
func (u Upload) Format(f fmt.State, _ rune) {
	path, _, _ := strings.Cut(u.URL, "?")
	_, _ = fmt.Fprintf(f, "wire.Upload{Method:%s URL:%s Header:[redacted]}", u.Method, path)
}

// LogValue is Format's text in slog output.
func (u Upload) LogValue() slog.Value { return slog.StringValue(fmt.Sprint(u)) }

// SourcePath is the route a sandbox downloads its run's git source bundle
// from, relative to the API's base URL: GET it with the run's events token.
func SourcePath(runID string) string {
	return "internal/v1/runs/" + url.PathEscape(runID) + "/source"
}

// OutputPath is the outputs route of one output of a run, relative to the
// API's base URL: PUT it with the run's events token.
func OutputPath(runID, name string) string {
	return "internal/v1/runs/" + url.PathEscape(runID) + "/outputs/" + url.PathEscape(name)
}
