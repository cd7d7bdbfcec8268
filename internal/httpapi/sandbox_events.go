package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// sandboxBatchPrefix namespaces the sandbox's batch ids in the store, apart
// from the control plane's own (see budgetExhaustedBatch), so a sandbox
// cannot pre-empt one of them by reusing its id.
const sandboxBatchPrefix = "sandbox:"

// handleAppendEvents appends a batch of the sandbox's events, marked as the
// sandbox's (belay.SourceSandbox) and counted against the run's caps
// (Config.SandboxEventLimits; past them the batch is refused with
// too_large, naming the cap). Only the types in belay.SandboxEventTypes are
// accepted: everything else (a terminal state, a decision) is the control
// plane's to write. Nor may a sandbox report a final check
// (check.finished with "final" set): the control plane records the final
// checks from the bundle it validated, when it finalizes the run.
func (s *Server) handleAppendEvents(w http.ResponseWriter, r *http.Request) {
	id, err := s.sandboxRunID(r, token.AudienceEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, wire.MaxBatchBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var batch wire.EventBatch
	if err := decodeStrict(body, &batch); err != nil {
		s.writeError(w, r, err)
		return
	}
	if batch.BatchID == "" || len(batch.BatchID) > wire.MaxBatchIDLen || !isPrintableASCII(batch.BatchID) {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "batchId",
			"must be 1 to %d printable ASCII characters", wire.MaxBatchIDLen))
		return
	}
	if len(batch.Events) == 0 || len(batch.Events) > wire.MaxBatchEvents {
		s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, "events", "must hold 1 to %d events", wire.MaxBatchEvents))
		return
	}
	now := s.now()
	for i := range batch.Events {
		e := &batch.Events[i]
		if !slices.Contains(belay.SandboxEventTypes, e.Type) {
			s.writeError(w, r, belay.FieldErrorf(belay.CodeForbidden, fieldIndex("events", i, "type"),
				"a sandbox may only append %v", belay.SandboxEventTypes))
			return
		}
		data := bytes.TrimSpace(e.Data)
		if len(data) == 0 || bytes.Equal(data, []byte("null")) {
			e.Data = nil
		} else if data[0] != '{' {
			s.writeError(w, r, belay.FieldErrorf(belay.CodeInvalid, fieldIndex("events", i, "data"), "must be a JSON object"))
			return
		} else {
			e.Data = data
		}
		if e.Type == belay.EventCheckFinished && claimsFinal(e.Data) {
			s.writeError(w, r, belay.FieldErrorf(belay.CodeForbidden, fieldIndex("events", i, "data.final"),
				"a sandbox may not report a final check; the control plane records the final checks from the result bundle it validates"))
			return
		}
		if e.Time.IsZero() {
			e.Time = now
		}
	}
	stored, err := s.store.AppendSandboxEvents(context.WithoutCancel(r.Context()), id, sandboxBatchPrefix+batch.BatchID, batch.Events, s.sandboxEvents)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, wire.EventBatchResponse{Events: wire.NonNil(stored)})
}

func fieldIndex(list string, i int, field string) string {
	return list + "[" + strconv.Itoa(i) + "]." + field
}

// claimsFinal reports whether a check.finished event's data has a member
// "final" (in any letter case, as Go's decoder would match it) whose value
// is anything but false: what a reader could take for the control plane's
// final check.
func claimsFinal(data []byte) bool {
	if len(data) == 0 {
		return false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		// Not JSON: the store refuses it as invalid.
		return false
	}
	for k, v := range m {
		if strings.EqualFold(k, "final") && !bytes.Equal(bytes.TrimSpace(v), []byte("false")) {
			return true
		}
	}
	return false
}
