package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// EventsConfig configures an EventClient.
type EventsConfig struct {
	// BaseURL is the spec's APIBaseURL; HTTPClient reaches it.
	BaseURL    string
	HTTPClient *http.Client
	RunID      string
	// Token is the run's events token.
	Token string
	// FlushInterval is how long an event may wait for others to share its
	// batch (default 500 ms).
	FlushInterval time.Duration
	// Attempts is how many times one batch is sent before it is given up
	// (default 4); Backoff is the first wait between attempts, doubled
	// each time (default 250 ms).
	Attempts int
	Backoff  time.Duration
	// MaxPending bounds the events waiting to be sent while the control
	// plane is unreachable (default 2000); past it new events are dropped
	// and counted.
	MaxPending int
	Now        func() time.Time
	// Rand makes the batch ids (default crypto/rand).
	Rand   io.Reader
	Logger *slog.Logger
	// OnCapped, when set, is called once when the control plane refuses a
	// batch because the run's sandbox has appended all the events it may
	// (413 too_large): the client stops sending for good, and the entry
	// carries on without its live log.
	OnCapped func(message string)
}

// EventClient sends a run's events to the control plane in batches. Emit
// never blocks on the network: events queue, and one goroutine posts them
// in order, a batch when MaxBatchEvents or MaxBatchBytes is reached, when
// FlushInterval passes, or on Close. A failed batch is retried with the same
// batch id, which the control plane appends at most once. When the control
// plane answers 409 (the run is terminal) or 401 (the token is no longer
// valid) the client stops for good and Stopped is closed: the run is over,
// and the entry should wind down. When it answers 413 (the run's cap on
// sandbox events is reached) the client stops sending for good too, but
// the run goes on: Stopped stays open, and OnCapped is told.
type EventClient struct {
	cfg   EventsConfig
	route apiRoute

	mu      sync.Mutex
	queue   []queuedEvent
	dropped int
	warned  map[string]bool
	closing bool
	stopped bool

	// queued counts the events ever queued; settled those sent, given up
	// or discarded since. progress is closed and replaced each time
	// settled grows, for Flush.
	queued   int64
	settled  int64
	progress chan struct{}

	wake    chan struct{}
	done    chan struct{}
	stop    chan struct{}
	sendCtx context.Context
	abort   context.CancelFunc
	prefix  string
	batchN  int
}

type queuedEvent struct {
	in   belay.EventInput
	size int
}

// NewEventClient starts the client's sending goroutine. Close stops it.
func NewEventClient(cfg EventsConfig) (*EventClient, error) {
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 500 * time.Millisecond
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 4
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 250 * time.Millisecond
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 2000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var p [8]byte
	if _, err := io.ReadFull(cfg.Rand, p[:]); err != nil {
		return nil, fmt.Errorf("new event client: batch id prefix: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &EventClient{
		cfg:     cfg,
		route:   apiRoute{client: cfg.HTTPClient, base: cfg.BaseURL, token: cfg.Token},
		warned:  make(map[string]bool),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
		sendCtx: ctx,
		abort:   cancel,
		prefix:  hex.EncodeToString(p[:]),
	}
	c.progress = make(chan struct{})
	go c.loop()
	return c, nil
}

// envelopeBytes is what a batch's JSON adds around its events, with room for
// the longest batch id.
const envelopeBytes = 64 + wire.MaxBatchIDLen

// Emit queues one event. The data is encoded now, so later changes to it do
// not leak into the event. Types the sandbox may not send (see
// belay.SandboxEventTypes) are dropped here, so that one bad event cannot
// get a whole batch refused.
func (c *EventClient) Emit(typ string, data any) {
	if !slices.Contains(belay.SandboxEventTypes, typ) {
		c.mu.Lock()
		first := !c.warned[typ]
		c.warned[typ] = true
		c.mu.Unlock()
		if first {
			c.cfg.Logger.Warn("event type not sent: the sandbox may not append it", "type", typ)
		}
		return
	}
	raw, err := json.Marshal(data)
	if err != nil {
		raw, _ = json.Marshal(map[string]string{"error": "event data could not be encoded"})
	}
	if len(raw) > 0 && raw[0] != '{' && string(raw) != "null" {
		// The control plane takes an object as an event's data.
		raw, _ = json.Marshal(map[string]json.RawMessage{"value": raw})
	}
	in := belay.EventInput{Time: c.cfg.Now().UTC(), Type: typ, Data: raw}
	enc, _ := json.Marshal(in)
	if len(enc)+envelopeBytes > wire.MaxBatchBytes {
		in.Data, _ = json.Marshal(map[string]any{"truncated": true, "dataBytes": len(raw)})
		enc, _ = json.Marshal(in)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.closing {
		return
	}
	if len(c.queue) >= c.cfg.MaxPending {
		c.dropped++
		return
	}
	c.queue = append(c.queue, queuedEvent{in: in, size: len(enc) + 1})
	c.queued++
	if c.batchReadyLocked() {
		c.signal()
	}
}

func (c *EventClient) batchReadyLocked() bool {
	if len(c.queue) >= wire.MaxBatchEvents {
		return true
	}
	n := envelopeBytes
	for _, e := range c.queue {
		n += e.size
	}
	return n >= wire.MaxBatchBytes/2
}

func (c *EventClient) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Flush sends every event emitted so far and returns once each has been
// appended or given up, the client has stopped, or ctx ends. The control
// plane appends model.request and model.response itself, the moment a
// model call passes its proxy; the entry flushes before each model call so
// that a step's tool events, still waiting for their batch, come before
// the next step's model call in the run's log, as they happened.
func (c *EventClient) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.queued
	c.mu.Unlock()
	c.signal()
	for {
		c.mu.Lock()
		flushed := c.settled >= target || c.stopped
		progress := c.progress
		c.mu.Unlock()
		if flushed {
			return nil
		}
		select {
		case <-progress:
		case <-c.done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("flush events: %w", ctx.Err())
		}
	}
}

// settleLocked counts n queued events as sent, given up or discarded.
func (c *EventClient) settleLocked(n int) {
	c.settled += int64(n)
	close(c.progress)
	c.progress = make(chan struct{})
}

// Stopped is closed when the control plane has said the run is over.
func (c *EventClient) Stopped() <-chan struct{} { return c.stop }

// Close sends what is queued and stops the client. If ctx ends first, the
// sending is abandoned and the error says how many events were not sent.
func (c *EventClient) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.signal()
	select {
	case <-c.done:
	case <-ctx.Done():
		c.abort()
		<-c.done
	}
	c.abort()
	c.mu.Lock()
	defer c.mu.Unlock()
	lost := len(c.queue) + c.dropped
	if lost > 0 && !c.stopped {
		return fmt.Errorf("close event client: %d events were not sent", lost)
	}
	return nil
}

func (c *EventClient) loop() {
	defer close(c.done)
	ticker := time.NewTicker(c.cfg.FlushInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.wake:
		case <-ticker.C:
		case <-c.sendCtx.Done():
			return
		}
		for {
			batch, closing := c.take()
			if len(batch) == 0 {
				if closing {
					return
				}
				break
			}
			if !c.send(batch) {
				return
			}
		}
	}
}

// take removes the next batch from the queue, within the batch bounds.
func (c *EventClient) take() ([]belay.EventInput, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, true
	}
	n, size := 0, envelopeBytes
	for n < len(c.queue) && n < wire.MaxBatchEvents && size+c.queue[n].size <= wire.MaxBatchBytes {
		size += c.queue[n].size
		n++
	}
	batch := make([]belay.EventInput, n)
	for i := range n {
		batch[i] = c.queue[i].in
	}
	c.queue = slices.Delete(c.queue, 0, n)
	return batch, c.closing
}

// send posts one batch, retrying with the same id. It returns false when
// the client must stop (the run is over, or Close gave up).
func (c *EventClient) send(events []belay.EventInput) bool {
	c.batchN++
	body := wire.EventBatch{BatchID: fmt.Sprintf("%s-%d", c.prefix, c.batchN), Events: events}
	u := c.route.url("internal", "v1", "runs", c.cfg.RunID, "events")
	wait := c.cfg.Backoff
	var err error
	for attempt := 1; attempt <= c.cfg.Attempts; attempt++ {
		ctx, cancel := context.WithTimeout(c.sendCtx, 15*time.Second)
		err = c.route.do(ctx, http.MethodPost, u, body, nil)
		cancel()
		if err == nil {
			c.mu.Lock()
			c.settleLocked(len(events))
			c.mu.Unlock()
			return true
		}
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge {
			c.cfg.Logger.Warn("event append refused: the run's cap on sandbox events is reached; no more events are sent",
				"code", ae.Code, "message", ae.Message)
			c.mu.Lock()
			c.stopped = true
			c.dropped += int(c.queued - c.settled)
			c.queue = nil
			c.settleLocked(int(c.queued - c.settled))
			c.mu.Unlock()
			if c.cfg.OnCapped != nil {
				c.cfg.OnCapped(ae.Message)
			}
			return false
		}
		if errors.As(err, &ae) && (ae.Status == http.StatusConflict || ae.Status == http.StatusUnauthorized) {
			c.cfg.Logger.Info("event append refused: the run is over; stopping", "status", ae.Status, "code", ae.Code)
			c.mu.Lock()
			c.stopped = true
			c.queue = nil
			c.settleLocked(int(c.queued - c.settled))
			c.mu.Unlock()
			close(c.stop)
			return false
		}
		if !retryable(err) || attempt == c.cfg.Attempts || c.sendCtx.Err() != nil {
			break
		}
		if !sleepCtx(c.sendCtx, wait) {
			break
		}
		wait *= 2
	}
	c.mu.Lock()
	c.dropped += len(events)
	c.settleLocked(len(events))
	c.mu.Unlock()
	if c.sendCtx.Err() != nil {
		return false
	}
	c.cfg.Logger.Warn("event batch given up", "batch_id", body.BatchID, "events", len(events), "err", err)
	return true
}
