package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/wire"
)

// uploadAttempts is how often one output is sent before the entry gives
// up; uploadBackoff the first wait between attempts, doubled each time.
const (
	uploadAttempts = 4
	uploadBackoff  = 500 * time.Millisecond
)

// uploader sends the entry's outputs where the control plane said: the
// outputs route through the API client (a relative URL), or a presigned
// URL (absolute), which gets a plain client of its own: it must not go
// through the control plane's socket, and it needs no credential besides
// what the URL and its headers carry.
type uploader struct {
	api     *http.Client
	base    string // the API's base URL
	targets map[string]wire.Upload
	log     *slog.Logger
	direct  *http.Client
}

// errRunOver is an upload refused because the run is over (409): the
// control plane decided its outcome without the sandbox's bundle.
var errRunOver = errors.New("the run is over")

// put uploads one output, retrying what may succeed on a second try.
func (u *uploader) put(ctx context.Context, name string, content []byte) error {
	t, ok := u.targets[name]
	if !ok {
		return fmt.Errorf("upload %s: the control plane gave no target for it", name)
	}
	client, target, err := u.resolve(t, http.MethodPut, http.MethodPost)
	if err != nil {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	wait := uploadBackoff
	for attempt := 1; ; attempt++ {
		err = u.send(ctx, client, t, target, content)
		if err == nil {
			u.log.Debug("output uploaded", "output", name, "size", len(content))
			return nil
		}
		if ae, ok := errors.AsType[*APIError](err); ok && ae.Status == http.StatusConflict {
			return fmt.Errorf("upload %s: %w (%w)", name, errRunOver, err)
		}
		if !retryable(err) || attempt == uploadAttempts || !sleepCtx(ctx, wait) {
			return fmt.Errorf("upload %s: %w", name, err)
		}
		u.log.Warn("output upload failed; trying again", "output", name, "attempt", attempt, "err", err)
		wait *= 2
	}
}

// resolve picks the client and the URL of a target whose method must be
// one of methods.
func (u *uploader) resolve(t wire.Upload, methods ...string) (*http.Client, string, error) {
	if !slices.Contains(methods, t.Method) {
		return nil, "", fmt.Errorf("method %q is not one of %v", t.Method, methods)
	}
	ref, err := url.Parse(t.URL)
	if err != nil || ref.Fragment != "" || ref.User != nil {
		return nil, "", errors.New("the target URL is malformed")
	}
	if !ref.IsAbs() {
		if ref.Host != "" || strings.HasPrefix(ref.Path, "/") || strings.Contains("/"+ref.Path+"/", "/../") {
			return nil, "", errors.New("a relative target must be a path below the API's base URL")
		}
		return u.api, strings.TrimSuffix(u.base, "/") + "/" + t.URL, nil
	}
	if ref.Scheme != "https" && (ref.Scheme != "http" || !isLoopbackHost(ref.Hostname())) {
		return nil, "", errors.New("an absolute target must be https (plain http only on loopback)")
	}
	if u.direct == nil {
		u.direct = &http.Client{
			Transport:     &http.Transport{Proxy: nil, ForceAttemptHTTP2: true, TLSHandshakeTimeout: 10 * time.Second},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return u.direct, t.URL, nil
}

// send makes one request. A non-2xx answer is an *APIError (its body
// decoded when it is belay's error shape); the error never holds the URL's
// query or a header value, which are credentials.
func (u *uploader) send(ctx context.Context, client *http.Client, t wire.Upload, target string, content []byte) error {
	req, err := http.NewRequestWithContext(ctx, t.Method, target, bytes.NewReader(content))
	if err != nil {
		return errors.New("build the request")
	}
	for k, v := range t.Header {
		req.Header.Set(k, v)
	}
	req.ContentLength = int64(len(content))
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse))
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	ae := &APIError{Status: resp.StatusCode}
	if eb, ok := decodeErrorBody(data); ok {
		ae.Code, ae.Message, ae.RequestID = eb.Error.Code, truncate(eb.Error.Message, 500), eb.Error.RequestID
	}
	return ae
}
