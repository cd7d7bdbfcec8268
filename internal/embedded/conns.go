package embedded

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// How the public listener keeps a flood of connections from taking the
// control plane down (issue 16, hole 9): a local caller without a token
// once held 20,500 idle connections, belay ran out of file descriptors
// (accept4: too many open files) and an authorised request went
// unanswered until they timed out.
const (
	// readHeaderTimeout closes a connection that has not sent a whole
	// request header this long after it opened (or after its last
	// request, once it starts another).
	readHeaderTimeout = 5 * time.Second
	// idleTimeout closes a kept-alive connection that sends nothing more.
	idleTimeout = 15 * time.Second
	// maxConnections bounds open connections whatever the descriptor
	// limit: each costs memory too.
	maxConnections = 10_000
	// reservedDescriptors are kept for everything but the public
	// connections: the database, artifacts, each sandbox's socket,
	// pipes and process descriptors, the model proxy's upstream calls.
	reservedDescriptors = 1024
	// minConnections is the cap however low the descriptor limit.
	minConnections = 64
	// limitWarnEvery spaces the warnings about connections closed at the
	// cap.
	limitWarnEvery = time.Minute
)

// raiseFileLimit raises this process's soft limit on open files to its
// hard limit and returns the result.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		want := lim
		want.Cur = want.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return lim.Cur, err
		}
		lim = want
	}
	return lim.Cur, nil
}

// connectionCap is how many public connections fit in a descriptor limit.
func connectionCap(fileLimit uint64) int {
	if fileLimit < reservedDescriptors+minConnections {
		return minConnections
	}
	return int(min(uint64(maxConnections), fileLimit-reservedDescriptors))
}

// connLimiter caps the open connections of a listener. When a new one
// arrives at the cap, the connection that has waited longest without a
// request in a handler (one that only connected, is still sending its
// header, or idles between requests) is closed to make room; only when
// every connection is inside a handler is the new one closed instead.
// A flood of idle connections therefore pushes out its own oldest, while a
// client that connects and sends its request at once is served. Install
// it with listen (the Listener), and with the server's ConnState and
// ConnContext and the handler wrapper track.
type connLimiter struct {
	net.Listener
	max int
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	conns map[net.Conn]*trackedConn
	// waiting holds the connections not inside a handler, longest
	// waiting first.
	waiting  *list.List
	evicted  int64
	refused  int64
	lastWarn time.Time
}

type trackedConn struct {
	c    net.Conn
	elem *list.Element // in waiting, nil while inside a handler
}

func newConnLimiter(ln net.Listener, max int, log *slog.Logger, now func() time.Time) *connLimiter {
	return &connLimiter{Listener: ln, max: max, log: log, now: now,
		conns: map[net.Conn]*trackedConn{}, waiting: list.New()}
}

// Accept accepts the next connection, making room for it at the cap.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var victim net.Conn
		l.mu.Lock()
		if len(l.conns) >= l.max {
			front := l.waiting.Front()
			if front == nil {
				l.refused++
				l.warnLocked()
				l.mu.Unlock()
				c.Close()
				continue
			}
			tc := front.Value.(*trackedConn)
			l.forgetLocked(tc)
			victim = tc.c
			l.evicted++
			l.warnLocked()
		}
		tc := &trackedConn{c: c}
		tc.elem = l.waiting.PushBack(tc)
		l.conns[c] = tc
		l.mu.Unlock()
		if victim != nil {
			victim.Close()
		}
		return c, nil
	}
}

func (l *connLimiter) forgetLocked(tc *trackedConn) {
	if tc.elem != nil {
		l.waiting.Remove(tc.elem)
		tc.elem = nil
	}
	delete(l.conns, tc.c)
}

// warnLocked says, at most once a minute, that the cap is closing
// connections.
func (l *connLimiter) warnLocked() {
	if now := l.now(); now.Sub(l.lastWarn) >= limitWarnEvery {
		l.lastWarn = now
		l.log.Warn("public connections at their cap: closing the longest-waiting ones to make room",
			"cap", l.max, "evicted_total", l.evicted, "refused_total", l.refused)
	}
}

// connState is the server's ConnState hook: a connection that starts a
// request or goes idle moves to the back of the waiting line; a closed or
// hijacked one is forgotten.
func (l *connLimiter) connState(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tc, ok := l.conns[c]
	if !ok {
		return
	}
	switch state {
	case http.StateActive, http.StateIdle:
		if tc.elem != nil {
			l.waiting.MoveToBack(tc.elem)
		}
	case http.StateClosed, http.StateHijacked:
		l.forgetLocked(tc)
	}
}

type connKey struct{}

// connContext is the server's ConnContext hook: it lets track find the
// request's connection.
func (l *connLimiter) connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// track keeps a connection out of the waiting line while a handler serves
// its request, and answers 401 with Connection: close, so a refused caller
// does not keep its connection.
func (l *connLimiter) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
			l.enterHandler(c)
			defer l.leaveHandler(c)
		}
		h.ServeHTTP(closeOnRefusal{w}, r)
	})
}

func (l *connLimiter) enterHandler(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc, ok := l.conns[c]; ok && tc.elem != nil {
		l.waiting.Remove(tc.elem)
		tc.elem = nil
	}
}

func (l *connLimiter) leaveHandler(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc, ok := l.conns[c]; ok && tc.elem == nil {
		tc.elem = l.waiting.PushBack(tc)
	}
}

// closeOnRefusal adds Connection: close to a 401.
type closeOnRefusal struct{ http.ResponseWriter }

func (w closeOnRefusal) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		w.Header().Set("Connection", "close")
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the real writer (flushes,
// deadlines).
func (w closeOnRefusal) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush flushes the real writer, for handlers that assert http.Flusher.
func (w closeOnRefusal) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}
