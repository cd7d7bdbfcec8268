package httpapi

import (
	"context"
	"net/http"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
)

// handlePutOutput takes one of a sandbox's outputs (PUT
// /internal/v1/runs/{id}/outputs/{name}, events audience): result.json,
// patch.diff or transcript.jsonl, at most belay.MaxArtifactBytes. It is
// stored under the name staged for the run's current attempt
// (belay.StagedOutputName), which callers never see; the orchestrator
// reads it after the sandbox has exited, validates it and only then
// stores it under its public name. A run that is over, or whose capability
// was revoked (its sandbox is gone), takes no more uploads. A repeated
// upload replaces the earlier one: the entry uploads once, at its end,
// after it has killed every command it started.
func (s *Server) handlePutOutput(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	if !belay.IsPublicArtifact(name) {
		s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "a sandbox uploads only %v", belay.ArtifactNames))
		return
	}
	body, err := readBody(w, r, belay.MaxArtifactBytes)
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
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s is %s; it takes no outputs", id, run.Status))
		return
	}
	capability, err := s.store.GetCapability(ctx, id)
	if err != nil && !belay.IsCode(err, belay.CodeNotFound) {
		s.writeError(w, r, err)
		return
	}
	if err != nil || capability.State != belay.CapabilityActive {
		s.writeError(w, r, belay.Errorf(belay.CodeConflict, "run %s has ended its sandbox; it takes no outputs", id))
		return
	}
	if err := s.artifacts.PutArtifact(ctx, id, belay.StagedOutputName(run.Attempt, name), body); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Debug("sandbox output stored", "request_id", stateOf(r).id, "run_id", id, "output", name,
		"attempt", run.Attempt, "size", len(body))
	w.WriteHeader(http.StatusNoContent)
}
