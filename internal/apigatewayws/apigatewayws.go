// Package apigatewayws serves sessions' WebSockets on API Gateway's
// WebSocket API, where the platform holds the sockets and a function sees
// one event per message: $connect (authenticated with the control-plane
// token, like every public route; the session in ?sessionId=, the first
// event to push after in ?after=), $default (a client message: chat,
// approve or stop, run by the same code as the embedded route, answered
// with PostToConnection) and $disconnect. Connections are kept in the store
// (belay.ConnectionStore) with what was pushed to each.
//
// Events are pushed from the table's stream: the same function gets the
// DynamoDB stream's records, and for each event item of a session turn's
// run it pushes what each of the session's connections has not had, in
// order, claiming the range with a conditional write first, so two
// concurrent pushes never send an event twice. A $default message also
// pushes what its connection lacks (the backlog from ?after=). A
// connection that API Gateway says is gone (410) is deleted.
package apigatewayws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/apigatewaymanagementapi"
	"github.com/aws/aws-sdk-go-v2/service/apigatewaymanagementapi/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
)

// ErrGone is PostToConnection's answer for a connection API Gateway no
// longer has (410).
var ErrGone = errors.New("the connection is gone")

// Poster sends data to a connection (API Gateway's PostToConnection).
type Poster interface {
	PostToConnection(ctx context.Context, connectionID string, data []byte) error
}

// ManagementAPI is API Gateway's management API of one WebSocket API
// stage, through the SDK's apigatewaymanagementapi client:
// PostToConnection, signed with the function's credentials.
type ManagementAPI struct {
	client *apigatewaymanagementapi.Client
}

// NewManagementAPI returns the management API at endpoint
// (https://{api-id}.execute-api.{region}.amazonaws.com/{stage}), signing
// with cfg. A post is sent once: a lost one is caught up by the client
// (?after=), never sent twice.
func NewManagementAPI(endpoint string, cfg aws.Config) (*ManagementAPI, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" {
		return nil, fmt.Errorf("the WebSocket API's endpoint %q is not an http(s) URL without a query", endpoint)
	}
	if cfg.Credentials == nil || cfg.Region == "" {
		return nil, errors.New("the management API needs credentials and a region to sign with")
	}
	base := strings.TrimSuffix(endpoint, "/")
	return &ManagementAPI{client: apigatewaymanagementapi.NewFromConfig(cfg, func(o *apigatewaymanagementapi.Options) {
		o.BaseEndpoint = aws.String(base)
		o.RetryMaxAttempts = 1
	})}, nil
}

// PostToConnection sends data to the connection. Returns ErrGone for a
// connection that is no longer there.
func (m *ManagementAPI) PostToConnection(ctx context.Context, id string, data []byte) error {
	_, err := m.client.PostToConnection(ctx, &apigatewaymanagementapi.PostToConnectionInput{ConnectionId: aws.String(id), Data: data})
	var (
		gone   *types.GoneException
		status *smithyhttp.ResponseError
	)
	switch {
	case errors.As(err, &gone), errors.As(err, &status) && status.HTTPStatusCode() == http.StatusGone:
		return ErrGone
	case err != nil:
		return fmt.Errorf("post to connection %s: %w", id, err)
	}
	return nil
}

// Config is what a Handler needs; all of it is required.
type Config struct {
	// Server is the shared handler: its control tokens, session service
	// and message handling.
	Server *httpapi.Server
	Store  belay.Store
	Poster Poster
	Logger *slog.Logger
	Now    func() time.Time
	// GatewayAuthorized says API Gateway authorizes $connect itself
	// (AWS_IAM: the caller's SigV4 signature and IAM policy, the stack's
	// auth=sigv4); the function then checks no token.
	GatewayAuthorized bool
}

// Handler is the WebSocket function's handler.
type Handler struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New checks cfg and returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Server == nil || cfg.Store == nil || cfg.Poster == nil {
		return nil, errors.New("apigatewayws: Config.Server, Store and Poster are required")
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h, nil
}

// Handle takes either event the function gets: an API Gateway WebSocket
// route event (answered with a proxy response) or a batch of DynamoDB
// stream records (answered with the records that failed, for the event
// source mapping to retry).
func (h *Handler) Handle(ctx context.Context, raw json.RawMessage) (any, error) {
	var probe struct {
		Records []json.RawMessage `json:"Records"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("the event is not JSON: %w", err)
	}
	if len(probe.Records) > 0 {
		var ev events.DynamoDBEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			return nil, fmt.Errorf("decode the stream records: %w", err)
		}
		return h.HandleStream(ctx, ev), nil
	}
	var ev events.APIGatewayWebsocketProxyRequest
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, fmt.Errorf("decode the WebSocket event: %w", err)
	}
	return h.HandleRoute(ctx, ev), nil
}

func answer(status int, body string) events.APIGatewayProxyResponse {
	return events.APIGatewayProxyResponse{StatusCode: status, Body: body}
}

// HandleRoute answers one WebSocket route event.
func (h *Handler) HandleRoute(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) events.APIGatewayProxyResponse {
	id := ev.RequestContext.ConnectionID
	log := h.log.With("connection_id", id, "route", ev.RequestContext.RouteKey, "request_id", ev.RequestContext.RequestID)
	if id == "" {
		return answer(http.StatusBadRequest, "no connection id")
	}
	switch ev.RequestContext.RouteKey {
	case "$connect":
		if !h.cfg.GatewayAuthorized && !h.cfg.Server.Authorized(http.Header{"Authorization": {header(ev, "Authorization")}}) {
			log.Info("websocket refused: no valid control-plane token")
			return answer(http.StatusUnauthorized, "missing or invalid control-plane token")
		}
		sid := ev.QueryStringParameters["sessionId"]
		after, err := strconv.ParseInt(cmpOr(ev.QueryStringParameters["after"], "0"), 10, 64)
		if err != nil || after < 0 {
			return answer(http.StatusBadRequest, "after must be a session-wide event number of at least 0")
		}
		if !strings.HasPrefix(sid, "ses_") {
			return answer(http.StatusBadRequest, "name the session: ?sessionId=ses_...")
		}
		if _, err := h.cfg.Server.Sessions().Get(ctx, sid); err != nil {
			if belay.IsCode(err, belay.CodeNotFound) {
				return answer(http.StatusNotFound, "session not found")
			}
			log.Error("websocket connect: read the session", "session_id", sid, "err", err.Error())
			return answer(http.StatusInternalServerError, "internal error")
		}
		c := belay.Connection{ID: id, SessionID: sid, ConnectedAt: h.now().UTC(), Sent: after}
		if err := h.cfg.Store.PutConnection(ctx, c); err != nil {
			log.Error("websocket connect: store the connection", "session_id", sid, "err", err.Error())
			return answer(http.StatusInternalServerError, "internal error")
		}
		log.Info("websocket connected", "session_id", sid)
		return answer(http.StatusOK, "")
	case "$disconnect":
		if err := h.cfg.Store.DeleteConnection(ctx, id); err != nil {
			log.Error("websocket disconnect", "err", err.Error())
			return answer(http.StatusInternalServerError, "internal error")
		}
		return answer(http.StatusOK, "")
	case "$default":
		c, err := h.cfg.Store.GetConnection(ctx, id)
		if err != nil {
			if !belay.IsCode(err, belay.CodeNotFound) {
				log.Error("websocket message: read the connection", "err", err.Error())
			}
			return answer(http.StatusGone, "unknown connection")
		}
		body := []byte(ev.Body)
		reply := h.cfg.Server.SessionMessage(ctx, c.SessionID, body)
		data, _ := json.Marshal(reply)
		if err := h.cfg.Poster.PostToConnection(ctx, id, data); err != nil {
			if errors.Is(err, ErrGone) {
				h.forget(ctx, log, id)
			} else {
				log.Warn("post the answer to a websocket message failed", "err", err.Error())
			}
			return answer(http.StatusOK, "")
		}
		if err := h.push(ctx, c.SessionID); err != nil {
			log.Error("websocket message: push the session's events", "session_id", c.SessionID, "err", err.Error())
		}
		return answer(http.StatusOK, "")
	}
	return answer(http.StatusBadRequest, "unknown route "+ev.RequestContext.RouteKey)
}

// HandleStream pushes the new events of the sessions whose turns' runs the
// records wrote events of. Records of other items are skipped.
func (h *Handler) HandleStream(ctx context.Context, ev events.DynamoDBEvent) events.DynamoDBEventResponse {
	var out events.DynamoDBEventResponse
	runs := map[string]string{} // run id → the first record's event id
	for _, r := range ev.Records {
		if r.EventName != string(events.DynamoDBOperationTypeInsert) {
			continue
		}
		pk, sk := keyString(r.Change.Keys["PK"]), keyString(r.Change.Keys["SK"])
		if run, ok := strings.CutPrefix(pk, "RUN#"); ok && strings.HasPrefix(sk, "EVT#") {
			if _, seen := runs[run]; !seen {
				runs[run] = r.EventID
			}
		}
	}
	sessions := map[string]string{}
	for run, eventID := range runs {
		r, err := h.cfg.Store.GetRun(ctx, run)
		if belay.IsCode(err, belay.CodeNotFound) {
			continue
		}
		if err != nil {
			h.log.Error("websocket push: read the run", "run_id", run, "err", err.Error())
			out.BatchItemFailures = append(out.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: eventID})
			continue
		}
		if t := r.Request.Turn; t != nil {
			sessions[t.SessionID] = eventID
		}
	}
	for sid, eventID := range sessions {
		if err := h.push(ctx, sid); err != nil {
			h.log.Error("websocket push", "session_id", sid, "err", err.Error())
			out.BatchItemFailures = append(out.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: eventID})
		}
	}
	return out
}

// pushPage is how many events one claim covers.
const pushPage = 100

// push sends each of the session's connections the events it has not had,
// in order: per page, it first claims the page (AdvanceConnection from
// what was sent), then posts it. A post that fails (other than a gone
// connection) gives back the rest of the page (AdvanceConnection down to
// the last event posted) and fails the push, so that the record is tried
// again and the connection gets those events, in order: a client may see
// an event twice then (API Gateway may have delivered a post it answered
// with an error), never miss one; events carry their seq for that.
func (h *Handler) push(ctx context.Context, sessionID string) error {
	conns, err := h.cfg.Store.SessionConnections(ctx, sessionID)
	if err != nil || len(conns) == 0 {
		return err
	}
	sess, err := h.cfg.Server.Sessions().Get(ctx, sessionID)
	if err != nil {
		return err
	}
	var failed []error
	for _, c := range conns {
		log := h.log.With("connection_id", c.ID, "session_id", sessionID)
	pages:
		for {
			page, err := h.cfg.Server.Sessions().Events(ctx, sess, c.Sent, pushPage)
			if err != nil {
				return err
			}
			if len(page.Events) == 0 {
				break
			}
			last := page.Events[len(page.Events)-1].Seq
			claimed, err := h.cfg.Store.AdvanceConnection(ctx, c.ID, c.Sent, last)
			if err != nil {
				return err
			}
			if !claimed {
				break // another push has these
			}
			posted := c.Sent
			for _, e := range page.Events {
				data, err := json.Marshal(e)
				if err != nil {
					return err
				}
				if err := h.cfg.Poster.PostToConnection(ctx, c.ID, data); err != nil {
					if errors.Is(err, ErrGone) {
						h.forget(ctx, log, c.ID)
						break pages
					}
					failed = append(failed, err)
					h.giveBack(ctx, log, c.ID, last, posted, err)
					break pages
				}
				posted = e.Seq
			}
			c.Sent = last
		}
	}
	return errors.Join(failed...)
}

// giveBack returns the events after posted that a failed post left
// claimed, so the next push sends them. If another push has moved on
// meanwhile, they are lost to this connection: its client catches up
// with ?after=.
func (h *Handler) giveBack(ctx context.Context, log *slog.Logger, id string, claimed, posted int64, cause error) {
	back, err := h.cfg.Store.AdvanceConnection(ctx, id, claimed, posted)
	switch {
	case err != nil:
		log.Error("post to a websocket failed, and giving its events back failed", "post_err", cause.Error(), "err", err.Error())
	case !back:
		log.Warn("post to a websocket failed after another push moved on; the client catches up with ?after=", "err", cause.Error(), "from_seq", posted)
	default:
		log.Warn("post to a websocket failed; the record is tried again from the last event posted", "err", cause.Error(), "from_seq", posted)
	}
}

// forget deletes a connection API Gateway no longer has.
func (h *Handler) forget(ctx context.Context, log *slog.Logger, id string) {
	log.Info("websocket gone; forgetting it")
	if err := h.cfg.Store.DeleteConnection(ctx, id); err != nil {
		log.Error("delete a gone connection", "err", err.Error())
	}
}

func keyString(v events.DynamoDBAttributeValue) string {
	if v.DataType() != events.DataTypeString {
		return ""
	}
	return v.String()
}

// header returns the request header name, matched without regard to case.
func header(ev events.APIGatewayWebsocketProxyRequest, name string) string {
	for k, v := range ev.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	for k, vs := range ev.MultiValueHeaders {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
