package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// NewHTTPClient returns a copy of base (nil means a client of its own over
// a clone of http.DefaultTransport) that never follows a redirect, so a
// credential is only ever sent to the configured host, and whose transport
// keeps, for each call started with Track, the provider's status and at
// most the call's limit of its answer. A provider SDK reads the answer
// through it, so an answer over the cap ends as an error the moment it
// passes the cap, whatever the SDK does with the bytes.
func NewHTTPClient(base *http.Client) *http.Client {
	var c http.Client
	if base != nil {
		c = *base
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	c.Transport = &trackingTransport{next: rt}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// Exchange is what the transport saw of one tracked call: the status of
// the provider's (last) answer and its body, up to the limit.
type Exchange struct {
	limit int64

	mu       sync.Mutex
	status   int
	body     []byte
	exceeded bool
}

type exchangeKey struct{}

// Track returns a context whose HTTP requests, sent through a client of
// NewHTTPClient, are recorded in the returned Exchange, their answers
// capped at limit bytes.
func Track(ctx context.Context, limit int64) (context.Context, *Exchange) {
	x := &Exchange{limit: limit}
	return context.WithValue(ctx, exchangeKey{}, x), x
}

// Status is the HTTP status of the provider's answer, 0 if none came.
func (x *Exchange) Status() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.status
}

// Body is the answer as read so far (at most the limit).
func (x *Exchange) Body() []byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.body
}

// Exceeded reports whether the answer passed the limit.
func (x *Exchange) Exceeded() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.exceeded
}

// ErrAnswerTooLarge is the read error of an answer past its call's limit.
var ErrAnswerTooLarge = errors.New("upstream: the answer is larger than the limit")

type trackingTransport struct{ next http.RoundTripper }

func (t *trackingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// The body goes out from a copy in memory (at most the proxy's request
	// cap). The AWS SDK closes the request body as soon as the answer's
	// headers are in, while net/http may still read it once more to check
	// its length; a close then cuts the connection in the middle of the
	// answer. The copy is never closed under the transport.
	if req.Body != nil && req.Body != http.NoBody {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
	}
	resp, err := t.next.RoundTrip(req)
	x, ok := req.Context().Value(exchangeKey{}).(*Exchange)
	if err != nil || !ok {
		return resp, err
	}
	x.mu.Lock()
	x.status, x.body, x.exceeded = resp.StatusCode, nil, false
	x.mu.Unlock()
	resp.Body = &cappedBody{rc: resp.Body, x: x}
	return resp, nil
}

// cappedBody copies what is read into its Exchange and fails once more
// than the limit has come.
type cappedBody struct {
	rc io.ReadCloser
	x  *Exchange
}

func (b *cappedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	x := b.x
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.exceeded {
		return 0, ErrAnswerTooLarge
	}
	if int64(len(x.body))+int64(n) > x.limit {
		x.exceeded = true
		return 0, ErrAnswerTooLarge
	}
	x.body = append(x.body, p[:n]...)
	return n, err
}

func (b *cappedBody) Close() error { return b.rc.Close() }
