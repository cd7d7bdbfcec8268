package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
	"github.com/belay-dev/belay/internal/wire"
)

// APIPeer is who must be listening on the control plane's Unix socket:
// the entry checks the peer of every connection it makes there
// (SO_PEERCRED) before it sends a byte.
type APIPeer struct {
	// UID is the listener's uid: belay's own.
	UID int
	// SharesUID accepts a listener that runs as the entry's own uid. Only
	// the weak isolation tier of the process launcher needs it (belay and
	// the sandbox are one user there); otherwise a peer of the entry's own
	// uid is refused, since any process of the sandbox has that uid.
	SharesUID bool
}

// PeerError is a connection refused because of who listens on the socket.
// It never holds a token: the check runs before anything is sent.
type PeerError struct {
	Socket string
	UID    int // the listener's uid
	Want   int
	Own    bool // the listener has the entry's own uid
}

// Error says who listened and who should have.
func (e *PeerError) Error() string {
	switch {
	case e.UID != e.Want && e.Own:
		return fmt.Sprintf("api socket %s: the listener runs as the sandbox's own uid %d, not the control plane's uid %d; refusing to send it anything", e.Socket, e.UID, e.Want)
	case e.UID != e.Want:
		return fmt.Sprintf("api socket %s: the listener runs as uid %d, not the control plane's uid %d; refusing to send it anything", e.Socket, e.UID, e.Want)
	}
	return fmt.Sprintf("api socket %s: the listener runs as the sandbox's own uid %d, so it may be a process of the sandbox, not the control plane; refusing to send it anything", e.Socket, e.UID)
}

// NewAPIClient returns the HTTP client for the control plane's internal
// routes: over the Unix socket at socket when it is set (the URL's host is
// then ignored), over TCP otherwise. It never takes a proxy from the
// environment. Requests are bounded by their context, not by a client
// timeout, because a model call may take minutes.
//
// Over a socket, peer is required. The socket is pinned: NewAPIClient
// opens it once (O_PATH) and every later connection goes to that inode
// through /proc/self/fd, so a process of the sandbox that renames the
// socket and listens on its name (a relay that would capture the tokens)
// is never dialled. Every connection's peer is checked against peer, and
// NewAPIClient checks one connection before it returns, so a wrong
// listener stops the entry at once with a *PeerError.
func NewAPIClient(socket string, peer *APIPeer) (*http.Client, error) {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	if socket == "" {
		return &http.Client{Transport: tr}, nil
	}
	if peer == nil {
		return nil, fmt.Errorf("api socket %s: the uid of its listener is not given (apiPeerUid, %s); refusing to use a socket whose listener cannot be checked", socket, workspace.EnvAPIPeerUID)
	}
	pinned, err := pinSocket(socket)
	if err != nil {
		return nil, err
	}
	d := &socketDialer{socket: socket, path: pinned, peer: *peer, dialer: dialer}
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return d.dial(ctx) }
	ctx, cancel := context.WithTimeout(context.Background(), dialer.Timeout)
	defer cancel()
	c, err := d.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.Close()
	return &http.Client{Transport: tr}, nil
}

// socketDialer connects to the pinned socket and checks each connection's
// peer.
type socketDialer struct {
	socket string // the name, for messages
	path   string // what to connect to: /proc/self/fd/N, or the name
	peer   APIPeer
	dialer *net.Dialer
}

func (d *socketDialer) dial(ctx context.Context) (net.Conn, error) {
	c, err := d.dialer.DialContext(ctx, "unix", d.path)
	if err != nil {
		return nil, fmt.Errorf("api socket %s: %w", d.socket, err)
	}
	uid, err := peerUID(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("api socket %s: %w", d.socket, err)
	}
	own := os.Geteuid()
	switch {
	case uid != d.peer.UID:
		c.Close()
		return nil, &PeerError{Socket: d.socket, UID: uid, Want: d.peer.UID, Own: uid == own}
	case uid == own && !d.peer.SharesUID:
		c.Close()
		return nil, &PeerError{Socket: d.socket, UID: uid, Want: d.peer.UID, Own: true}
	}
	return c, nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// APIError is an error answer of the control plane: its HTTP status and
// the stable code and message of its error body. It never holds the token
// of the request.
type APIError struct {
	Status    int
	Code      belay.Code
	Message   string
	RequestID string
}

// Error reads "control plane answered <status> <code>: <message> (request
// <id>)": the request id ties it to the control plane's log line.
func (e *APIError) Error() string {
	msg := fmt.Sprintf("control plane answered %d", e.Status)
	if e.Code != "" {
		msg += " " + string(e.Code)
	}
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return msg
}

// maxAPIResponse caps a response body from the internal routes the entry
// reads (events, approvals).
const maxAPIResponse = 1 << 20

// apiRoute is one internal route with its audience token.
type apiRoute struct {
	client *http.Client
	base   string // APIBaseURL, without a trailing slash
	token  string
}

// url joins the base URL and the path segments, escaping each one.
func (r apiRoute) url(segments ...string) string {
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(r.base, "/"))
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// do sends one request with the route's token and decodes a 2xx answer
// into out (when not nil). A non-2xx answer is an *APIError; a transport
// failure is wrapped with the method and path, never the token.
func (r apiRoute) do(ctx context.Context, method, u string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s %s: encode body: %w", method, pathOf(u), err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, pathOf(u), err)
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		// *url.Error repeats the URL, which holds no secret; unwrap it to
		// keep the message short.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%s %s: %w", method, pathOf(u), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse+1))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, pathOf(u), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &APIError{Status: resp.StatusCode}
		var eb wire.ErrorBody
		if json.Unmarshal(data, &eb) == nil {
			ae.Code, ae.Message, ae.RequestID = eb.Error.Code, truncate(eb.Error.Message, 500), eb.Error.RequestID
		}
		return ae
	}
	if len(data) > maxAPIResponse {
		return fmt.Errorf("%s %s: answer larger than %d bytes", method, pathOf(u), maxAPIResponse)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, pathOf(u), err)
		}
	}
	return nil
}

func pathOf(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Path
	}
	return "?"
}

// retryable reports whether a failed call may be repeated: transport
// failures, 429 and 5xx. Any other answer would be the same again.
func retryable(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status == http.StatusTooManyRequests || ae.Status >= 500
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// sleepCtx waits d or until ctx ends, reporting whether the wait was whole.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// decodeErrorBody reads belay's error shape, and false for anything else.
func decodeErrorBody(data []byte) (wire.ErrorBody, bool) {
	var eb wire.ErrorBody
	if err := json.Unmarshal(data, &eb); err != nil || eb.Error.Code == "" {
		return wire.ErrorBody{}, false
	}
	return eb, true
}
