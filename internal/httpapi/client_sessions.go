package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/coder/websocket"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// SessionBody is the body of POST /v1/sessions as the client sends it.
type SessionBody struct {
	Model           string                `json:"model,omitempty"`
	Approval        *belay.ApprovalConfig `json:"approval,omitempty"`
	Source          SessionSourceBody     `json:"source"`
	AllowedPaths    []string              `json:"allowedPaths"`
	Checks          [][]string            `json:"checks"`
	Skills          []belay.Skill         `json:"skills,omitempty"`
	MaxSteps        int                   `json:"maxSteps,omitempty"`
	WallTimeSeconds int                   `json:"wallTimeSeconds,omitempty"`
}

// SessionSourceBody is a session's source: uploaded files or a git
// repository.
type SessionSourceBody struct {
	Files []belay.File   `json:"files,omitempty"`
	Git   *gitSourceBody `json:"git,omitempty"`
}

// GitSourceOf returns the source body of a git repository.
func GitSourceOf(url, ref string) SessionSourceBody {
	return SessionSourceBody{Git: &gitSourceBody{URL: url, Ref: ref}}
}

func sessionPath(id string, segments ...string) string {
	p := "/v1/sessions/" + url.PathEscape(id)
	for _, s := range segments {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// CreateSession creates a session (POST /v1/sessions).
func (c *Client) CreateSession(ctx context.Context, body SessionBody) (wire.CreateSessionResponse, error) {
	var out wire.CreateSessionResponse
	err := c.call(ctx, http.MethodPost, "/v1/sessions", nil, body, nil, &out)
	return out, err
}

// GetSession returns the session's record.
func (c *Client) GetSession(ctx context.Context, id string) (wire.SessionView, error) {
	var out wire.SessionView
	err := c.call(ctx, http.MethodGet, sessionPath(id), nil, nil, nil, &out)
	return out, err
}

// SendMessage starts the session's next turn with text. Returns conflict
// while a turn runs or when the session is closed.
func (c *Client) SendMessage(ctx context.Context, id, text string) (wire.MessageResponse, error) {
	var out wire.MessageResponse
	err := c.call(ctx, http.MethodPost, sessionPath(id, "messages"), nil, wire.MessageRequest{Text: text}, nil, &out)
	return out, err
}

// StopSession cancels the session's running turn.
func (c *Client) StopSession(ctx context.Context, id string) (wire.SessionView, error) {
	var out wire.SessionView
	err := c.call(ctx, http.MethodPost, sessionPath(id, "stop"), nil, nil, nil, &out)
	return out, err
}

// CloseSession closes the session (DELETE), stopping a running turn.
func (c *Client) CloseSession(ctx context.Context, id string) (wire.SessionView, error) {
	var out wire.SessionView
	err := c.call(ctx, http.MethodDelete, sessionPath(id), nil, nil, nil, &out)
	return out, err
}

// SessionPatch returns the session's change so far: the diff from its
// base to the workspace after its last completed turn.
func (c *Client) SessionPatch(ctx context.Context, id string) ([]byte, error) {
	req, err := c.newRequest(ctx, http.MethodGet, sessionPath(id, "patch"), nil, nil)
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
		return nil, fmt.Errorf("read the session's patch: %w", err)
	}
	return b, nil
}

// SessionEvents returns up to limit events of the session after the
// session-wide sequence number after (NDJSON), and whether the session's
// stream has ended (closed, last turn over).
func (c *Client) SessionEvents(ctx context.Context, id string, after int64, limit int) ([]belay.SessionEvent, bool, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	req, err := c.newRequest(ctx, http.MethodGet, sessionPath(id, "events"), q, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	var events []belay.SessionEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	for sc.Scan() {
		var e belay.SessionEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, false, fmt.Errorf("decode a session event: %w", err)
		}
		if e.Type == wire.EventsMissedType {
			continue
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return nil, false, fmt.Errorf("read session events: %w", err)
	}
	return events, resp.Header.Get(wire.TerminalHeader) == "true", nil
}

// DialSession opens the session's WebSocket (GET /v1/sessions/{id}/ws),
// authenticated with the client's token, from the session-wide sequence
// number after. The caller closes the connection.
func (c *Client) DialSession(ctx context.Context, id string, after int64) (*websocket.Conn, error) {
	u := *c.base
	u.Path = c.base.Path + sessionPath(id, "ws")
	u.RawQuery = url.Values{"after": {strconv.FormatInt(after, 10)}}.Encode()
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPClient: c.hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + c.token}, "User-Agent": {c.userAgent}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			if apiErr := responseError(resp); apiErr != nil {
				return nil, apiErr
			}
		}
		return nil, fmt.Errorf("open the session's websocket at %s: %w", c.Endpoint(), unwrapURLError(err))
	}
	conn.SetReadLimit(4 << 20)
	return conn, nil
}
