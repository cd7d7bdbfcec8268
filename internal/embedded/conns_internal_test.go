package embedded

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// limitedServer serves h behind a connLimiter of cap max on loopback, as
// Main does.
func limitedServer(t *testing.T, max int, h http.Handler) (string, *connLimiter) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newConnLimiter(tcp, max, slog.New(slog.DiscardHandler), time.Now)
	srv := &http.Server{Handler: ln.track(h), ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout,
		ConnState: ln.connState, ConnContext: ln.connContext}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return tcp.Addr().String(), ln
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read ends with EOF
// (or a reset) rather than waiting. The bound only turns a hang into an
// answer.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func (l *connLimiter) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// waitOpen waits until the limiter counts n connections.
func waitOpen(t *testing.T, l *connLimiter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the limiter counts %d connections; want %d", l.open(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// get sends one GET on c and reads the answer.
func get(t *testing.T, c net.Conn, path string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: belay\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestConnectionCapEvictsTheLongestWaiting fills the cap with idle
// connections: each new one closes the one that has waited longest, a
// connection inside a handler is never closed for room, and when every
// connection is inside a handler the new one is refused.
func TestConnectionCapEvictsTheLongestWaiting(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{}, 4)
	addr, ln := limitedServer(t, 3, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			inHandler <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer close(release)

	busy := dial(t, addr)
	if _, err := io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: belay\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-inHandler
	idle1 := dial(t, addr)
	waitOpen(t, ln, 2)
	idle2 := dial(t, addr)
	waitOpen(t, ln, 3)

	// At the cap: the newcomer pushes out idle1, the longest waiting,
	// not the older connection that is inside a handler.
	fresh := dial(t, addr)
	if !closedByServer(idle1) {
		t.Fatal("the longest-waiting idle connection was not closed to make room")
	}
	if resp := get(t, fresh, "/fast"); resp.StatusCode != http.StatusNoContent {
		t.Errorf("the newcomer's request answered %d", resp.StatusCode)
	}
	// fresh went idle after its answer: idle2 has now waited longest.
	another := dial(t, addr)
	if !closedByServer(idle2) {
		t.Fatal("idle2, now the longest waiting, was not closed")
	}

	// Every connection inside a handler: a newcomer is refused.
	for _, c := range []net.Conn{fresh, another} {
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: belay\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-inHandler
	}
	if refused := dial(t, addr); !closedByServer(refused) {
		t.Error("a connection beyond the cap, with every other inside a handler, was kept")
	}
	ln.mu.Lock()
	evicted, refused := ln.evicted, ln.refused
	ln.mu.Unlock()
	if evicted != 2 || refused != 1 {
		t.Errorf("evicted %d, refused %d; want 2 and 1", evicted, refused)
	}
}

// TestRefusalClosesTheConnection answers a 401: it carries Connection:
// close, and the server closes the connection after it, so a caller
// without a token does not keep one open.
func TestRefusalClosesTheConnection(t *testing.T) {
	addr, _ := limitedServer(t, 10, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	c := dial(t, addr)
	resp := get(t, c, "/v1/runs")
	// ReadResponse turns the Connection: close header into Close.
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("answer %d, Connection: close %v; want 401 with Connection: close", resp.StatusCode, resp.Close)
	}
	if !closedByServer(c) {
		t.Error("the connection stayed open after the 401")
	}
}

func TestConnectionCap(t *testing.T) {
	for _, tt := range []struct {
		files uint64
		want  int
	}{{1 << 20, maxConnections}, {20000, maxConnections}, {5000, 5000 - reservedDescriptors}, {1024, minConnections}, {0, minConnections}} {
		if got := connectionCap(tt.files); got != tt.want {
			t.Errorf("connectionCap(%d) = %d; want %d", tt.files, got, tt.want)
		}
	}
}
