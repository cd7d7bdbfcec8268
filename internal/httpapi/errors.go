package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// writeError answers err in the one error shape. Anything without a code is
// internal: the caller gets "internal error" and the request id, and the
// log gets the detail. Only internal errors are logged at error level.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r)
	code := belay.ErrorCode(err)
	if code == belay.CodeInternal {
		s.log.Error("internal error", "request_id", st.id, "run_id", st.runID,
			"method", r.Method, "path", r.URL.Path, "err", err.Error())
	} else {
		// The message is the caller's to read; it may quote a path or a
		// value from the request, so the log keeps the code and field only.
		var field string
		if e, ok := errors.AsType[*belay.Error](err); ok {
			field = e.Field
		}
		s.log.Debug("request refused", "request_id", st.id, "run_id", st.runID,
			"code", string(code), "field", field)
	}
	s.writeJSON(w, HTTPStatus(code), wire.ErrorBody{Error: wire.ErrorDetail{
		Code:      code,
		Message:   belay.ErrorMessage(err),
		RequestID: st.id,
	}})
}

// writeJSON answers v as JSON with the given status.
func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only a programming error gets here; the types are ours.
		s.log.Error("encode answer", "request_id", w.Header().Get(wire.RequestIDHeader), "err", err.Error())
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal","message":"internal error","requestId":"` + w.Header().Get(wire.RequestIDHeader) + `"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// readBody reads the whole body up to limit bytes; more is too_large.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, belay.Errorf(belay.CodeTooLarge, "request body is larger than %d bytes", limit)
		}
		return nil, belay.Errorf(belay.CodeInvalid, "could not read the request body")
	}
	return body, nil
}

// decodeStrict decodes one JSON value from body into v, refusing unknown
// fields (at every level of v's struct types) and anything after the value.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return belay.Errorf(belay.CodeInvalid, "request body is not valid: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return belay.Errorf(belay.CodeInvalid, "request body has data after the JSON value")
	}
	return nil
}

// jsonProblem describes a decode error without quoting the input.
func jsonProblem(err error) string {
	if e, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if e.Field != "" {
			return fmt.Sprintf("field %q must be %s", e.Field, jsonKind(e.Type.Kind().String()))
		}
		return "wrong JSON type"
	}
	if e, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("malformed JSON at byte %d", e.Offset)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated or empty JSON"
	}
	// The remaining decoder errors name an unknown field or similar and
	// quote no values. The name is the caller's own, clipped so that a
	// long one cannot make the answer large.
	return clip(strings.TrimPrefix(err.Error(), "json: "), maxProblemLen)
}

// maxProblemLen bounds the decoder's own words in an error message.
const maxProblemLen = 200

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	case "int", "int64", "int32", "uint", "uint64", "uint32":
		return "an integer"
	case "float64", "float32":
		return "a number"
	}
	return "of another type"
}
