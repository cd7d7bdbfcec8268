package httpapi

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// OutputPresigner hands a sandbox presigned URLs to upload its outputs to,
// so that an upload needs no credential of the control plane's: the S3
// adapter's PresignPut. Without one (the embedded control plane), the claim
// answer points the sandbox at the outputs route instead.
type OutputPresigner interface {
	PresignPut(ctx context.Context, runID, name string, ttl time.Duration, maxBytes int64) (url string, headers http.Header, err error)
}

// maxPresignTTL bounds a presigned upload's lifetime: SigV4's limit.
const maxPresignTTL = 7 * 24 * time.Hour

// handleClaim is the claim exchange (POST /internal/v1/claim): a sandbox
// started with nothing but a single-use claim code trades it, once, for its
// run's spec, three fresh audience tokens for its attempt, and where to
// upload its outputs. There is no bearer: the code is the credential. Every
// refusal is the same 401 to the caller; the log says why.
func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, wire.MaxClaimBody)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.ClaimRequest
	if err := decodeStrict(body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TaskArn != "" {
		if err := belay.CheckSandboxRef(req.TaskArn); err != nil {
			s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "taskArn", "%s", strings.TrimPrefix(belay.ErrorMessage(err), "sandboxRef: ")))
			return
		}
	}
	if req.RunID != "" && belay.CheckArtifactRunID(req.RunID) != nil {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "runId", "is not a run id"))
		return
	}
	ctx := context.WithoutCancel(r.Context())
	hash, ok := belay.HashClaimCode(req.Claim)
	if !ok {
		s.refuseClaim(w, r, req.RunID, belay.RefuseClaim(belay.ClaimMalformed))
		return
	}
	now := s.now()
	claim, err := s.store.ConsumeClaim(ctx, hash, req.RunID, now)
	if err != nil {
		s.refuseClaim(w, r, req.RunID, err)
		return
	}
	stateOf(r).runID = claim.RunID
	run, err := s.store.GetRun(ctx, claim.RunID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The tokens live as long as the capability: the run's wall time and
	// its grace, however late in it the sandbox claims.
	capability, err := s.store.GetCapability(ctx, run.ID)
	if err != nil && !belay.IsCode(err, belay.CodeNotFound) {
		s.writeError(w, r, err)
		return
	}
	ttl := capability.ExpiresAt.Sub(now).Truncate(time.Second)
	if err != nil || capability.State != belay.CapabilityActive || ttl < time.Second {
		s.refuseClaim(w, r, run.ID, belay.RefuseClaim(belay.ClaimCapabilityInactive))
		return
	}
	set, err := s.signer.IssueSet(run.ID, run.Request.Model, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TaskArn != "" {
		if err := s.store.RecordSandboxRef(ctx, run.ID, claim.Attempt, req.TaskArn); err != nil {
			// The claim is spent either way; a run that moved on meanwhile
			// is for the sandbox to learn from its first call.
			s.log.Warn("record the claiming sandbox", "request_id", stateOf(r).id, "run_id", run.ID, "err", err.Error())
		}
	}
	outputs := make(map[string]wire.Upload, len(belay.ArtifactNames))
	for _, name := range belay.ArtifactNames {
		u, err := s.outputTarget(ctx, run.ID, claim.Attempt, name, set.Events, ttl)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		outputs[name] = u
	}
	source, err := s.sourceTarget(ctx, run, set.Events, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	spec := belay.SpecForRun(run)
	spec.Attempt = claim.Attempt
	s.log.Info("claim exchanged", "request_id", stateOf(r).id, "run_id", run.ID, "attempt", claim.Attempt,
		"task_arn", req.TaskArn)
	s.writeJSON(w, http.StatusOK, wire.ClaimResponse{
		Spec:    spec,
		Tokens:  wire.ClaimTokens{Model: set.Model, Events: set.Events, Approvals: set.Approvals},
		Outputs: outputs,
		Source:  source,
	})
}

// refuseClaim logs why a claim was refused, at info level, and answers the
// one refusal every reason gets. Neither the log nor the answer holds the
// code.
func (s *Server) refuseClaim(w http.ResponseWriter, r *http.Request, runID string, err error) {
	if reason, ok := belay.ClaimRefusalOf(err); ok {
		s.log.Info("claim refused", "request_id", stateOf(r).id, "run_id", runID, "reason", string(reason))
	}
	s.writeError(w, r, err)
}

// outputTarget is where the sandbox of the run's attempt uploads one
// output: a presigned PUT of its staged name when the artifacts can be
// presigned, the outputs route with the events token otherwise.
func (s *Server) outputTarget(ctx context.Context, runID string, attempt int, name, eventsToken string, ttl time.Duration) (wire.Upload, error) {
	if s.presigner == nil {
		return wire.Upload{
			URL:    wire.OutputPath(runID, name),
			Method: http.MethodPut,
			Header: map[string]string{"Authorization": "Bearer " + eventsToken},
		}, nil
	}
	url, headers, err := s.presigner.PresignPut(ctx, runID, belay.StagedOutputName(attempt, name), min(ttl, maxPresignTTL), belay.MaxArtifactBytes)
	if err != nil {
		return wire.Upload{}, err
	}
	h := make(map[string]string, len(headers))
	for k, v := range headers {
		h[k] = strings.Join(v, ",")
	}
	return wire.Upload{URL: url, Method: http.MethodPut, Header: h}, nil
}
