package storetest

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// startAttempt creates run id and moves it to running at attempt 1, as
// the orchestrator's activation does.
func startAttempt(tb testing.TB, s belay.Store, id string) belay.Run {
	tb.Helper()
	mustCreate(tb, s, newRun(id, at(0), "hash-"+id), "")
	r, err := s.Transition(tb.Context(), id, belay.Transition{To: belay.StatusRunning, At: at(10), Attempt: 1,
		Events: []belay.EventInput{{Time: at(10), Type: belay.EventRunStarted}}})
	if err != nil {
		tb.Fatalf("Transition(%s → running, attempt 1): %v", id, err)
	}
	return r
}

// codeHash is a distinct, non-zero code hash per label.
func codeHash(label string) [32]byte { return sha256.Sum256([]byte("claim code " + label)) }

// newClaim is a claim for the run's attempt, expiring at expires.
func newClaim(runID string, attempt int, label string, expires time.Time) belay.Claim {
	return belay.Claim{RunID: runID, Attempt: attempt, CodeHash: codeHash(label), ExpiresAt: expires}
}

func mustCreateClaim(tb testing.TB, s belay.Store, c belay.Claim) {
	tb.Helper()
	if err := s.CreateClaim(tb.Context(), c); err != nil {
		tb.Fatalf("CreateClaim(%s, attempt %d): %v", c.RunID, c.Attempt, err)
	}
}

// wantRefusal fails the test unless err refuses a claim with reason, as
// unauthorized.
func wantRefusal(tb testing.TB, err error, reason belay.ClaimRefusal, what string) {
	tb.Helper()
	wantCode(tb, err, belay.CodeUnauthorized, what)
	got, ok := belay.ClaimRefusalOf(err)
	if !ok {
		tb.Fatalf("%s: error %q is not a claim refusal", what, err)
	}
	if got != reason {
		tb.Fatalf("%s: refused as %s, want %s", what, got, reason)
	}
}

func testClaims(t *testing.T, open opener) {
	t.Run("attempt_recorded", func(t *testing.T) {
		s := open(t, Options{})
		r := startAttempt(t, s, "run-claim")
		if r.Attempt != 1 || mustGet(t, s, "run-claim").Attempt != 1 {
			t.Fatalf("attempt after activation = %d (stored %d), want 1", r.Attempt, mustGet(t, s, "run-claim").Attempt)
		}
		// A transition that does not name an attempt keeps it.
		done := mustTransition(t, s, "run-claim", belay.StatusCompleted, at(20))
		if done.Attempt != 1 || mustGet(t, s, "run-claim").Attempt != 1 {
			t.Fatalf("attempt after completion = %d, want 1", done.Attempt)
		}
		_, err := s.Transition(t.Context(), "run-claim", belay.Transition{To: belay.StatusFailed, At: at(30), Attempt: -1})
		wantCode(t, err, belay.CodeInvalid, "Transition with a negative attempt")
	})

	t.Run("consume_once", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		c := newClaim("run-claim", 1, "a", at(300))
		mustCreateClaim(t, s, c)
		got, err := s.ConsumeClaim(t.Context(), c.CodeHash, "", at(20))
		if err != nil {
			t.Fatalf("ConsumeClaim: %v", err)
		}
		if got.RunID != c.RunID || got.Attempt != 1 || got.CodeHash != c.CodeHash || !got.ExpiresAt.Equal(c.ExpiresAt) {
			t.Fatalf("ConsumeClaim = %+v, want %+v", got, c)
		}
		_, err = s.ConsumeClaim(t.Context(), c.CodeHash, "", at(21))
		wantRefusal(t, err, belay.ClaimUsed, "second ConsumeClaim")
		_, err = s.ConsumeClaim(t.Context(), c.CodeHash, "run-claim", at(21))
		wantRefusal(t, err, belay.ClaimUsed, "second ConsumeClaim naming the run")
	})

	t.Run("consume_naming_the_run", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		c := newClaim("run-claim", 1, "a", at(300))
		mustCreateClaim(t, s, c)
		if _, err := s.ConsumeClaim(t.Context(), c.CodeHash, "run-claim", at(20)); err != nil {
			t.Fatalf("ConsumeClaim naming its run: %v", err)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			setup  func(t *testing.T, s belay.Store) belay.Claim
			runID  string
			now    time.Time
			reason belay.ClaimRefusal
		}{
			{"unknown", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				mustCreateClaim(t, s, newClaim("run-claim", 1, "a", at(300)))
				return newClaim("run-claim", 1, "never stored", at(300))
			}, "", at(20), belay.ClaimUnknown},
			{"another_run", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				startAttempt(t, s, "run-other")
				c := newClaim("run-claim", 1, "a", at(300))
				mustCreateClaim(t, s, c)
				return c
			}, "run-other", at(20), belay.ClaimWrongRun},
			{"expired_at_expiry", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				c := newClaim("run-claim", 1, "a", at(300))
				mustCreateClaim(t, s, c)
				return c
			}, "", at(300), belay.ClaimExpired},
			{"expired_after", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				c := newClaim("run-claim", 1, "a", at(300))
				mustCreateClaim(t, s, c)
				return c
			}, "", at(301), belay.ClaimExpired},
			{"run_queued", func(t *testing.T, s belay.Store) belay.Claim {
				createIn(t, s, "run-claim", belay.StatusQueued)
				c := newClaim("run-claim", 1, "a", at(300))
				mustCreateClaim(t, s, c)
				return c
			}, "", at(20), belay.ClaimRunNotRunning},
			{"run_ended", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				c := newClaim("run-claim", 1, "a", at(300))
				mustCreateClaim(t, s, c)
				mustTransition(t, s, "run-claim", belay.StatusCancelled, at(15))
				return c
			}, "", at(20), belay.ClaimRunNotRunning},
			{"wrong_attempt", func(t *testing.T, s belay.Store) belay.Claim {
				startAttempt(t, s, "run-claim")
				c := newClaim("run-claim", 2, "a", at(300))
				mustCreateClaim(t, s, c)
				return c
			}, "", at(20), belay.ClaimWrongAttempt},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := open(t, Options{})
				c := tc.setup(t, s)
				_, err := s.ConsumeClaim(t.Context(), c.CodeHash, tc.runID, tc.now)
				wantRefusal(t, err, tc.reason, "ConsumeClaim")
			})
		}
	})

	t.Run("refusal_writes_nothing", func(t *testing.T) {
		// A code presented for another run, or too early for its run's
		// attempt, stays good for its own.
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		startAttempt(t, s, "run-other")
		c := newClaim("run-claim", 1, "a", at(300))
		mustCreateClaim(t, s, c)
		_, err := s.ConsumeClaim(t.Context(), c.CodeHash, "run-other", at(20))
		wantRefusal(t, err, belay.ClaimWrongRun, "ConsumeClaim for another run")
		if _, err := s.ConsumeClaim(t.Context(), c.CodeHash, "", at(21)); err != nil {
			t.Fatalf("ConsumeClaim after a refusal: %v", err)
		}
	})

	t.Run("create_invalid", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		for _, tc := range []struct {
			name   string
			mutate func(c *belay.Claim)
		}{
			{"no_run", func(c *belay.Claim) { c.RunID = "" }},
			{"no_attempt", func(c *belay.Claim) { c.Attempt = 0 }},
			{"no_expiry", func(c *belay.Claim) { c.ExpiresAt = time.Time{} }},
			{"no_hash", func(c *belay.Claim) { c.CodeHash = [32]byte{} }},
		} {
			c := newClaim("run-claim", 1, tc.name, at(300))
			tc.mutate(&c)
			wantCode(t, s.CreateClaim(t.Context(), c), belay.CodeInvalid, "CreateClaim "+tc.name)
		}
		wantCode(t, s.CreateClaim(t.Context(), newClaim("run-missing", 1, "m", at(300))), belay.CodeNotFound, "CreateClaim for a missing run")
		c := newClaim("run-claim", 1, "dup", at(300))
		mustCreateClaim(t, s, c)
		wantCode(t, s.CreateClaim(t.Context(), c), belay.CodeConflict, "CreateClaim with a known code hash")
		// The refused duplicate changed nothing: the first is still good.
		if _, err := s.ConsumeClaim(t.Context(), c.CodeHash, "", at(20)); err != nil {
			t.Fatalf("ConsumeClaim after a refused duplicate: %v", err)
		}
	})

	t.Run("concurrent_consume", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		c := newClaim("run-claim", 1, "a", at(300))
		mustCreateClaim(t, s, c)
		const n = 12
		errs := parallel(n, func(int) error {
			_, err := s.ConsumeClaim(t.Context(), c.CodeHash, "", at(20))
			return err
		})
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
				continue
			}
			if reason, ok := belay.ClaimRefusalOf(err); !ok || reason != belay.ClaimUsed {
				t.Fatalf("a losing ConsumeClaim failed with %v, want a refusal as used", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d of %d concurrent ConsumeClaim calls succeeded, want exactly 1", won, n)
		}
	})

	t.Run("sandbox_ref", func(t *testing.T) {
		s := open(t, Options{})
		startAttempt(t, s, "run-claim")
		ref := "arn:aws:ecs:eu-west-1:123456789012:task/belay/0123456789abcdef0123456789abcdef"
		if err := s.RecordSandboxRef(t.Context(), "run-claim", 1, ref); err != nil {
			t.Fatalf("RecordSandboxRef: %v", err)
		}
		if got := mustGet(t, s, "run-claim").SandboxRef; got != ref {
			t.Fatalf("SandboxRef = %q, want %q", got, ref)
		}
		wantCode(t, s.RecordSandboxRef(t.Context(), "run-claim", 2, "task-2"), belay.CodeConflict, "RecordSandboxRef for another attempt")
		wantCode(t, s.RecordSandboxRef(t.Context(), "run-missing", 1, "task-x"), belay.CodeNotFound, "RecordSandboxRef for a missing run")
		for _, bad := range []string{"", "has space", string(make([]byte, belay.MaxSandboxRefLen+1))} {
			wantCode(t, s.RecordSandboxRef(t.Context(), "run-claim", 1, bad), belay.CodeInvalid, fmt.Sprintf("RecordSandboxRef(%.20q)", bad))
		}
		if got := mustGet(t, s, "run-claim").SandboxRef; got != ref {
			t.Fatalf("SandboxRef after refusals = %q, want %q", got, ref)
		}
		mustTransition(t, s, "run-claim", belay.StatusFailed, at(20))
		wantCode(t, s.RecordSandboxRef(t.Context(), "run-claim", 1, "task-late"), belay.CodeConflict, "RecordSandboxRef for an ended run")
	})

}
