package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// handlePutCheckpoint stores one of a sandbox's checkpoints (PUT
// /internal/v1/runs/{id}/checkpoints/{seq}, events audience): a
// wire.Checkpoint of at most belay.MaxCheckpointBytes, for the run's
// current attempt, newer than the one the run points at. It is stored in
// the artifact store under belay.CheckpointArtifactName (never listed to
// callers), the run is pointed at it (RecordCheckpoint), and the
// checkpoint it pointed at before is deleted. Repeating the last upload
// changes nothing. A run that is over, at another attempt, or whose
// capability was revoked (its sandbox is being stopped), takes none (409),
// and nothing is left behind for a refused one.
func (s *Server) handlePutCheckpoint(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq < 1 || strconv.FormatInt(seq, 10) != r.PathValue("seq") {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "seq", "must be a whole number above 0"))
		return
	}
	body, err := readBody(w, r, belay.MaxCheckpointBytes)
	if belay.IsCode(err, belay.CodeTooLarge) {
		err = belay.Errorf(belay.CodeTooLarge, "a checkpoint may be at most %d bytes (the checkpoint cap); save a smaller one or mark the run unresumable", belay.MaxCheckpointBytes)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// What the control plane reads of it; the agent's state and the
	// workspace change are checked for JSON, not built.
	var c struct {
		wire.Checkpoint
		Agent     json.RawMessage `json:"agent,omitempty"`
		Workspace json.RawMessage `json:"workspace"`
	}
	if err := decodeStrict(body, &c); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := checkCheckpoint(c.Checkpoint, id, seq); err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch {
	case run.Status != belay.StatusRunning:
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s is %s; it takes no checkpoints", id, run.Status))
		return
	case run.Attempt != c.Attempt:
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s is at attempt %d; a sandbox of attempt %d saves no checkpoints", id, run.Attempt, c.Attempt))
		return
	}
	capability, err := s.store.GetCapability(ctx, id)
	if err != nil && !belay.IsCode(err, belay.CodeNotFound) {
		s.writeError(w, r, err)
		return
	}
	if err != nil || capability.State != belay.CapabilityActive {
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s has ended its sandbox; it takes no checkpoints", id))
		return
	}
	ref := belay.CheckpointRef{Seq: seq, Attempt: c.Attempt, Step: c.Step, Size: int64(len(body)), At: s.now(), Unresumable: c.Unresumable}
	if c.Pending != nil {
		ref.Pending = c.Pending.Name
	}
	if err := s.artifacts.PutArtifact(ctx, id, ref.Name(), body); err != nil {
		s.writeError(w, r, err)
		return
	}
	previous, err := s.store.RecordCheckpoint(ctx, id, ref)
	if err != nil {
		if cur, gerr := s.store.GetRun(ctx, id); gerr != nil || cur.Checkpoint == nil || cur.Checkpoint.Name() != ref.Name() {
			// Refused (a newer one is there, or the run moved on): what
			// was just written is no one's.
			if derr := s.artifacts.DeleteArtifact(ctx, id, ref.Name()); derr != nil {
				s.log.Warn("delete a refused checkpoint", "request_id", stateOf(r).id, "run_id", id, "seq", seq, "err", derr.Error())
			}
		}
		s.writeError(w, r, err)
		return
	}
	if previous.Seq != 0 && previous.Name() != ref.Name() {
		if err := s.artifacts.DeleteArtifact(ctx, id, previous.Name()); err != nil {
			s.log.Warn("prune the checkpoint a newer one replaced", "request_id", stateOf(r).id, "run_id", id,
				"seq", previous.Seq, "err", err.Error())
		}
	}
	s.log.Debug("checkpoint stored", "request_id", stateOf(r).id, "run_id", id, "attempt", c.Attempt, "seq", seq,
		"step", c.Step, "pending", ref.Pending, "size", len(body), "resumable", ref.Resumable())
	w.WriteHeader(http.StatusNoContent)
}

// checkCheckpoint checks what the control plane reads of a checkpoint:
// its version, that it is the run's and seq's, and its bounds.
func checkCheckpoint(c wire.Checkpoint, runID string, seq int64) error {
	switch {
	case c.Version != wire.CheckpointVersion:
		return belay.FieldErrorf(belay.CodeInvalid, "version", "must be %d", wire.CheckpointVersion)
	case c.RunID != runID:
		return belay.FieldErrorf(belay.CodeInvalid, "runId", "must be the run of the route")
	case c.Seq != seq:
		return belay.FieldErrorf(belay.CodeInvalid, "seq", "must be the seq of the route")
	case c.Attempt < 1:
		return belay.FieldErrorf(belay.CodeInvalid, "attempt", "must be at least 1")
	case c.Step < 0:
		return belay.FieldErrorf(belay.CodeInvalid, "step", "must not be negative")
	case c.Pending != nil && (c.Pending.Name == "" || len(c.Pending.Name) > belay.MaxPendingToolLen):
		return belay.FieldErrorf(belay.CodeInvalid, "pending.name", "must be 1 to %d bytes", belay.MaxPendingToolLen)
	case len(c.Unresumable) > belay.MaxUnresumableLen || strings.ContainsRune(c.Unresumable, 0):
		return belay.FieldErrorf(belay.CodeInvalid, "unresumable", "must be at most %d bytes of text", belay.MaxUnresumableLen)
	}
	return nil
}

// handleGetLatestCheckpoint answers the run's latest checkpoint (GET
// /internal/v1/runs/{id}/checkpoints/latest, events audience), as its
// sandbox saved it: what the sandbox of a resumed attempt continues from.
// Returns not_found when the run has none; conflict when it is not
// running.
func (s *Server) handleGetLatestCheckpoint(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if run.Status != belay.StatusRunning {
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s is %s", id, run.Status))
		return
	}
	if run.Checkpoint == nil {
		s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "run %s has no checkpoint", id))
		return
	}
	body, err := s.artifacts.GetArtifact(ctx, id, run.Checkpoint.Name())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Last-Modified", run.Checkpoint.At.UTC().Format(time.RFC1123))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
