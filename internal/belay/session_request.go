package belay

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode/utf8"
)

// sessionPlaceholderInstruction stands in for a turn's text when a session
// request is validated as a run request: the text comes with each message.
const sessionPlaceholderInstruction = "(the text of each turn)"

// sessionWire is the body of POST /v1/sessions as a caller may send it.
type sessionWire struct {
	Model    *string `json:"model"`
	Approval *struct {
		Policy         *string  `json:"policy"`
		Allow          []string `json:"allow"`
		TimeoutSeconds *int     `json:"timeoutSeconds"`
	} `json:"approval"`
	Source *struct {
		Files []File `json:"files"`
		Git   *struct {
			URL string `json:"url"`
			Ref string `json:"ref"`
		} `json:"git"`
	} `json:"source"`
	AllowedPaths    []string   `json:"allowedPaths"`
	Checks          [][]string `json:"checks"`
	Skills          []Skill    `json:"skills"`
	MaxSteps        *int       `json:"maxSteps"`
	WallTimeSeconds *int       `json:"wallTimeSeconds"`
}

// ParseSessionRequest decodes the body of POST /v1/sessions strictly
// (unknown fields, trailing data, invalid UTF-8 and numbers that are not
// integers are refused) and validates it as every turn's run request will
// be validated (Limits.Validate: files, allowedPaths, checks, limits per
// turn, approval), and its skills (CheckSkills). A body over
// lim.MaxBodyBytes is too_large; everything else wrong is invalid, naming
// the field.
func ParseSessionRequest(body []byte, lim Limits) (SessionRequest, error) {
	if len(body) > lim.MaxBodyBytes {
		return SessionRequest{}, Errorf(CodeTooLarge, "request body is %d bytes; at most %d bytes are allowed", len(body), lim.MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return SessionRequest{}, Errorf(CodeInvalid, "request body is not valid UTF-8; send UTF-8 text")
	}
	if off := loneSurrogateOffset(body); off >= 0 {
		return SessionRequest{}, Errorf(CodeInvalid, "request body has a \\u escape of a lone UTF-16 surrogate at byte %d; strings must be valid Unicode", off)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var w sessionWire
	if err := dec.Decode(&w); err != nil {
		return SessionRequest{}, sessionJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return SessionRequest{}, Errorf(CodeInvalid, "request body has data after the JSON object; send exactly one object")
	}
	run := RunRequest{Instruction: sessionPlaceholderInstruction, AllowedPaths: w.AllowedPaths, Checks: w.Checks}
	switch {
	case w.Source == nil:
		return SessionRequest{}, FieldErrorf(CodeInvalid, "source", `is required: {"files": [...]} or {"git": {"url", "ref"}}`)
	case (len(w.Source.Files) > 0) == (w.Source.Git != nil):
		return SessionRequest{}, FieldErrorf(CodeInvalid, "source", `must hold exactly one of "files" and "git"`)
	case w.Source.Git != nil:
		run.Source = &Source{Git: &GitSource{URL: w.Source.Git.URL, Ref: w.Source.Git.Ref}}
	default:
		run.Files = w.Source.Files
	}
	if w.Model != nil {
		if err := lim.checkModel(*w.Model); err != nil {
			return SessionRequest{}, err
		}
		run.Model = *w.Model
	}
	for name, v := range map[string]*int{"maxSteps": w.MaxSteps, "wallTimeSeconds": w.WallTimeSeconds} {
		if v != nil && *v < 1 {
			return SessionRequest{}, FieldErrorf(CodeInvalid, name, "must be at least 1")
		}
	}
	if w.MaxSteps != nil {
		run.MaxSteps = *w.MaxSteps
	}
	if w.WallTimeSeconds != nil {
		run.WallTimeSeconds = *w.WallTimeSeconds
	}
	if a := w.Approval; a != nil {
		if a.Policy != nil {
			if err := checkPolicy(ApprovalPolicy(*a.Policy)); err != nil {
				return SessionRequest{}, err
			}
			run.Approval.Policy = ApprovalPolicy(*a.Policy)
		}
		run.Approval.Allow = a.Allow
		if a.TimeoutSeconds != nil {
			if *a.TimeoutSeconds < 1 {
				return SessionRequest{}, FieldErrorf(CodeInvalid, "approval.timeoutSeconds", "must be at least 1")
			}
			run.Approval.TimeoutSeconds = *a.TimeoutSeconds
		}
	}
	canon, err := lim.Validate(run)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && strings.HasPrefix(e.Field, "files") {
			e2 := *e
			e2.Field = "source." + e.Field
			return SessionRequest{}, &e2
		}
		return SessionRequest{}, err
	}
	if err := CheckSkills(w.Skills); err != nil {
		return SessionRequest{}, err
	}
	return SessionRequest{
		Model: canon.Model, Files: canon.Files, Source: canon.Source, AllowedPaths: canon.AllowedPaths,
		Checks: canon.Checks, MaxSteps: canon.MaxSteps, WallTimeSeconds: canon.WallTimeSeconds,
		Approval: canon.Approval, Skills: w.Skills,
	}, nil
}

// TurnRequest is the run request of a session's turn: the session's
// request with text as the instruction and turn as its context. The
// caller sets the source (the session's, or its workspace after the
// earlier turns) and validates the result (Limits.Validate).
func (r SessionRequest) TurnRequest(text string, turn TurnContext) RunRequest {
	return RunRequest{
		Instruction: text, Model: r.Model, Files: r.Files, Source: r.Source,
		AllowedPaths: r.AllowedPaths, Checks: r.Checks, MaxSteps: r.MaxSteps,
		WallTimeSeconds: r.WallTimeSeconds, Approval: r.Approval, Turn: &turn,
	}
}

// sessionJSONError turns a decoding error into invalid with a message a
// person can act on.
func sessionJSONError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return Errorf(CodeInvalid, "request body is not valid JSON (at byte %d)", syn.Offset)
	case errors.As(err, &typ):
		return FieldErrorf(CodeInvalid, typ.Field, "has the wrong JSON type (%s); see the API contract", typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return Errorf(CodeInvalid, "request body has an unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	case errors.Is(err, io.EOF):
		return Errorf(CodeInvalid, "request body is empty; send a JSON object")
	}
	return Errorf(CodeInvalid, "request body is not a valid session request")
}
