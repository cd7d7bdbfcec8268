package secrets_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/belay-dev/belay/internal/secrets"
)

// countingSource is a Source whose value, failure and pace the test sets;
// it counts fetches. It stands for a secret store that cannot run here
// (Secrets Manager); the cache only ever sees the Source port.
type countingSource struct {
	mu    sync.Mutex
	value string
	err   error
	gate  chan struct{} // when set, Fetch waits for it to close
	calls atomic.Int64
}

func (s *countingSource) Fetch(ctx context.Context) (string, error) {
	s.calls.Add(1)
	// The answer is fixed when the fetch starts, as a network call's
	// would be; the gate only delays it.
	s.mu.Lock()
	value, err, gate := s.value, s.err, s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done(): // as a network call would
			return "", ctx.Err()
		}
	}
	return value, err
}

func (s *countingSource) set(value string, err error) {
	s.mu.Lock()
	s.value, s.err = value, err
	s.mu.Unlock()
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func mustGet(tb testing.TB, c *secrets.Cache) string {
	tb.Helper()
	v, err := c.Get(tb.Context())
	if err != nil {
		tb.Fatalf("Get: %v", err)
	}
	return v
}

func TestCacheTTL(t *testing.T) {
	tests := []struct {
		name string
		ttl  time.Duration
		want time.Duration // the TTL in force
	}{
		{"explicit", 2 * time.Minute, 2 * time.Minute},
		{"zero-means-default", 0, secrets.DefaultTTL},
		{"negative-means-default", -time.Second, secrets.DefaultTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &countingSource{value: "key-v1"}
			clk := newClock()
			c := secrets.NewCache(src, tt.ttl, clk.now)

			if got := mustGet(t, c); got != "key-v1" {
				t.Fatalf("first Get = %q", got)
			}
			src.set("key-v2", nil)
			clk.advance(tt.want - time.Nanosecond)
			if got := mustGet(t, c); got != "key-v1" || src.calls.Load() != 1 {
				t.Fatalf("Get just before the TTL = %q after %d fetches, want the cached key-v1 after 1", got, src.calls.Load())
			}
			clk.advance(time.Nanosecond)
			if got := mustGet(t, c); got != "key-v2" || src.calls.Load() != 2 {
				t.Fatalf("Get at the TTL = %q after %d fetches, want a fresh key-v2 after 2", got, src.calls.Load())
			}
			if got := mustGet(t, c); got != "key-v2" || src.calls.Load() != 2 {
				t.Fatalf("Get after refresh = %q after %d fetches, want cached key-v2 after 2", got, src.calls.Load())
			}
		})
	}
}

func TestCacheInvalidate(t *testing.T) {
	src := &countingSource{value: "old-key"}
	c := secrets.NewCache(src, time.Hour, newClock().now)
	mustGet(t, c)
	src.set("rotated-key", nil)
	if got := mustGet(t, c); got != "old-key" {
		t.Fatalf("Get before Invalidate = %q, want the cached old-key", got)
	}
	c.Invalidate()
	if got := mustGet(t, c); got != "rotated-key" {
		t.Fatalf("Get after Invalidate = %q, want rotated-key", got)
	}
	if n := src.calls.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
}

func TestCacheFetchErrorNotCached(t *testing.T) {
	src := &countingSource{err: errors.New("throttled")}
	c := secrets.NewCache(src, time.Hour, newClock().now)
	if _, err := c.Get(t.Context()); err == nil || !strings.Contains(err.Error(), "throttled") {
		t.Fatalf("Get with a failing source: %v, want the source's error", err)
	}
	src.set("key", nil)
	if got := mustGet(t, c); got != "key" {
		t.Fatalf("Get after the source recovered = %q, want key", got)
	}
	if n := src.calls.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2 (the failure must not be cached)", n)
	}
}

func TestCacheConcurrentGetsShareOneFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		gate := make(chan struct{})
		src := &countingSource{value: "shared-key", gate: gate}
		c := secrets.NewCache(src, time.Hour, time.Now)

		var wg sync.WaitGroup
		got := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { got[i], errs[i] = c.Get(t.Context()) })
		}
		// Every caller is now either inside the one Fetch or waiting on it.
		synctest.Wait()
		if calls := src.calls.Load(); calls != 1 {
			t.Fatalf("%d concurrent Gets on an empty cache started %d fetches, want 1", n, calls)
		}
		close(gate)
		wg.Wait()
		for i := range n {
			if errs[i] != nil || got[i] != "shared-key" {
				t.Fatalf("Get %d = %q, %v", i, got[i], errs[i])
			}
		}
		if calls := src.calls.Load(); calls != 1 {
			t.Fatalf("%d fetches in all, want 1", calls)
		}
	})
}

// A fetch that began before Invalidate must not satisfy callers that come
// after it: they may be asking because the old value was refused.
func TestCacheInvalidateDuringFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		src := &countingSource{value: "stale-key", gate: gate}
		c := secrets.NewCache(src, time.Hour, time.Now)

		var early string
		var earlyErr error
		var wg sync.WaitGroup
		wg.Go(func() { early, earlyErr = c.Get(t.Context()) })
		synctest.Wait()

		c.Invalidate()
		src.mu.Lock()
		src.gate = nil
		src.mu.Unlock()
		src.set("fresh-key", nil)

		if got := mustGet(t, c); got != "fresh-key" {
			t.Fatalf("Get after Invalidate joined the earlier fetch: %q", got)
		}
		close(gate)
		wg.Wait()
		if earlyErr != nil || early != "stale-key" {
			t.Fatalf("early Get = %q, %v; want the stale-key its fetch read", early, earlyErr)
		}
		if got := mustGet(t, c); got != "fresh-key" {
			t.Fatalf("cache kept %q from a fetch that began before Invalidate", got)
		}
		if calls := src.calls.Load(); calls != 2 {
			t.Fatalf("%d fetches, want 2", calls)
		}
	})
}

// A caller that gives up does not take the shared fetch down with it.
func TestCacheCallerCancelDoesNotFailOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		src := &countingSource{value: "key", gate: gate}
		c := secrets.NewCache(src, time.Hour, time.Now)

		ctx, cancel := context.WithCancel(t.Context())
		var firstErr, secondErr error
		var second string
		var wg sync.WaitGroup
		wg.Go(func() { _, firstErr = c.Get(ctx) })
		synctest.Wait()
		wg.Go(func() { second, secondErr = c.Get(t.Context()) })
		synctest.Wait()

		cancel()
		synctest.Wait()
		close(gate)
		wg.Wait()
		if !errors.Is(firstErr, context.Canceled) {
			t.Fatalf("cancelled caller got %v, want context.Canceled", firstErr)
		}
		if secondErr != nil || second != "key" {
			t.Fatalf("other caller got %q, %v; want key", second, secondErr)
		}
		if calls := src.calls.Load(); calls != 1 {
			t.Fatalf("%d fetches, want 1", calls)
		}
	})
}

func TestCacheNeverFormatsItsValue(t *testing.T) {
	const canary = "sk-CANARY-7d41f0c2b9"
	c := secrets.NewCache(secrets.NewStaticSource(canary), 0, nil)
	if got := mustGet(t, c); got != canary {
		t.Fatalf("Get = %q", got)
	}
	static := secrets.NewStaticSource(canary)
	for _, s := range []string{
		fmt.Sprintf("%v %+v %#v %s", c, c, c, c),
		fmt.Sprintf("%v %+v %#v %s", static, static, static, static),
		fmt.Sprintf("%v %+v %#v", *static, *static, *static),
	} {
		if strings.Contains(s, canary) {
			t.Fatalf("formatting shows the secret: %s", s)
		}
	}
}
