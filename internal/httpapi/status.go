package httpapi

import (
	"net/http"

	"github.com/belay-dev/belay/internal/belay"
)

// HTTPStatus maps an error code to its HTTP status: the one table the server
// answers by. A code it does not know is an internal error.
func HTTPStatus(code belay.Code) int {
	switch code {
	case belay.CodeInvalid:
		return http.StatusBadRequest
	case belay.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case belay.CodeUnauthorized, belay.CodeInactiveRunToken:
		return http.StatusUnauthorized
	case belay.CodeForbidden:
		return http.StatusForbidden
	case belay.CodeNotFound:
		return http.StatusNotFound
	case belay.CodeConflict:
		return http.StatusConflict
	case belay.CodeBudgetExhausted:
		return http.StatusTooManyRequests
	case belay.CodeEventsExpired:
		return http.StatusGone
	case belay.CodeUpstream:
		return http.StatusBadGateway
	case belay.CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
