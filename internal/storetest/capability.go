package storetest

import (
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// newCapability returns an active capability for runID.
func newCapability(runID string, maxRequests int, expires time.Time) belay.Capability {
	return belay.Capability{
		RunID: runID, Model: testModel, State: belay.CapabilityActive,
		ExpiresAt: expires, MaxRequests: maxRequests,
	}
}

// mustActivate stores c and fails the test on error.
func mustActivate(tb testing.TB, s belay.Store, c belay.Capability) {
	tb.Helper()
	if err := s.ActivateCapability(tb.Context(), c); err != nil {
		tb.Fatalf("ActivateCapability(%s): %v", c.RunID, err)
	}
}

// mustCapability returns the run's capability.
func mustCapability(tb testing.TB, s belay.Store, runID string) belay.Capability {
	tb.Helper()
	c, err := s.GetCapability(tb.Context(), runID)
	if err != nil {
		tb.Fatalf("GetCapability(%s): %v", runID, err)
	}
	return c
}

// wantCapability fails the test unless the stored capability has the given
// state and used count and otherwise equals c.
func wantCapability(tb testing.TB, s belay.Store, c belay.Capability, state belay.CapabilityState, used int) {
	tb.Helper()
	got := mustCapability(tb, s, c.RunID)
	if got.RunID != c.RunID || got.Model != c.Model || !got.ExpiresAt.Equal(c.ExpiresAt) ||
		got.MaxRequests != c.MaxRequests || got.State != state || got.UsedRequests != used {
		tb.Fatalf("capability = %+v, want run %s model %s expires %v max %d state %s used %d",
			got, c.RunID, c.Model, c.ExpiresAt, c.MaxRequests, state, used)
	}
}

// consume spends one request at now and returns the result.
func consume(tb testing.TB, s belay.Store, runID, model string, now time.Time) belay.ConsumeResult {
	tb.Helper()
	res, err := s.ConsumeModelRequest(tb.Context(), runID, model, now)
	if err != nil {
		tb.Fatalf("ConsumeModelRequest(%s): %v", runID, err)
	}
	return res
}

func testCapability(t *testing.T, open opener) {
	t.Run("activate_get", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusQueued)
		c := newCapability("run-cap", 14, at(600))
		mustActivate(t, s, c)
		wantCapability(t, s, c, belay.CapabilityActive, 0)
	})

	t.Run("activate_invalid", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusQueued)
		for _, c := range []struct {
			name   string
			mutate func(c *belay.Capability)
		}{
			{"no_model", func(c *belay.Capability) { c.Model = "" }},
			{"no_expiry", func(c *belay.Capability) { c.ExpiresAt = time.Time{} }},
			{"zero_budget", func(c *belay.Capability) { c.MaxRequests = 0 }},
			{"negative_budget", func(c *belay.Capability) { c.MaxRequests = -1 }},
		} {
			bad := newCapability("run-cap", 5, at(600))
			c.mutate(&bad)
			wantCode(t, s.ActivateCapability(t.Context(), bad), belay.CodeInvalid, name("ActivateCapability(%s)", c.name))
		}
		wantCode(t, s.ActivateCapability(t.Context(), newCapability("", 5, at(600))), belay.CodeInvalid, "ActivateCapability(no run id)")
		_, err := s.GetCapability(t.Context(), "run-cap")
		wantCode(t, err, belay.CodeNotFound, "GetCapability after refused activations")
		// The refusals left the way open for a good one.
		mustActivate(t, s, newCapability("run-cap", 5, at(600)))
	})

	t.Run("activate_for_a_missing_run", func(t *testing.T) {
		// A capability only ever exists for a run: activating one for a
		// run id that names none is not_found and stores nothing, so no
		// consume can spend it.
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		wantCode(t, s.ActivateCapability(t.Context(), newCapability("run-ghost", 5, at(600))), belay.CodeNotFound,
			"ActivateCapability(missing run)")
		_, err := s.GetCapability(t.Context(), "run-ghost")
		wantCode(t, err, belay.CodeNotFound, "GetCapability after a refused activation")
		if res := consume(t, s, "run-ghost", testModel, at(1)); res.Outcome != belay.ConsumeInactive {
			t.Fatalf("consume for a missing run = %+v, want inactive", res)
		}
		// The run that exists is unaffected.
		mustActivate(t, s, newCapability("run-cap", 5, at(600)))
	})

	t.Run("activate_twice_conflicts", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		c := newCapability("run-cap", 5, at(600))
		mustActivate(t, s, c)
		consume(t, s, "run-cap", testModel, at(1))
		swap := newCapability("run-cap", 500, at(6000))
		wantCode(t, s.ActivateCapability(t.Context(), swap), belay.CodeConflict, "ActivateCapability(already active)")
		wantCapability(t, s, c, belay.CapabilityActive, 1)
	})

	t.Run("revoked_never_revived", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		c := newCapability("run-cap", 5, at(600))
		mustActivate(t, s, c)
		consume(t, s, "run-cap", testModel, at(1))
		if err := s.RevokeCapability(t.Context(), "run-cap"); err != nil {
			t.Fatalf("RevokeCapability: %v", err)
		}
		wantCode(t, s.ActivateCapability(t.Context(), newCapability("run-cap", 5, at(600))), belay.CodeConflict, "ActivateCapability(revoked)")
		wantCapability(t, s, c, belay.CapabilityRevoked, 1)
		if res := consume(t, s, "run-cap", testModel, at(2)); res.Outcome != belay.ConsumeInactive {
			t.Fatalf("consume after a refused re-activation = %s, want inactive", res.Outcome)
		}
	})

	t.Run("consume_counts_down", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		c := newCapability("run-cap", 3, at(600))
		mustActivate(t, s, c)
		for i, want := range []belay.ConsumeResult{
			{Outcome: belay.ConsumeOK, Remaining: 2},
			{Outcome: belay.ConsumeOK, Remaining: 1},
			{Outcome: belay.ConsumeOK, Remaining: 0},
			{Outcome: belay.ConsumeExhausted, Remaining: 0},
			{Outcome: belay.ConsumeExhausted, Remaining: 0},
		} {
			if got := consume(t, s, "run-cap", testModel, at(10+i)); got != want {
				t.Fatalf("consume %d = %+v, want %+v", i+1, got, want)
			}
		}
		wantCapability(t, s, c, belay.CapabilityActive, 3)
	})

	t.Run("expired", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		expires := at(600)
		c := newCapability("run-cap", 10, expires)
		mustActivate(t, s, c)
		if got := consume(t, s, "run-cap", testModel, expires.Add(-time.Nanosecond)); got.Outcome != belay.ConsumeOK {
			t.Fatalf("consume 1ns before expiry = %s, want ok", got.Outcome)
		}
		for _, now := range []time.Time{expires, expires.Add(time.Nanosecond), expires.Add(time.Hour)} {
			want := belay.ConsumeResult{Outcome: belay.ConsumeExpired, Remaining: 9}
			if got := consume(t, s, "run-cap", testModel, now); got != want {
				t.Fatalf("consume at expiry%+v = %+v, want %+v", now.Sub(expires), got, want)
			}
		}
		// Expiry spends nothing and removes nothing.
		wantCapability(t, s, c, belay.CapabilityActive, 1)
	})

	t.Run("inactive", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-none", belay.StatusRunning)
		createIn(t, s, "run-other", belay.StatusRunning)
		createIn(t, s, "run-revoked", belay.StatusRunning)
		other := newCapability("run-other", 10, at(600))
		revoked := newCapability("run-revoked", 10, at(600))
		mustActivate(t, s, other)
		mustActivate(t, s, revoked)
		if err := s.RevokeCapability(t.Context(), "run-revoked"); err != nil {
			t.Fatalf("RevokeCapability: %v", err)
		}
		for _, c := range []struct{ name, run, model string }{
			{"missing_run", "run-missing", testModel},
			{"no_capability", "run-none", testModel},
			{"other_model", "run-other", "some-other-model"},
			{"revoked", "run-revoked", testModel},
		} {
			if got := consume(t, s, c.run, c.model, at(1)); got != (belay.ConsumeResult{Outcome: belay.ConsumeInactive}) {
				t.Fatalf("%s: consume = %+v, want inactive with nothing remaining", c.name, got)
			}
		}
		wantCapability(t, s, other, belay.CapabilityActive, 0)
		wantCapability(t, s, revoked, belay.CapabilityRevoked, 0)
	})

	t.Run("revoke_idempotent", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusRunning)
		c := newCapability("run-cap", 10, at(600))
		mustActivate(t, s, c)
		for i := range 2 {
			if err := s.RevokeCapability(t.Context(), "run-cap"); err != nil {
				t.Fatalf("RevokeCapability #%d: %v", i+1, err)
			}
		}
		wantCapability(t, s, c, belay.CapabilityRevoked, 0)
		for _, id := range []string{"run-missing", "run-cap-none"} {
			if err := s.RevokeCapability(t.Context(), id); err != nil {
				t.Fatalf("RevokeCapability(%s without capability): %v", id, err)
			}
		}
		_, err := s.GetCapability(t.Context(), "run-missing")
		wantCode(t, err, belay.CodeNotFound, "GetCapability after revoking nothing")
	})

	t.Run("get_not_found", func(t *testing.T) {
		s := open(t, Options{})
		createIn(t, s, "run-cap", belay.StatusQueued)
		_, err := s.GetCapability(t.Context(), "run-cap")
		wantCode(t, err, belay.CodeNotFound, "GetCapability(none)")
	})
}
