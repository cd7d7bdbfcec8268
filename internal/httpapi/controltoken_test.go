package httpapi_test

import (
	"crypto/sha256"
	"net/http"
	"strconv"
	"testing"
)

// TestControlTokenIsComparedWhole: the server compares the SHA-256 of the
// bearer token with each configured token's, so a wrong token whose hash
// shares its first bytes with the right one's must still be refused. The
// test finds such a token by brute force (two bytes: about 65,000 hashes).
func TestControlTokenIsComparedWhole(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	want := sha256.Sum256([]byte(h.controlToken))
	var near string
	for i := 0; ; i++ {
		cand := "ctl-near-miss-" + strconv.Itoa(i)
		if sum := sha256.Sum256([]byte(cand)); sum[0] == want[0] && sum[1] == want[1] && cand != h.controlToken {
			near = cand
			break
		}
	}
	nearSum := sha256.Sum256([]byte(near))
	if nearSum == want {
		t.Fatal("found the token itself")
	}
	if a := h.do(t, "GET", "/v1/runs", near, nil, nil); a.status != http.StatusUnauthorized {
		t.Fatalf("a token whose hash shares its first two bytes with the control token's: %d, want 401", a.status)
	}
	if a := h.do(t, "GET", "/v1/runs", h.controlToken, nil, nil); a.status != http.StatusOK {
		t.Fatalf("the control token itself: %d, want 200", a.status)
	}
}
