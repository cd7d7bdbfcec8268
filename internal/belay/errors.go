// Package belay holds belay's domain: run requests and their validation, run
// sessions, capabilities, events, approvals, result bundles, the application
// error type, and the ports (interfaces) that adapters implement. It imports
// neither the AWS SDK nor net/http.
package belay

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code. Clients branch on it; the
// HTTP adapter maps it to a status code in one table.
type Code string

// The error codes belay answers with. New codes are added sparingly: clients
// depend on this set.
const (
	CodeInvalid          Code = "invalid"
	CodeTooLarge         Code = "too_large"
	CodeUnauthorized     Code = "unauthorized"
	CodeForbidden        Code = "forbidden"
	CodeNotFound         Code = "not_found"
	CodeConflict         Code = "conflict"
	CodeBudgetExhausted  Code = "model_request_budget_exhausted"
	CodeInactiveRunToken Code = "inactive_run_token"
	CodeEventsExpired    Code = "events_expired"
	CodeUpstream         Code = "upstream_error"
	CodeUnavailable      Code = "unavailable"
	CodeInternal         Code = "internal"
)

// Error is belay's application error: a stable code, a message a person can
// act on, and optionally the request field it concerns. Messages never carry
// tokens, keys or file contents.
type Error struct {
	Code    Code
	Field   string
	Message string
}

// Error renders the message, prefixed by the field when there is one.
func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldErrorf builds an *Error about one request field, named in JSON terms
// (for example "files[3].path").
func FieldErrorf(code Code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or
// CodeInternal when there is none. A nil error has no code.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the user-facing message of err: the *Error's text, or
// "internal error" for anything without a code, so that internal details
// never reach a caller.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != CodeInternal {
		return e.Error()
	}
	return "internal error"
}

// IsCode reports whether err carries the given code.
func IsCode(err error, code Code) bool {
	return err != nil && ErrorCode(err) == code
}
