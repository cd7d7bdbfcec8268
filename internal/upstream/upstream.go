// Package upstream is the model proxy's port to the operator's model
// provider, and its OpenAI-compatible implementation.
//
// The sandbox speaks one format, OpenAI chat completions, whatever the
// provider. The proxy (internal/httpapi) checks the run token, validates and
// rewrites the body, and spends one request of the run's budget; only then
// does it hand the canonical chat-completions body to a Provider, which
// answers a chat.completion object or an *Error. A Provider never retries a
// call: the budget was spent once, so the provider is asked once.
//
// Three providers implement the port: OpenAI here (the body forwarded as it
// is, with the provider key), internal/anthropic (Anthropic's Messages API
// through its official SDK, with the key) and internal/bedrock (Amazon
// Bedrock's Converse API, signed with SigV4 by the caller's IAM
// credentials; there is no key). The two translating providers read the
// chat request through ParseChatRequest and write their answer with
// ChatCompletion.JSON, so the rules of the chat format live in one place.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// DefaultMaxResponseBytes is the cap on a provider's answer when the
// caller gives none.
const DefaultMaxResponseBytes = 4 << 20

// The provider kinds an operator can configure (BELAY_MODEL_PROVIDER).
const (
	KindOpenAI    = "openai"
	KindAnthropic = "anthropic"
	KindBedrock   = "bedrock"
)

// Kinds lists the provider kinds, the default first.
var Kinds = []string{KindOpenAI, KindAnthropic, KindBedrock}

// Provider sends one chat-completions call, already validated and paid for,
// to the operator's model provider and answers a chat.completion JSON
// object. It must not retry: a call is sent at most once, because the run's
// budget was spent once. The context carries the proxy's deadline.
//
// Complete returns an *Error for every failure: ErrKeyUnavailable when the
// credential could not be had (nothing was sent), ErrUnreachable when the
// provider gave no answer, ErrStatus for an HTTP error answer (401 included),
// ErrTooLarge, ErrMalformed for an answer that cannot be read, and
// ErrInvalid for a request the provider's format cannot express.
type Provider interface {
	Complete(ctx context.Context, call Call) ([]byte, error)
}

// Call is one chat-completions call.
type Call struct {
	// Body is the canonical chat-completions request the proxy built: only
	// known keys, the run's model, stream false, max tokens capped.
	Body []byte
	// MaxResponseBytes caps the provider's answer (the raw bytes it sends)
	// and the chat.completion answered; DefaultMaxResponseBytes when zero.
	MaxResponseBytes int64
}

// Limit returns the response cap in force for the call.
func (c Call) Limit() int64 {
	if c.MaxResponseBytes <= 0 {
		return DefaultMaxResponseBytes
	}
	return c.MaxResponseBytes
}

// ErrorKind says how a provider call failed. The proxy maps it to one of
// belay's error codes.
type ErrorKind int

// The ways a call fails.
const (
	// ErrKeyUnavailable: the provider key (or the AWS credentials) could
	// not be had; nothing was sent. The proxy answers unavailable.
	ErrKeyUnavailable ErrorKind = iota + 1
	// ErrUnreachable: the request could not be sent, or no answer came
	// (the deadline included). The proxy answers upstream_error.
	ErrUnreachable
	// ErrStatus: the provider answered an HTTP error status (Status). The
	// proxy answers upstream_error naming the status.
	ErrStatus
	// ErrTooLarge: the answer is larger than the call's cap.
	ErrTooLarge
	// ErrMalformed: the answer could not be read as the provider's
	// format.
	ErrMalformed
	// ErrInvalid: the request cannot be said in the provider's format
	// (Field names the part). The proxy answers invalid.
	ErrInvalid
)

// Error is a provider call's failure. Message is for the caller (the
// sandbox) and never holds the provider's answer body, the key or the
// prompt; Err is for the operator's log and follows the same rule.
type Error struct {
	Kind ErrorKind
	// Status is the provider's HTTP status when it answered, else 0.
	Status int
	// Field names the part of the request an ErrInvalid refers to.
	Field string
	// Message says what happened, in words a caller can act on.
	Message string
	// Err is the detail for the log, if any.
	Err error
}

// Error returns Message and, for the log, the detail.
func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

// Unwrap returns the detail.
func (e *Error) Unwrap() error { return e.Err }

// KeyUnavailable is the error of a call that could not get its credential;
// message says which ("the model provider key is unavailable").
func KeyUnavailable(message string, err error) *Error {
	return &Error{Kind: ErrKeyUnavailable, Message: message, Err: err}
}

// MsgKeyUnavailable is the message of a provider key that could not be had.
const MsgKeyUnavailable = "the model provider key is unavailable"

// Unreachable is the error of a call that got no answer.
func Unreachable(err error) *Error {
	return &Error{Kind: ErrUnreachable, Message: "could not reach the model provider", Err: err}
}

// StatusError is the error of an HTTP error answer. A 401 says the key was
// refused; every other status is named as it is, so an agent sees a 429 or
// a 5xx for what it is. detail (the provider's error type, a request id) is
// for the log only.
func StatusError(status int, detail error) *Error {
	msg := fmt.Sprintf("the model provider answered HTTP %d", status)
	if status == http.StatusUnauthorized {
		msg = "the model provider refused the key (HTTP 401)"
	}
	return &Error{Kind: ErrStatus, Status: status, Message: msg, Err: detail}
}

// TooLarge is the error of an answer over limit bytes.
func TooLarge(status int, limit int64) *Error {
	return &Error{Kind: ErrTooLarge, Status: status,
		Message: fmt.Sprintf("the model provider's answer is larger than %d bytes", limit)}
}

// NotJSON is the error of an answer that is not a JSON object.
func NotJSON(status int) *Error {
	return &Error{Kind: ErrMalformed, Status: status, Message: "the model provider's answer is not a JSON object"}
}

// Malformed is the error of an answer that is JSON but not what the
// provider's format says; err (no body content) goes to the log.
func Malformed(status int, err error) *Error {
	return &Error{Kind: ErrMalformed, Status: status, Message: "the model provider's answer could not be read", Err: err}
}

// Invalid is the error of a request the provider's format cannot express.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Kind: ErrInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error; anything else is a call that got no
// answer.
func AsError(err error) *Error {
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	return Unreachable(err)
}
