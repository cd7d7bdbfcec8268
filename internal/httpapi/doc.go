// Package httpapi is belay's HTTP adapter: one http.Handler that serves the
// public API (runs, events, approvals, cancel, artifacts) and the internal
// API the sandbox calls (model proxy, event append, approvals), for the
// embedded server and, wrapped, for Lambda. See DESIGN.md "API contract (v1)".
package httpapi
