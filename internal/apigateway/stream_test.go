package apigateway_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/apigateway"
)

func sseEvent() events.APIGatewayProxyRequest {
	return events.APIGatewayProxyRequest{
		HTTPMethod: "GET", Path: "/v1/runs/run_abc/events",
		Headers:        map[string]string{"Accept": "text/event-stream"},
		RequestContext: events.APIGatewayProxyRequestContext{RequestID: "gw-1", DomainName: "example.com"},
	}
}

// The runtime reads the body while the handler is still writing it: each
// flushed event is readable before the handler goes on.
func TestStreamingIsIncremental(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "id: 1\nevent: run.started\ndata: {}\n\n")
		_ = http.NewResponseController(w).Flush()
		<-release
		_, _ = io.WriteString(w, "id: 2\nevent: run.completed\ndata: {}\n\n")
	})
	resp, err := apigateway.Streaming(h, apigateway.StreamOptions{})(t.Context(), sseEvent())
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || http.Header(resp.MultiValueHeaders).Get("Content-Type") != "text/event-stream" {
		t.Fatalf("prelude %d %v", resp.StatusCode, resp.MultiValueHeaders)
	}
	br := bufio.NewReader(resp)
	// The prelude, then the delimiter.
	prelude, err := br.ReadString(0)
	if err != nil || !strings.Contains(prelude, `"statusCode":200`) {
		t.Fatalf("prelude %q, %v", prelude, err)
	}
	if _, err := io.ReadFull(br, make([]byte, 7)); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("id: 1\nevent: run.started\ndata: {}\n\n"))
	if _, err := io.ReadFull(br, first); err != nil || !strings.HasPrefix(string(first), "id: 1") {
		t.Fatalf("first event %q, %v", first, err)
	}
	select {
	case <-finished:
		t.Fatal("the handler finished before its first event was read: not streamed")
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasPrefix(string(rest), "id: 2") {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// A client that goes away (the runtime closes the response) ends the
// handler's context.
func TestStreamingCloseEndsTheHandler(t *testing.T) {
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	resp, err := apigateway.Streaming(h, apigateway.StreamOptions{})(t.Context(), sseEvent())
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Close()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("handler context ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("closing the response did not end the handler's context")
	}
}

// At MaxDuration an event stream is ended with a retry hint after its last
// whole event; a stream that ends by itself gets none, nor does another
// content type.
func TestStreamingRetryHint(t *testing.T) {
	h := func(ct string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			_, _ = io.WriteString(w, "id: 7\nevent: tool.call\ndata: {}\n\n")
			<-r.Context().Done()
		})
	}
	read := func(t *testing.T, h http.Handler, ctx context.Context, o apigateway.StreamOptions) string {
		resp, err := apigateway.Streaming(h, o)(ctx, sseEvent())
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	got := read(t, h("text/event-stream"), t.Context(), apigateway.StreamOptions{MaxDuration: 50 * time.Millisecond, RetryAfter: 2 * time.Second})
	if !strings.HasSuffix(got, "id: 7\nevent: tool.call\ndata: {}\n\nretry: 2000\n\n") {
		t.Fatalf("body %q: want the event, then the retry hint", got)
	}
	// The invocation's deadline, less the margin, ends it too.
	ctx, cancel := context.WithTimeout(t.Context(), 5100*time.Millisecond)
	defer cancel()
	got = read(t, h("text/event-stream"), ctx, apigateway.StreamOptions{})
	if !strings.HasSuffix(got, "retry: 1000\n\n") {
		t.Fatalf("body %q at the invocation's deadline: want the retry hint", got)
	}
	got = read(t, h("application/x-ndjson"), t.Context(), apigateway.StreamOptions{MaxDuration: 50 * time.Millisecond})
	if strings.Contains(got, "retry:") {
		t.Fatalf("NDJSON body %q got a retry hint", got)
	}
}
