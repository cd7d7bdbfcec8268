package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/intake"
	"github.com/belay-dev/belay/internal/wire"
)

// Bounds of GET /v1/runs.
const (
	DefaultRunsLimit = 20
	MaxRunsLimit     = 100
)

// maxRunIDLen bounds a run id taken from a path; longer ones cannot exist.
const maxRunIDLen = 64

// runID returns the {id} path value, or not_found for one that cannot be a
// run id, so garbage never reaches the store.
func runID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if id == "" || len(id) > maxRunIDLen || !isIDText(id) {
		return "", belay.Errorf(belay.CodeNotFound, "run not found")
	}
	stateOf(r).runID = id
	return id, nil
}

// isIDText reports whether s holds only the characters of belay's ids.
func isIDText(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Server) handleCreateRun(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, int64(s.limits.MaxBodyBytes))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	key := r.Header.Get(wire.IdempotencyKeyHeader)
	if len(key) > wire.MaxIdempotencyKeyLen || !isPrintableASCII(key) {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, wire.IdempotencyKeyHeader,
			"must be at most %d printable ASCII characters", wire.MaxIdempotencyKeyLen))
		return
	}
	req, err := belay.ParseRunRequest(body, s.limits)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stored, _, err := s.intake.Create(r.Context(), intake.Request{Run: req, IdempotencyKey: key})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stateOf(r).runID = stored.ID
	links := wire.LinksFor(stored.ID)
	w.Header().Set("Location", links.Self)
	s.writeJSON(w, http.StatusAccepted, wire.CreateRunResponse{RunID: stored.ID, Status: stored.Status, Links: links})
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := s.store.GetRun(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, wire.ViewOf(run))
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := belay.ListRunsQuery{Status: belay.RunStatus(q.Get("status")), Cursor: q.Get("cursor")}
	if query.Status != "" && !query.Status.Valid() {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "status",
			"must be one of queued, running, completed, failed, cancelled"))
		return
	}
	limit, err := intParam(q.Get("limit"), "limit", DefaultRunsLimit, 1, MaxRunsLimit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	query.Limit = int(limit)
	page, err := s.store.ListRuns(r.Context(), query)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list := wire.RunList{Runs: make([]wire.RunView, 0, len(page.Runs)), NextCursor: page.NextCursor}
	for _, run := range page.Runs {
		list.Runs = append(list.Runs, wire.ViewOf(run))
	}
	s.writeJSON(w, http.StatusOK, list)
}

// intParam parses an optional integer query parameter: def when absent,
// invalid below lo or when not an integer, clamped to hi above it.
func intParam(v, name string, def, lo, hi int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo {
		return 0, belay.FieldErrorf(belay.CodeInvalid, name, "must be an integer of at least %d", lo)
	}
	return min(n, hi), nil
}

// handleCancel records the cancellation, revokes the capability at once (so
// model calls fail from this moment, whatever the sandbox does next), then
// asks the orchestrator to stop the sandbox. Every step is idempotent, so a
// caller that sees an error simply retries.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	id, err := runID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, 4<<10)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(body) > 0 {
		var none struct{}
		if err := decodeStrict(body, &none); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	run, err := s.cancelRun(context.WithoutCancel(r.Context()), r, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusAccepted, wire.ViewOf(run))
}

// cancelRun is the cancel sequence, shared with an approval decided
// "cancel". Returns conflict for a terminal run.
func (s *Server) cancelRun(ctx context.Context, r *http.Request, id string) (belay.Run, error) {
	return s.cancelRunID(ctx, stateOf(r).id, id)
}

// cancelRunID is cancelRun for a caller that is not an HTTP request (a
// session's stop, a WebSocket message); requestID names it in the log.
func (s *Server) cancelRunID(ctx context.Context, requestID, id string) (belay.Run, error) {
	run, err := s.store.RequestCancel(ctx, id, s.now())
	if err != nil {
		return belay.Run{}, err
	}
	if err := s.store.RevokeCapability(ctx, id); err != nil {
		return belay.Run{}, err
	}
	if err := s.orchestrator.Cancel(ctx, id); err != nil {
		s.log.Error("orchestrator cancel", "request_id", requestID, "run_id", id, "err", err.Error())
		return belay.Run{}, belay.Errorf(belay.CodeUnavailable,
			"cancellation is recorded and model calls are stopped, but the sandbox could not be stopped yet; retry the cancel")
	}
	return run, nil
}
