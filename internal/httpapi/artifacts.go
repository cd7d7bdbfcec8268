package httpapi

import (
	"net/http"
	"path"
	"slices"
	"strconv"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// artifactTypes gives each artifact's content type by extension. Nothing a
// browser would render as active content is ever served.
var artifactTypes = map[string]string{
	".json":  "application/json",
	".diff":  "text/x-diff; charset=utf-8",
	".jsonl": "application/x-ndjson",
}

func (s *Server) handleListArtifacts(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The artifact store knows no runs; ask the run store so an unknown
	// run is a 404, not an empty list.
	if _, err := s.store.GetRun(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.artifacts.ListArtifacts(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The sandbox's staged outputs are not the run's artifacts until the
	// control plane has validated them; only what it stored is listed.
	list = slices.DeleteFunc(list, func(a belay.ArtifactInfo) bool { return !belay.IsPublicArtifact(a.Name) })
	s.writeJSON(w, http.StatusOK, wire.ArtifactList{Artifacts: wire.NonNil(list)})
}

func (s *Server) handleGetArtifact(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	name := r.PathValue("name")
	if !slices.Contains(belay.ArtifactNames, name) {
		s.writeError(w, r, belay.Errorf(belay.CodeNotFound, "artifact not found; a run has %v", belay.ArtifactNames))
		return
	}
	content, err := s.artifacts.GetArtifact(r.Context(), id, name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ct, ok := artifactTypes[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Content-Length", strconv.Itoa(len(content)))
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(content)
}
