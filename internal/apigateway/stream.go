package apigateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// StreamOptions configures Streaming.
type StreamOptions struct {
	Options
	// MaxDuration is how long one response may stream before the adapter
	// ends it (the handler's context is cancelled). An event stream
	// (text/event-stream) that was ended this way gets a last "retry:"
	// field, so the client reconnects with Last-Event-ID and loses
	// nothing. Zero means no limit of its own; the invocation's deadline
	// (the function's timeout) always applies, less CloseMargin.
	MaxDuration time.Duration
	// CloseMargin is how long before the invocation's deadline a stream is
	// ended. Zero means 5 s.
	CloseMargin time.Duration
	// RetryAfter is the reconnection delay the retry hint asks for. Zero
	// means 1 s.
	RetryAfter time.Duration
}

// StreamingHandler is the Lambda handler of a REST proxy integration with
// responseTransferMode STREAM.
type StreamingHandler func(context.Context, events.APIGatewayProxyRequest) (*events.APIGatewayProxyStreamingResponse, error)

// Streaming serves h to API Gateway REST proxy events in the response
// streaming format: the status and headers as soon as the handler sets
// them, then each Write as it happens. It returns once the handler has
// written its header (or returned); the Lambda runtime then reads the body
// while the handler goes on writing it.
//
// The handler's context ends when the client goes away (the runtime closes
// the response), at MaxDuration, or CloseMargin before the invocation's
// deadline, whichever is first.
func Streaming(h http.Handler, o StreamOptions) StreamingHandler {
	log := o.logger()
	if o.CloseMargin <= 0 {
		o.CloseMargin = 5 * time.Second
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	return func(ctx context.Context, ev events.APIGatewayProxyRequest) (*events.APIGatewayProxyStreamingResponse, error) {
		start := time.Now()
		req, err := request(ctx, ev)
		if err != nil {
			log.ErrorContext(ctx, "api gateway event", "apigw_request_id", ev.RequestContext.RequestID, "err", err.Error())
			resp := errorResponse(ev, http.StatusBadRequest, belay.CodeInvalid, "the request could not be read")
			return &events.APIGatewayProxyStreamingResponse{
				StatusCode: resp.StatusCode, MultiValueHeaders: resp.MultiValueHeaders,
				Body: strings.NewReader(resp.Body),
			}, nil
		}

		// The handler's own context: cancelled by the client leaving
		// (Close), or by the adapter's deadline (ended). It is the
		// request's, so it carries the API Gateway request context
		// (core.GetAPIGatewayContextFromContext) as the buffered
		// adapter's does: the request id, the IAM caller.
		hctx, cancel := context.WithCancelCause(req.Context())
		deadline := time.Time{}
		if o.MaxDuration > 0 {
			deadline = start.Add(o.MaxDuration)
		}
		if d, ok := ctx.Deadline(); ok {
			if d = d.Add(-o.CloseMargin); deadline.IsZero() || d.Before(deadline) {
				deadline = d
			}
		}
		stopTimer := func() bool { return false }
		if !deadline.IsZero() {
			t := time.AfterFunc(time.Until(deadline), func() { cancel(errEnded) })
			stopTimer = t.Stop
		}

		pr, pw := io.Pipe()
		w := &streamWriter{header: make(http.Header), pipe: pw, ready: make(chan struct{})}
		body := &streamBody{PipeReader: pr, cancel: cancel}
		go func() {
			defer stopTimer()
			defer cancel(nil)
			defer func() {
				if p := recover(); p != nil {
					log.ErrorContext(ctx, "streaming handler panicked", "apigw_request_id", ev.RequestContext.RequestID, "panic", p)
					w.commit(http.StatusInternalServerError)
				}
				note := ""
				if errors.Is(context.Cause(hctx), errEnded) && w.status == http.StatusOK && w.isEventStream() {
					// A whole event was written last: the handler writes
					// and flushes events whole. The hint goes after it.
					_, _ = io.WriteString(pw, "retry: "+strconv.FormatInt(o.RetryAfter.Milliseconds(), 10)+"\n\n")
					note = "stream closed before the integration's limit; the client reconnects with Last-Event-ID"
				}
				w.commit(http.StatusOK)
				// Logged before the body ends, so the line (and the
				// metric) is written before the runtime reports the
				// invocation done.
				access(ctx, log, o.Options, ev, w.status, w.header.Get(wire.RequestIDHeader), start, note)
				_ = pw.Close()
			}()
			h.ServeHTTP(w, req.WithContext(hctx))
		}()

		select {
		case <-w.ready:
		case <-ctx.Done():
			cancel(ctx.Err())
			<-w.ready
		}
		return &events.APIGatewayProxyStreamingResponse{
			StatusCode:        w.status,
			MultiValueHeaders: w.sent,
			Body:              body,
		}, nil
	}
}

// errEnded is the cause of a stream the adapter ended at its deadline.
var errEnded = errors.New("the stream reached its time limit")

// streamBody is the response body the runtime reads. Close, which the
// runtime calls when it is done with the response (the client left, or
// the body ended), ends the handler's context too.
type streamBody struct {
	*io.PipeReader
	cancel context.CancelCauseFunc
}

func (b *streamBody) Close() error {
	b.cancel(errors.New("the client went away"))
	return b.PipeReader.Close()
}

// streamWriter is the handler's http.ResponseWriter: the header is frozen
// at the first WriteHeader or Write and handed to the adapter (ready); each
// Write then goes through the pipe to the runtime, which sends it on at
// once, so Flush has nothing to do but report a closed pipe.
type streamWriter struct {
	header http.Header
	pipe   *io.PipeWriter

	once   sync.Once
	ready  chan struct{}
	status int
	sent   map[string][]string
	err    error
}

func (w *streamWriter) Header() http.Header { return w.header }

// commit freezes the status and header, once.
func (w *streamWriter) commit(status int) {
	w.once.Do(func() {
		if status < 100 || status > 999 {
			status = http.StatusInternalServerError
		}
		w.status = status
		w.sent = w.header.Clone()
		close(w.ready)
	})
}

func (w *streamWriter) WriteHeader(status int) {
	if status >= 100 && status < 200 {
		return // informational answers are not streamed
	}
	w.commit(status)
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.commit(http.StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.pipe.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// FlushError lets http.ResponseController.Flush succeed while the client is
// there: a Write has already reached the runtime.
func (w *streamWriter) FlushError() error {
	w.commit(http.StatusOK)
	return w.err
}

func (w *streamWriter) isEventStream() bool {
	ct := http.Header(w.sent).Get("Content-Type")
	return strings.HasPrefix(strings.ToLower(ct), "text/event-stream")
}
