package belay_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

func TestNewClaimDrawsA256BitCodeStoredOnlyAsItsHash(t *testing.T) {
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	entropy := bytes.Repeat([]byte{0xab}, belay.ClaimCodeBytes)
	code, c, err := belay.NewClaim("run_1", 1, now, bytes.NewReader(entropy))
	if err != nil {
		t.Fatal(err)
	}
	if want := base64.RawURLEncoding.EncodeToString(entropy); code.Reveal() != want {
		t.Fatalf("code = %q, want base64url of the entropy %q", code.Reveal(), want)
	}
	if c.CodeHash != sha256.Sum256(entropy) || c.RunID != "run_1" || c.Attempt != 1 || !c.ExpiresAt.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("claim = %+v", c)
	}
	if h, ok := belay.HashClaimCode(code.Reveal()); !ok || h != c.CodeHash {
		t.Fatalf("HashClaimCode(code) = %x, %v; want the stored hash", h, ok)
	}
	if err := belay.CheckClaim(c); err != nil {
		t.Fatalf("CheckClaim: %v", err)
	}
	// Two codes from real entropy differ.
	a, _, _ := belay.NewClaim("run_1", 1, now, rand.Reader)
	b, _, _ := belay.NewClaim("run_1", 1, now, rand.Reader)
	if a.Reveal() == b.Reveal() {
		t.Fatal("two claim codes are equal")
	}
	if _, _, err := belay.NewClaim("run_1", 1, now, bytes.NewReader(entropy[:5])); err == nil {
		t.Fatal("NewClaim with short entropy succeeded")
	}
}

func TestHashClaimCodeRefusesWhatIsNotACode(t *testing.T) {
	good := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for _, bad := range []string{"", "x", good[:42], good + "A", good[:42] + "=", strings.ReplaceAll(good, "B", "+"),
		base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{7}, 31)), good[:40] + "\n" + good[41:]} {
		if _, ok := belay.HashClaimCode(bad); ok {
			t.Errorf("HashClaimCode(%q) accepted it", bad)
		}
	}
	// A non-canonical last character (unused bits set) is refused: one
	// code, one spelling.
	last := good[len(good)-1]
	alt := good[:len(good)-1] + string(last+1)
	if _, ok := belay.HashClaimCode(alt); ok {
		t.Errorf("HashClaimCode accepted a second spelling %q of %q", alt, good)
	}
}

// TestClaimCodePrintsRedacted: a spec holding a claim code, printed or
// logged or encoded by mistake, shows no code.
func TestClaimCodePrintsRedacted(t *testing.T) {
	const canary = "CANARYclaimCode0123456789abcdefghijklmnopqr"
	spec := belay.SpecFor("run_1", belay.RunRequest{Instruction: "fix it", Model: "m"})
	spec.Claim = belay.ClaimCode(canary)
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("launch", "claim", spec.Claim, "spec", spec, "ptr", &spec)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("launch", "claim", spec.Claim, "spec", spec, "ptr", &spec)
	specJSON, _ := json.Marshal(spec)
	codeJSON, _ := json.Marshal(spec.Claim)
	outputs := []string{text.String(), js.String(), string(specJSON), string(codeJSON), spec.Claim.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outputs = append(outputs, fmt.Sprintf(verb, spec.Claim), fmt.Sprintf(verb, spec), fmt.Sprintf(verb, &spec))
	}
	for _, out := range outputs {
		if strings.Contains(out, "CANARY") {
			t.Errorf("output shows the claim code: %s", out)
		}
	}
	if !strings.Contains(fmt.Sprintf("%+v", spec), "redacted claim code") {
		t.Error("a printed spec does not say its claim code is redacted")
	}
	if spec.Claim.Reveal() != canary {
		t.Error("Reveal does not give the code")
	}
}

func TestClaimRefusalsAreOneAnswer(t *testing.T) {
	var msgs []string
	for _, r := range []belay.ClaimRefusal{belay.ClaimMalformed, belay.ClaimUnknown, belay.ClaimUsed, belay.ClaimExpired,
		belay.ClaimWrongRun, belay.ClaimWrongAttempt, belay.ClaimRunNotRunning, belay.ClaimCapabilityInactive} {
		err := fmt.Errorf("consume: %w", belay.RefuseClaim(r))
		if got, ok := belay.ClaimRefusalOf(err); !ok || got != r {
			t.Fatalf("ClaimRefusalOf = %q, %v; want %q", got, ok, r)
		}
		if belay.ErrorCode(err) != belay.CodeUnauthorized {
			t.Fatalf("refusal %s has code %s, want unauthorized", r, belay.ErrorCode(err))
		}
		msgs = append(msgs, belay.ErrorMessage(err))
	}
	for _, m := range msgs {
		if m != msgs[0] {
			t.Fatalf("refusals answer differently: %q", msgs)
		}
	}
	if _, ok := belay.ClaimRefusalOf(belay.Errorf(belay.CodeUnauthorized, "x")); ok {
		t.Fatal("ClaimRefusalOf accepted an error that is not a claim refusal")
	}
}
