package upstream_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/upstream"
)

// closeOnce is a request body that its sender closes as soon as the answer's
// headers are in, as the AWS SDK does.
type closeOnce struct {
	r      io.Reader
	closed bool
}

func (c *closeOnce) Read(p []byte) (int, error) {
	if c.closed {
		return 0, errors.New("read after close")
	}
	return c.r.Read(p)
}

func (c *closeOnce) Close() error { c.closed = true; return nil }

func TestHTTPClientTracksAndCaps(t *testing.T) {
	big := strings.Repeat("y", 200<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case "/big":
			_, _ = io.WriteString(w, big)
		default:
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write(body)
		}
	}))
	defer srv.Close()
	client := upstream.NewHTTPClient(nil)

	post := func(path string, limit int64) (*upstream.Exchange, []byte, error) {
		ctx, x := upstream.Track(context.Background(), limit)
		body := &closeOnce{r: strings.NewReader("ping")}
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+path, body)
		req.ContentLength = 4
		resp, err := client.Do(req)
		if err != nil {
			return x, nil, err
		}
		defer resp.Body.Close()
		_ = body.Close() // the SDK's habit: the transport must not care
		got, err := io.ReadAll(resp.Body)
		return x, got, err
	}

	x, got, err := post("/echo", 1<<20)
	if err != nil || string(got) != "ping" || x.Status() != http.StatusAccepted || string(x.Body()) != "ping" || x.Exceeded() {
		t.Errorf("echo: %q %v, exchange status %d body %q exceeded %v", got, err, x.Status(), x.Body(), x.Exceeded())
	}
	x, _, err = post("/redirect", 1<<20)
	if err != nil || x.Status() != http.StatusFound {
		t.Errorf("redirect: %v status %d; want the 302 itself, not followed", err, x.Status())
	}
	for range 20 {
		_, got, err = post("/big", 1<<20)
		if err != nil || len(got) != len(big) {
			t.Fatalf("big answer under the cap: %d bytes, %v", len(got), err)
		}
	}
	x, _, err = post("/big", 64<<10)
	if !errors.Is(err, upstream.ErrAnswerTooLarge) || !x.Exceeded() || len(x.Body()) > 64<<10 {
		t.Errorf("big answer over the cap: %v exceeded %v kept %d bytes", err, x.Exceeded(), len(x.Body()))
	}
}

func TestOpenAIRefusesBadConfig(t *testing.T) {
	key := func(context.Context) (string, error) { return "k", nil }
	if _, err := upstream.NewOpenAI(upstream.OpenAIConfig{URL: "https://api.example.com/v1/chat/completions"}); err == nil {
		t.Error("accepted no key source")
	}
	for _, u := range []string{"https://api.example.com/v1/completions", "http://api.example.com/v1/chat/completions", "https://k@api.example.com/v1/chat/completions"} {
		if _, err := upstream.NewOpenAI(upstream.OpenAIConfig{URL: u, Key: key}); err == nil {
			t.Errorf("accepted %q", u)
		}
	}
	if _, err := upstream.NewOpenAI(upstream.OpenAIConfig{URL: "http://127.0.0.1:9/v1/chat/completions", Key: key, AllowLoopbackHTTP: true}); err != nil {
		t.Errorf("refused loopback http: %v", err)
	}
}
