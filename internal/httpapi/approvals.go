package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// Who decided an approval, as recorded in Approval.DecidedBy.
const (
	decidedByUser    = "user"
	decidedByPolicy  = "policy"
	decidedByTimeout = "timeout"
)

// maxToolNameLen bounds the tool name of an approval request.
const maxToolNameLen = 64

func approvalID(r *http.Request) (string, error) {
	id := r.PathValue("approvalId")
	if id == "" || len(id) > maxRunIDLen || !isIDText(id) {
		return "", belay.Errorf(belay.CodeNotFound, "approval not found")
	}
	return id, nil
}

// expireIfDue decides a pending approval past its expiry as deny, by
// "timeout", so every reader (the sandbox polling, a person listing, a late
// decision) sees the same outcome. If someone decided it meanwhile, their
// decision stands and is returned.
func (s *Server) expireIfDue(ctx context.Context, a belay.Approval) (belay.Approval, error) {
	now := s.now()
	if a.Status != belay.ApprovalPending || now.Before(a.ExpiresAt) {
		return a, nil
	}
	decided, err := s.store.DecideApproval(ctx, a.RunID, a.ID, belay.DecisionDeny,
		"no decision before the approval timed out", decidedByTimeout, now)
	if belay.IsCode(err, belay.CodeConflict) {
		return s.store.GetApproval(ctx, a.RunID, a.ID)
	}
	return decided, err
}

// currentApproval reads one approval with its timeout applied, as every
// reader of a single approval must see it. Returns not_found if it does not
// exist.
func (s *Server) currentApproval(ctx context.Context, runID, id string) (belay.Approval, error) {
	a, err := s.store.GetApproval(ctx, runID, id)
	if err != nil {
		return belay.Approval{}, err
	}
	return s.expireIfDue(ctx, a)
}

func (s *Server) handleListApprovals(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.store.ListApprovals(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	for i := range list {
		if list[i], err = s.expireIfDue(r.Context(), list[i]); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	s.writeJSON(w, http.StatusOK, wire.ApprovalList{Approvals: wire.NonNil(list)})
}

// handleDecideApproval records a person's decision. A decision of cancel
// also cancels the run: the person has said the agent should stop.
func (s *Server) handleDecideApproval(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	aid, err := approvalID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, 16<<10)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.DecisionRequest
	if err := decodeStrict(body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if !req.Decision.Valid() {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "decision",
			"must be one of allow_once, allow_session, deny, cancel"))
		return
	}
	if len(req.Reason) > wire.MaxDecisionReasonLen || !utf8.ValidString(req.Reason) {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "reason",
			"must be valid UTF-8 of at most %d bytes", wire.MaxDecisionReasonLen))
		return
	}
	decided, err := s.decideApproval(context.WithoutCancel(r.Context()), stateOf(r).id, id, aid, req.Decision, req.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, decided)
}

// decideApproval records a person's decision of a pending approval (and
// runs the cancel sequence for "cancel"). Returns not_found; conflict if
// it is already decided (an expired ask is denied first, so a late
// decision is a conflict rather than silently overriding what the sandbox
// already saw) or the run is terminal.
func (s *Server) decideApproval(ctx context.Context, requestID, id, aid string, d belay.Decision, reason string) (belay.Approval, error) {
	a, err := s.currentApproval(ctx, id, aid)
	if err != nil {
		return belay.Approval{}, err
	}
	if a.Status != belay.ApprovalPending {
		return belay.Approval{}, belay.Errorf(belay.CodeConflict, "approval %s is already decided (%s)", aid, a.Decision)
	}
	decided, err := s.store.DecideApproval(ctx, id, aid, d, reason, decidedByUser, s.now())
	if err != nil {
		return belay.Approval{}, err
	}
	if d == belay.DecisionCancel {
		if _, err := s.cancelRunID(ctx, requestID, id); err != nil && !belay.IsCode(err, belay.CodeConflict) {
			return belay.Approval{}, err
		}
	}
	return decided, nil
}

// sandboxRunID returns an internal route's {id} run once its bearer token
// is verified for that run and the given audience. Every refusal is the
// same unauthorized answer; the reason goes to the log only.
func (s *Server) sandboxRunID(r *http.Request, aud token.Audience) (string, error) {
	runID, err := runID(r)
	if err != nil {
		return "", err
	}
	tok, ok := bearer(r)
	if !ok {
		return "", belay.Errorf(belay.CodeUnauthorized, "missing run token")
	}
	if _, err := s.signer.Verify(tok, token.Expect{Audience: aud, RunID: runID, Model: s.limits.Model}); err != nil {
		s.log.Info("run token refused", "request_id", stateOf(r).id, "run_id", runID,
			"audience", string(aud), "err", err.Error())
		return "", err
	}
	return runID, nil
}

// handleRequestApproval is the sandbox asking whether it may run a tool
// call. The run's policy answers at once where it can; "ask" leaves the
// approval pending for a person, until its timeout denies it.
func (s *Server) handleRequestApproval(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceApprovals)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, wire.MaxApprovalBody)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req wire.ApprovalRequest
	if err := decodeStrict(body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Tool == "" || len(req.Tool) > maxToolNameLen || !isIDText(req.Tool) {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "tool",
			"must be a tool name of 1 to %d letters, digits, '_' or '-'", maxToolNameLen))
		return
	}
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || bytes.Equal(args, []byte("null")) {
		args = nil
	} else if args[0] != '{' {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "arguments", "must be a JSON object"))
		return
	}
	ctx := context.WithoutCancel(r.Context())
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if run.Status.Terminal() {
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s has ended", id))
		return
	}
	now := s.now()
	timeout := run.Request.Approval.TimeoutSeconds
	if timeout <= 0 {
		timeout = s.limits.DefaultApprovalTimeoutSeconds
	}
	if timeout <= 0 {
		timeout = 120
	}
	a := belay.Approval{
		ID:          s.newID("apr_"),
		RunID:       id,
		Tool:        req.Tool,
		Arguments:   json.RawMessage(args),
		Status:      belay.ApprovalPending,
		RequestedAt: now,
		ExpiresAt:   now.Add(time.Duration(timeout) * time.Second),
	}
	if d, ok := run.Request.Approval.PolicyDecision(req.Tool); ok {
		a.Status, a.Decision, a.DecidedBy, a.DecidedAt = belay.ApprovalDecided, d, decidedByPolicy, now
		a.Reason = "decided by the run's " + policyName(run.Request.Approval.Policy) + " policy"
	} else if s.allowedForSession(ctx, id, req.Tool) {
		a.Status, a.Decision, a.DecidedBy, a.DecidedAt = belay.ApprovalDecided, belay.DecisionAllowSession, decidedByPolicy, now
		a.Reason = "allowed for the session by an earlier decision"
	}
	stored, err := s.store.CreateApproval(ctx, a)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, stored)
}

func policyName(p belay.ApprovalPolicy) string {
	if p == "" {
		return string(belay.PolicyDenyAll)
	}
	return string(p)
}

// allowedForSession reports whether a person already answered allow_session
// for this tool in this run; that answer covers the rest of the run.
func (s *Server) allowedForSession(ctx context.Context, runID, tool string) bool {
	list, err := s.store.ListApprovals(ctx, runID)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(list, func(a belay.Approval) bool {
		return a.Tool == tool && a.Status == belay.ApprovalDecided && a.Decision == belay.DecisionAllowSession
	})
}

func (s *Server) handleGetApprovalInternal(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceApprovals)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	aid, err := approvalID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	a, err := s.currentApproval(context.WithoutCancel(r.Context()), id, aid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, a)
}
