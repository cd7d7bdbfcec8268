// Package httpapi is belay's HTTP adapter: one http.Handler that serves the
// public API (runs, events, approvals, cancel, artifacts) and the internal
// API the sandbox calls (model proxy, event append, approvals), for the
// embedded server and, wrapped, for Lambda. The contract is DESIGN.md "API
// contract (v1)"; this comment records the decisions it leaves open.
//
// Every answer carries X-Request-Id, Cache-Control: no-store and
// X-Content-Type-Options: nosniff. Every error is
// {"error":{"code","message","requestId"}}, with the status from HTTPStatus.
// An error without a code is answered "internal error" and logged with the
// request id and run id; nothing else is logged at error level, except
// operator problems (a missing provider key, an orchestrator that refuses).
// Every JSON body is decoded strictly: unknown fields and trailing data are
// invalid. An unknown route or method is 404 not_found; under /v1 the
// control-plane token is checked first, so routes cannot be probed without it.
//
// Public routes need "Authorization: Bearer <control-plane token>"
// (401 unauthorized otherwise).
//
//   - POST /v1/runs: the body is read up to Limits.MaxBodyBytes (413
//     too_large beyond), parsed by belay.ParseRunRequest, stored queued,
//     then handed to Orchestrator.Submit. 202 with CreateRunResponse and a
//     Location header. If Submit fails the run is marked failed and the
//     answer is 503 unavailable. Idempotency-Key (at most 255 printable
//     ASCII bytes) makes a retry return the same run; another body under
//     the same key is 409 conflict.
//   - GET /v1/runs/{id}: RunView, which leaves out file contents and the
//     instruction.
//   - GET /v1/runs?status=&limit=&cursor=: RunList, newest first; limit
//     defaults to 20 and is clamped to 100.
//   - GET /v1/runs/{id}/events?after=&limit=: NDJSON, one belay.Event a
//     line; limit defaults to 500 and is clamped to 2000. Headers
//     Belay-Last-Seq and Belay-Run-Terminal tell a pager where the log ends.
//     When the reader asked for events the bounded buffer no longer keeps,
//     the first line is {"type":"events.missed","data":{"oldestSeq":N}},
//     with no seq: events after `after` and before N are gone.
//   - The same route with "Accept: text/event-stream" or ?stream=1 is an
//     SSE stream: "id:" is the seq, "event:" the type, "data:" the event's
//     JSON. Last-Event-ID, when sent, wins over ?after. A missed range is
//     reported in-band as "event: events.missed" (no id) with data
//     {"oldestSeq":N}. A ": ping" comment goes out whenever the stream has
//     been quiet for Config.HeartbeatInterval. The stream ends after the
//     run's terminal event. A store failure mid-stream ends it with an
//     "event: error" whose data is the usual error body.
//   - GET /v1/runs/{id}/approvals: ApprovalList. Pending approvals past
//     their expiry are first decided deny by "timeout".
//   - POST /v1/runs/{id}/approvals/{approvalId}: DecisionRequest. 409 if
//     already decided, including by timeout. A "cancel" decision also
//     cancels the run.
//   - POST /v1/runs/{id}/cancel: empty body or {}. Records the request,
//     revokes the capability at once (model calls fail from that moment),
//     then calls Orchestrator.Cancel. 202 with RunView; idempotent; 409 on a
//     terminal run; 503 if the orchestrator could not stop the sandbox (the
//     cancellation and revocation stand; retry).
//   - GET /v1/runs/{id}/artifacts: ArtifactList (names and sizes).
//   - GET /v1/runs/{id}/artifacts/{name}: the content, for the names in
//     belay.ArtifactNames, typed by extension and served as an attachment.
//
// Internal routes each need the run token of their audience. A refused
// token is 401 inactive_run_token on the model proxy (as the sandbox's
// OpenAI client expects one answer for "stop calling") and 401 unauthorized
// on the event and approval routes; the reason is logged, never answered.
//
//   - POST /internal/v1/chat/completions (model token): in this order, each
//     refusal stopping before the next, (1) the token (the run id comes from
//     it, the model must be Limits.Model), (2) the body, (3) one request of
//     the run's budget (429 model_request_budget_exhausted and one
//     budget.exhausted event when spent), (4) only then the provider key
//     and the upstream call; an upstream failure, timeout, oversize or
//     non-JSON answer is 502 upstream_error, whose message names the HTTP
//     status but never quotes the upstream. The accepted top-level keys
//     are ChatRequestKeys; the forwarded body is re-encoded, with the
//     run's model, "stream": false, no stream_options, and max_tokens and
//     max_completion_tokens capped at MaxCompletionTokens (a call that sets
//     neither gets max_completion_tokens). The answer is the upstream's JSON.
//     Every call that spent budget counts one model request in the run's
//     usage, whether or not the upstream answered.
//   - POST /internal/v1/runs/{id}/events (events token): EventBatch, at most
//     MaxBatchEvents events and MaxBatchBytes. A type outside
//     belay.SandboxEventTypes is 403 forbidden. 200 with EventBatchResponse;
//     409 once the run has ended.
//   - POST /internal/v1/runs/{id}/approvals (approvals token):
//     ApprovalRequest; 201 with the belay.Approval, decided at once by the
//     run's policy, or by an earlier allow_session for the same tool, and
//     otherwise pending until a person decides or it times out.
//   - GET /internal/v1/runs/{id}/approvals/{approvalId} (approvals token):
//     the belay.Approval, with the timeout applied.
//
// Server.InternalHandler serves only the internal routes, for the sandbox's
// Unix socket.
package httpapi
