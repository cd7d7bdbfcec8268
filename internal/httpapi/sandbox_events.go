package httpapi

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strconv"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
	"github.com/belay-dev/belay/internal/wire"
)

// sandboxBatchPrefix namespaces the sandbox's batch ids in the store, apart
// from the control plane's own (see budgetExhaustedBatch), so a sandbox
// cannot pre-empt one of them by reusing its id.
const sandboxBatchPrefix = "sandbox:"

// handleAppendEvents appends a batch of the sandbox's events. Only the types
// in belay.SandboxEventTypes are accepted: everything else (a terminal
// state, a decision) is the control plane's to write.
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
		if e.Time.IsZero() {
			e.Time = now
		}
	}
	stored, err := s.store.AppendEvents(context.WithoutCancel(r.Context()), id, sandboxBatchPrefix+batch.BatchID, batch.Events)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, wire.EventBatchResponse{Events: wire.NonNil(stored)})
}

func fieldIndex(list string, i int, field string) string {
	return list + "[" + strconv.Itoa(i) + "]." + field
}
