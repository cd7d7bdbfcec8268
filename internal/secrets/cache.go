package secrets

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// DefaultTTL is how long a Cache keeps a value when NewCache is given none:
// short enough that a rotated secret is picked up within minutes even if
// nobody calls Invalidate, long enough that Secrets Manager is asked rarely.
const DefaultTTL = 10 * time.Minute

// fetchTimeout bounds one shared fetch. It runs detached from the caller
// that started it, so that caller giving up does not fail the others.
const fetchTimeout = 30 * time.Second

// Cache keeps a Source's value in memory for a TTL. Concurrent callers that
// find it empty or stale share one Fetch; a failed fetch is not cached, so
// the next Get tries again. It is safe for concurrent use and formats as
// "secrets.Cache(redacted)".
type Cache struct {
	src Source
	ttl time.Duration
	now func() time.Time

	mu        sync.Mutex
	value     string
	expiresAt time.Time
	valid     bool
	// gen counts invalidations. A fetch stores its value only if gen has
	// not moved since it started, and callers share a fetch only within
	// one gen, so nothing read before an Invalidate outlives it.
	gen uint64

	flight singleflight.Group
}

// NewCache returns a cache over src. A ttl of zero or less means
// DefaultTTL; a nil now means time.Now.
func NewCache(src Source, ttl time.Duration, now func() time.Time) *Cache {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now == nil {
		now = time.Now
	}
	return &Cache{src: src, ttl: ttl, now: now}
}

// Get returns the cached value, fetching it when it is missing or its TTL
// has passed. A caller whose ctx ends while waiting gets ctx's error; the
// fetch goes on for the others.
func (c *Cache) Get(ctx context.Context) (string, error) {
	c.mu.Lock()
	if c.valid && c.now().Before(c.expiresAt) {
		v := c.value
		c.mu.Unlock()
		return v, nil
	}
	gen := c.gen
	c.mu.Unlock()

	ch := c.flight.DoChan(strconv.FormatUint(gen, 10), func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
		defer cancel()
		v, err := c.src.Fetch(fctx)
		if err != nil {
			return "", err
		}
		c.mu.Lock()
		if c.gen == gen {
			c.value, c.valid, c.expiresAt = v, true, c.now().Add(c.ttl)
		}
		c.mu.Unlock()
		return v, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", fmt.Errorf("fetch secret: %w", r.Err)
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", fmt.Errorf("wait for secret: %w", ctx.Err())
	}
}

// Invalidate drops the cached value, so the next Get fetches a fresh one.
// Call it when the upstream refuses the secret (HTTP 401): the secret was
// probably rotated, and waiting out the TTL would fail every call until
// then.
func (c *Cache) Invalidate() {
	c.mu.Lock()
	c.value, c.valid, c.expiresAt = "", false, time.Time{}
	c.gen++
	c.mu.Unlock()
}

// String keeps the value out of anything that formats the cache.
func (c *Cache) String() string { return "secrets.Cache(redacted)" }

// GoString keeps the value out of %#v.
func (c *Cache) GoString() string { return c.String() }
