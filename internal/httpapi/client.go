package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Defaults of the client's options.
const (
	// DefaultReconnectBackoff is the first wait before an event stream
	// reconnects; each failed attempt doubles it up to
	// DefaultMaxReconnectBackoff.
	DefaultReconnectBackoff    = 250 * time.Millisecond
	DefaultMaxReconnectBackoff = 10 * time.Second
	// DefaultStreamIdleTimeout is how long an event stream may stay silent
	// before the client takes the connection for dead and reconnects: three
	// missed heartbeats.
	DefaultStreamIdleTimeout = 3 * DefaultHeartbeatInterval
)

// maxJSONAnswer caps a JSON answer the client reads; the largest the server
// sends is a page of runs, far below it.
const maxJSONAnswer = 16 << 20

// maxErrorAnswer caps the body of an error answer the client reads.
const maxErrorAnswer = 64 << 10

// maxSSELine caps one line of an event stream: an event's JSON, whose data
// comes from a batch of at most MaxBatchBytes.
const maxSSELine = 2 * wire.MaxBatchBytes

// Client calls belay's public API (DESIGN.md "API contract (v1)") with the
// control-plane token. The CLI is built on it, so it speaks exactly the wire
// types the server answers with. It is safe for concurrent use.
type Client struct {
	base        *url.URL
	token       string
	hc          *http.Client
	userAgent   string
	backoff     time.Duration
	maxBackoff  time.Duration
	idleTimeout time.Duration
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithHTTPClient sends the calls through hc instead of a client of its own,
// for custom transports or proxies. hc's Timeout, if any, also bounds event
// streams, which are long by design; prefer contexts.
func WithHTTPClient(hc *http.Client) ClientOption {
	return func(c *Client) { c.hc = hc }
}

// WithUserAgent sets the User-Agent header, so the server's logs can tell
// callers apart.
func WithUserAgent(ua string) ClientOption {
	return func(c *Client) { c.userAgent = ua }
}

// WithReconnectBackoff sets the first and the longest wait between the
// reconnects of an event stream. Values of zero or less keep the defaults.
func WithReconnectBackoff(initial, maximum time.Duration) ClientOption {
	return func(c *Client) {
		if initial > 0 {
			c.backoff = initial
		}
		if maximum > 0 {
			c.maxBackoff = maximum
		}
	}
}

// WithStreamIdleTimeout sets how long an event stream may stay silent
// (no event and no heartbeat) before the client reconnects. Zero or less
// keeps DefaultStreamIdleTimeout.
func WithStreamIdleTimeout(d time.Duration) ClientOption {
	return func(c *Client) {
		if d > 0 {
			c.idleTimeout = d
		}
	}
}

// NewClient returns a client of the API at endpoint (for example
// "http://127.0.0.1:8700" or an API Gateway stage URL) that authenticates
// with token. The endpoint must be https, or plain http to a loopback
// address, so the token never crosses a network in clear; it must carry no
// credentials, query or fragment. Errors never repeat the token.
func NewClient(endpoint, token string, opts ...ClientOption) (*Client, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil || endpoint == "":
		return nil, errors.New("belay endpoint is not a valid URL; write it like https://belay.example.com or http://127.0.0.1:8700")
	case u.Opaque != "" || u.Scheme == "" || u.Host == "":
		return nil, fmt.Errorf("belay endpoint %q must be an absolute URL with a scheme and a host", endpoint)
	case u.User != nil:
		return nil, errors.New("belay endpoint must not carry credentials; the token is sent as a bearer token")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("belay endpoint %q must not have a query or a fragment", endpoint)
	case u.Scheme == "http" && !IsLoopbackHost(u.Hostname()):
		return nil, fmt.Errorf("belay endpoint %q must use https: plain http is only for a loopback address, so the token never crosses a network in clear", endpoint)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("belay endpoint %q must use https (or http to a loopback address)", endpoint)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return nil, errors.New("no control-plane token: set BELAY_TOKEN or give the token file of the server")
	}
	if strings.ContainsAny(token, "\r\n\x00") {
		return nil, errors.New("the control-plane token holds a control character; check where it was read from")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	c := &Client{
		base:        u,
		token:       token,
		hc:          http.DefaultClient,
		userAgent:   "belay-go-client",
		backoff:     DefaultReconnectBackoff,
		maxBackoff:  DefaultMaxReconnectBackoff,
		idleTimeout: DefaultStreamIdleTimeout,
	}
	for _, opt := range opts {
		opt(c)
	}
	if c.maxBackoff < c.backoff {
		c.maxBackoff = c.backoff
	}
	return c, nil
}

// Endpoint returns the API's base URL, for messages.
func (c *Client) Endpoint() string { return c.base.String() }

// APIError is an error answer of the API: the server's stable code and
// message, and the request id that ties it to the server's log line. It
// unwraps to a *belay.Error with the same code and message, so callers
// branch with belay.ErrorCode or belay.IsCode as they would on the server.
type APIError struct {
	// Status is the HTTP status, or 0 for an error sent inside an event
	// stream after its status line.
	Status    int
	Code      belay.Code
	Message   string
	RequestID string
}

// Error reads "<message> (<code>, request id <id>)", which is what a person
// needs to act and what an operator needs to find the log line.
func (e *APIError) Error() string {
	if e.RequestID == "" {
		return fmt.Sprintf("%s (%s)", e.Message, e.Code)
	}
	return fmt.Sprintf("%s (%s, request id %s)", e.Message, e.Code, e.RequestID)
}

// Unwrap returns the answer as belay's application error.
func (e *APIError) Unwrap() error {
	return &belay.Error{Code: e.Code, Message: e.Message}
}

// retryable reports whether a stream should reconnect after err: the
// server or something in front of it is failing for now, or the
// connection broke. Refusals (bad token, unknown run, bad input) are not.
func retryable(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return true
	}
	switch ae.Code {
	case belay.CodeInternal, belay.CodeUnavailable, belay.CodeUpstream:
		return true
	}
	return ae.Status == http.StatusTooManyRequests || ae.Status >= 500
}

// codeForStatus maps a status back to a code for an error answer that is
// not belay's (a proxy's HTML page, say): the inverse of HTTPStatus.
func codeForStatus(status int) belay.Code {
	switch status {
	case http.StatusBadRequest:
		return belay.CodeInvalid
	case http.StatusRequestEntityTooLarge:
		return belay.CodeTooLarge
	case http.StatusUnauthorized:
		return belay.CodeUnauthorized
	case http.StatusForbidden:
		return belay.CodeForbidden
	case http.StatusNotFound:
		return belay.CodeNotFound
	case http.StatusConflict:
		return belay.CodeConflict
	case http.StatusTooManyRequests:
		return belay.CodeBudgetExhausted
	case http.StatusGone:
		return belay.CodeEventsExpired
	case http.StatusBadGateway:
		return belay.CodeUpstream
	case http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return belay.CodeUnavailable
	}
	return belay.CodeInternal
}

// responseError turns a non-2xx answer into an *APIError.
func responseError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorAnswer))
	reqID := resp.Header.Get(wire.RequestIDHeader)
	var eb wire.ErrorBody
	if err := json.Unmarshal(body, &eb); err == nil && eb.Error.Code != "" {
		if eb.Error.RequestID == "" {
			eb.Error.RequestID = reqID
		}
		return &APIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
	}
	// Not belay's error shape: something in between answered. Its body
	// is not quoted; it could be a page of anything.
	return &APIError{
		Status:    resp.StatusCode,
		Code:      codeForStatus(resp.StatusCode),
		Message:   "the server answered " + resp.Status + " without a belay error body",
		RequestID: reqID,
	}
}

// newRequest builds an authenticated request for the API path (which starts
// with "/v1/").
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Request, error) {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// send performs req and returns the answer when it is 2xx; anything else is
// an *APIError. Transport errors say which call failed and where.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, context.Cause(req.Context()))
		}
		return nil, fmt.Errorf("could not reach belay at %s: %w", c.Endpoint(), unwrapURLError(err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

// unwrapURLError drops *url.Error's "Get \"URL\":" prefix; the caller
// already names the endpoint.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// call sends a JSON request (body may be nil) and decodes a JSON answer
// into out (which may be nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in any, header http.Header, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("%s %s: encode request: %w", method, path, err)
		}
	}
	req, err := c.newRequest(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorAnswer))
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONAnswer+1))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if len(b) > maxJSONAnswer {
		return fmt.Errorf("%s %s: the answer is larger than %d bytes", method, path, maxJSONAnswer)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode answer (request id %s): %w", method, path, resp.Header.Get(wire.RequestIDHeader), err)
	}
	return nil
}

// runPath returns "/v1/runs/<id>" plus the given segments, each escaped.
func runPath(id string, segments ...string) string {
	p := "/v1/runs/" + url.PathEscape(id)
	for _, s := range segments {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// createRunBody is POST /v1/runs as the client sends it. A Go struct cannot
// tell an absent field from a zero one, and the server refuses an explicit
// zero (maxSteps 0, "model": ""), so the optional fields are left out when
// zero and take the operator's defaults: the same reading as
// belay.Limits.Validate.
type createRunBody struct {
	Instruction     string        `json:"instruction"`
	Model           string        `json:"model,omitempty"`
	Files           []belay.File  `json:"files,omitempty"`
	Source          *sourceBody   `json:"source,omitempty"`
	AllowedPaths    []string      `json:"allowedPaths"`
	Checks          [][]string    `json:"checks"`
	MaxSteps        int           `json:"maxSteps,omitempty"`
	WallTimeSeconds int           `json:"wallTimeSeconds,omitempty"`
	Approval        *approvalBody `json:"approval,omitempty"`
}

// sourceBody is what a caller says of a git source: the URL and ref; the
// server fetches and resolves it.
type sourceBody struct {
	Git gitSourceBody `json:"git"`
}

type gitSourceBody struct {
	URL string `json:"url"`
	Ref string `json:"ref,omitempty"`
}

type approvalBody struct {
	Policy         belay.ApprovalPolicy `json:"policy,omitempty"`
	Allow          []string             `json:"allow,omitempty"`
	TimeoutSeconds int                  `json:"timeoutSeconds,omitempty"`
}

// CreateRun asks for a run (POST /v1/runs). Zero values of Model, MaxSteps,
// WallTimeSeconds and the Approval fields are left out of the body, so the
// operator's defaults apply. A non-empty idempotencyKey makes the call safe
// to retry: the same key with the same request returns the same run; with
// another request the server answers conflict. Bad input is invalid (or
// too_large) with a message naming the field.
func (c *Client) CreateRun(ctx context.Context, req belay.RunRequest, idempotencyKey string) (wire.CreateRunResponse, error) {
	body := createRunBody{
		Instruction:     req.Instruction,
		Model:           req.Model,
		Files:           req.Files,
		AllowedPaths:    req.AllowedPaths,
		Checks:          req.Checks,
		MaxSteps:        req.MaxSteps,
		WallTimeSeconds: req.WallTimeSeconds,
	}
	if g := req.GitSource(); g != nil {
		body.Source = &sourceBody{Git: gitSourceBody{URL: g.URL, Ref: g.Ref}}
	}
	if a := req.Approval; a.Policy != "" || len(a.Allow) > 0 || a.TimeoutSeconds != 0 {
		body.Approval = &approvalBody{Policy: a.Policy, Allow: a.Allow, TimeoutSeconds: a.TimeoutSeconds}
	}
	var header http.Header
	if idempotencyKey != "" {
		header = http.Header{wire.IdempotencyKeyHeader: {idempotencyKey}}
	}
	var out wire.CreateRunResponse
	err := c.call(ctx, http.MethodPost, "/v1/runs", nil, body, header, &out)
	return out, err
}

// GetRun returns the run's public view. Returns not_found for an unknown run.
func (c *Client) GetRun(ctx context.Context, id string) (wire.RunView, error) {
	var out wire.RunView
	err := c.call(ctx, http.MethodGet, runPath(id), nil, nil, nil, &out)
	return out, err
}

// ListRunsOptions selects runs: by status when set; Limit per page (the
// server's default when zero); Cursor is the NextCursor of an earlier page.
type ListRunsOptions struct {
	Status belay.RunStatus
	Limit  int
	Cursor string
}

// ListRuns returns one page of runs, newest first.
func (c *Client) ListRuns(ctx context.Context, opts ListRunsOptions) (wire.RunList, error) {
	q := url.Values{}
	if opts.Status != "" {
		q.Set("status", string(opts.Status))
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	var out wire.RunList
	err := c.call(ctx, http.MethodGet, "/v1/runs", q, nil, nil, &out)
	return out, err
}

// Events reads one NDJSON page of the run's log: up to limit events (the
// server's default when zero) with seq > after, oldest first. The page's
// LastSeq and Terminal come from the answer's headers, so a reader knows
// whether to ask again. Missed and OldestSeq are set when events after
// `after` have already left the bounded buffer.
func (c *Client) Events(ctx context.Context, runID string, after int64, limit int) (belay.EventPage, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := runPath(runID, "events")
	req, err := c.newRequest(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return belay.EventPage{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return belay.EventPage{}, err
	}
	defer resp.Body.Close()
	var page belay.EventPage
	if v := resp.Header.Get(wire.LastSeqHeader); v != "" {
		if page.LastSeq, err = strconv.ParseInt(v, 10, 64); err != nil {
			return belay.EventPage{}, fmt.Errorf("GET %s: bad %s header", path, wire.LastSeqHeader)
		}
	}
	page.Terminal = resp.Header.Get(wire.TerminalHeader) == "true"
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxJSONAnswer*8))
	for {
		var line struct {
			Seq *int64 `json:"seq"`
			belay.Event
		}
		if err := dec.Decode(&line); err == io.EOF {
			break
		} else if err != nil {
			return belay.EventPage{}, fmt.Errorf("GET %s: decode events (request id %s): %w", path, resp.Header.Get(wire.RequestIDHeader), err)
		}
		if line.Seq == nil && line.Type == wire.EventsMissedType {
			var m wire.EventsMissed
			if err := json.Unmarshal(line.Data, &m); err != nil {
				return belay.EventPage{}, fmt.Errorf("GET %s: decode %s: %w", path, wire.EventsMissedType, err)
			}
			page.Missed, page.OldestSeq = true, m.OldestSeq
			continue
		}
		line.Event.Seq = derefSeq(line.Seq)
		page.Events = append(page.Events, line.Event)
	}
	return page, nil
}

func derefSeq(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// ListApprovals returns the run's approvals, pending and decided, oldest
// first. A pending one past its expiry comes back decided deny.
func (c *Client) ListApprovals(ctx context.Context, runID string) ([]belay.Approval, error) {
	var out wire.ApprovalList
	err := c.call(ctx, http.MethodGet, runPath(runID, "approvals"), nil, nil, nil, &out)
	return out.Approvals, err
}

// Decide answers a pending approval. A decision of cancel also cancels the
// run. Returns conflict if the approval is already decided (by a person, the
// run's policy, or its timeout).
func (c *Client) Decide(ctx context.Context, runID, approvalID string, d belay.Decision, reason string) (belay.Approval, error) {
	var out belay.Approval
	err := c.call(ctx, http.MethodPost, runPath(runID, "approvals", approvalID), nil,
		wire.DecisionRequest{Decision: d, Reason: reason}, nil, &out)
	return out, err
}

// Cancel asks for the run to be cancelled and returns its view: model calls
// stop at once, the sandbox is stopped, and the run ends cancelled. Calling
// it again is harmless; a run that has already ended answers conflict.
func (c *Client) Cancel(ctx context.Context, runID string) (wire.RunView, error) {
	var out wire.RunView
	err := c.call(ctx, http.MethodPost, runPath(runID, "cancel"), nil, nil, nil, &out)
	return out, err
}

// ListArtifacts names the run's artifacts and their sizes.
func (c *Client) ListArtifacts(ctx context.Context, runID string) ([]belay.ArtifactInfo, error) {
	var out wire.ArtifactList
	err := c.call(ctx, http.MethodGet, runPath(runID, "artifacts"), nil, nil, nil, &out)
	return out.Artifacts, err
}

// GetArtifact returns one artifact's content (result.json, patch.diff,
// transcript.jsonl). Returns not_found if the run has none by that name.
func (c *Client) GetArtifact(ctx context.Context, runID, name string) ([]byte, error) {
	path := runPath(runID, "artifacts", name)
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, belay.MaxArtifactBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: read artifact: %w", path, err)
	}
	if len(b) > belay.MaxArtifactBytes {
		return nil, fmt.Errorf("GET %s: the artifact is larger than %d bytes", path, belay.MaxArtifactBytes)
	}
	return b, nil
}

// errStreamIdle ends a connection that stayed silent past the idle timeout.
var errStreamIdle = errors.New("the event stream was silent for too long")

// callbackError carries the caller's own error out of the stream loop, so
// it is returned as is and never retried.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// StreamEvents follows the run's log over server-sent events, calling fn
// with each event in order, exactly once, starting after seq `after`, and
// returns nil once fn has seen the terminal event (run.completed,
// run.failed or run.cancelled), or at once if the log had already ended
// before `after`.
//
// When the connection drops, stalls past the idle timeout, or the server is
// briefly unavailable, it reconnects with Last-Event-ID set to the last seq
// it delivered, waiting with exponential backoff, until the terminal event
// or the end of ctx (whose error it then returns). Refusals (unauthorized,
// not_found, invalid) end it with the *APIError. An error from fn ends it
// with that error.
//
// When the bounded buffer no longer holds events the reader has not seen,
// fn gets the server's in-band marker as an event of type EventsMissedType
// with Seq 0 and data {"oldestSeq":N}: the events after the previous one
// and before N are gone.
func (c *Client) StreamEvents(ctx context.Context, runID string, after int64, fn func(belay.Event) error) error {
	last := after
	wait := c.backoff
	for {
		delivered, ended, err := c.streamOnce(ctx, runID, last, &last, fn)
		if ended {
			return nil
		}
		if ce, ok := errors.AsType[callbackError](err); ok {
			return ce.err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if err != nil && !retryable(err) {
			return err
		}
		if err == nil && delivered == 0 {
			// The server closed a stream that gave nothing: either the
			// log ended at or before `last`, or the connection was cut
			// before the first event. Ask the log which.
			page, perr := c.Events(ctx, runID, last, 1)
			if perr == nil && page.Terminal && len(page.Events) == 0 && !page.Missed {
				return nil
			}
			if perr != nil && !retryable(perr) {
				return perr
			}
		}
		if delivered > 0 {
			wait = c.backoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		wait = min(2*wait, c.maxBackoff)
	}
}

// streamOnce reads one SSE connection. It returns how many events it handed
// to fn, whether fn saw the terminal event, and why the connection ended
// (nil for a clean close by the server). *last tracks the newest seq
// delivered, across connections.
func (c *Client) streamOnce(ctx context.Context, runID string, after int64, last *int64, fn func(belay.Event) error) (delivered int, ended bool, err error) {
	connCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	q := url.Values{"stream": {"1"}}
	req, err := c.newRequest(connCtx, http.MethodGet, runPath(runID, "events"), q, nil)
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	idle := time.AfterFunc(c.idleTimeout, func() { cancel(errStreamIdle) })
	defer idle.Stop()
	resp, err := c.send(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent {
		// The run has ended and there is nothing after `after`.
		return 0, true, nil
	}

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	sc.Split(scanSSELines)
	var (
		id, typ string
		data    strings.Builder
		hasData bool
	)
	for sc.Scan() {
		idle.Reset(c.idleTimeout)
		line := sc.Text()
		if line != "" {
			if strings.HasPrefix(line, ":") {
				continue // a heartbeat or other comment
			}
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				id = value
			case "event":
				typ = value
			case "data":
				if hasData {
					data.WriteByte('\n')
				}
				data.WriteString(value)
				hasData = true
			}
			continue
		}
		// A blank line dispatches the event gathered so far.
		if !hasData {
			id, typ = "", ""
			continue
		}
		ev, skip, derr := decodeSSE(id, typ, data.String(), *last)
		id, typ, hasData = "", "", false
		data.Reset()
		if derr != nil {
			return delivered, false, derr
		}
		if skip {
			continue
		}
		if ev.Type == wire.EventsMissedType {
			var m wire.EventsMissed
			_ = json.Unmarshal(ev.Data, &m)
			// Events before OldestSeq are gone; a reconnect must not
			// report them missing again.
			*last = max(*last, m.OldestSeq-1)
		} else {
			*last = ev.Seq
		}
		if err := fn(ev); err != nil {
			return delivered, false, callbackError{err}
		}
		delivered++
		if belay.IsTerminalEvent(ev.Type) {
			return delivered, true, nil
		}
	}
	if err := sc.Err(); err != nil {
		if cause := context.Cause(connCtx); cause != nil {
			return delivered, false, cause
		}
		return delivered, false, fmt.Errorf("event stream of run %s broke: %w", runID, err)
	}
	// A partial event without its blank line is dropped: the server
	// resends it after Last-Event-ID.
	return delivered, false, nil
}

// decodeSSE turns one dispatched server-sent event into a belay.Event. It
// skips events at or before last (a server resending what the client has)
// and returns an in-band error event as an *APIError.
func decodeSSE(id, typ, data string, last int64) (ev belay.Event, skip bool, err error) {
	switch typ {
	case "error":
		var eb wire.ErrorBody
		if jerr := json.Unmarshal([]byte(data), &eb); jerr != nil || eb.Error.Code == "" {
			return ev, false, &APIError{Code: belay.CodeInternal, Message: "the event stream ended with an unreadable error"}
		}
		return ev, false, &APIError{Code: eb.Error.Code, Message: eb.Error.Message, RequestID: eb.Error.RequestID}
	case wire.EventsMissedType:
		return belay.Event{Type: wire.EventsMissedType, Data: json.RawMessage(data)}, false, nil
	}
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		return ev, false, fmt.Errorf("event stream: event %s is not valid JSON: %w", id, err)
	}
	if ev.Seq <= last {
		return ev, true, nil
	}
	return ev, false, nil
}

// scanSSELines splits an event stream into lines ended by "\n", "\r\n" or
// "\r", as the SSE format allows. A final line without its end is not
// returned: the stream broke in the middle of it.
func scanSSELines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	for i, b := range data {
		switch b {
		case '\n':
			return i + 1, data[:i], nil
		case '\r':
			if i+1 < len(data) {
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			}
			if atEOF {
				return i + 1, data[:i], nil
			}
			return 0, nil, nil // need one more byte to tell \r from \r\n
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), nil, nil
	}
	return 0, nil, nil
}
