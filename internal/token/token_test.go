package token_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/token"
)

// testSecret is a fixed secret so that tokens, and the fuzz seed corpus, are
// reproducible.
var testSecret = []byte("belay-token-test-secret-0123456789abcdef")

// t0 is the fixed issuing time of the tests' tokens.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	testRun   = "run-01J9Z3Q4X8"
	testModel = "gpt-test-1"
	testTTL   = 15 * time.Minute
	// refused is the one message a client ever sees for a refused token.
	refused = "invalid or expired run token"
)

// allReasons is every reason Verify can give; the tests check that each one
// is reachable and that they are distinct.
var allReasons = []token.Reason{
	token.ReasonMalformed,
	token.ReasonBadSignature,
	token.ReasonUnsupportedVersion,
	token.ReasonWrongAudience,
	token.ReasonWrongRun,
	token.ReasonWrongModel,
	token.ReasonIssuedInFuture,
	token.ReasonExpired,
}

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func newSigner(tb testing.TB, secret []byte, now time.Time) *token.Signer {
	tb.Helper()
	s, err := token.NewSigner(secret, fixedClock(now))
	if err != nil {
		tb.Fatalf("NewSigner: %v", err)
	}
	return s
}

func issue(tb testing.TB, aud token.Audience, runID, model string) string {
	tb.Helper()
	tok, err := newSigner(tb, testSecret, t0).Issue(aud, runID, model, testTTL)
	if err != nil {
		tb.Fatalf("Issue(%s): %v", aud, err)
	}
	return tok
}

// forge builds a token from a raw payload, independently of the package, so
// tests pin the wire format and can sign payloads Issue would never write.
func forge(tb testing.TB, secret []byte, payload string) string {
	tb.Helper()
	signed := "bt1." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// payloadJSON is the canonical payload for the given fields.
func payloadJSON(version int, aud, runID, model string, iat, exp int64) string {
	return fmt.Sprintf(`{"version":%d,"audience":%q,"runId":%q,"model":%q,"iat":%d,"exp":%d}`,
		version, aud, runID, model, iat, exp)
}

// parts splits a token into its encoded payload and signature.
func parts(tb testing.TB, tok string) (payload, sig string) {
	tb.Helper()
	payload, sig, ok := strings.Cut(strings.TrimPrefix(tok, "bt1."), ".")
	if !ok {
		tb.Fatalf("token has no signature part")
	}
	return payload, sig
}

// assertRefused checks everything a refusal promises: the reason for the
// logs, the single code and message for the client, no claims, and no trace
// of the token in any error text.
func assertRefused(tb testing.TB, tok string, claims token.Claims, err error, want ...token.Reason) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("token accepted, want refusal %v", want)
	}
	var ve *token.VerifyError
	if !errors.As(err, &ve) {
		tb.Fatalf("error %v is not a *token.VerifyError", err)
	}
	ok := false
	for _, r := range want {
		ok = ok || ve.Reason == r
	}
	if !ok {
		tb.Errorf("reason = %q, want one of %v", ve.Reason, want)
	}
	if code := belay.ErrorCode(err); code != belay.CodeUnauthorized {
		tb.Errorf("code = %q, want %q", code, belay.CodeUnauthorized)
	}
	if msg := belay.ErrorMessage(err); msg != refused {
		tb.Errorf("client message = %q, want %q", msg, refused)
	}
	if err.Error() != (&token.VerifyError{Reason: ve.Reason}).Error() {
		tb.Errorf("error text %q depends on more than the reason", err.Error())
	}
	if claims != (token.Claims{}) {
		tb.Errorf("refused token returned claims %+v", claims)
	}
	if len(tok) >= 8 {
		for _, text := range []string{err.Error(), belay.ErrorMessage(err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
			if strings.Contains(text, tok) {
				tb.Errorf("error text %q contains the token", text)
			}
		}
	}
}

func TestNewSignerSecretLength(t *testing.T) {
	for _, tc := range []struct {
		n      int
		wantOK bool
	}{
		{0, false},
		{16, false},
		{31, false},
		{32, true},
		{64, true},
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			s, err := token.NewSigner(bytes.Repeat([]byte{'k'}, tc.n), nil)
			if tc.wantOK != (err == nil) || tc.wantOK != (s != nil) {
				t.Fatalf("NewSigner(%d bytes) = %v, %v; want ok=%v", tc.n, s, err, tc.wantOK)
			}
		})
	}
}

func TestNewSignerCopiesSecret(t *testing.T) {
	secret := bytes.Clone(testSecret)
	s := newSigner(t, secret, t0)
	tok, err := s.Issue(token.AudienceModel, testRun, testModel, testTTL)
	if err != nil {
		t.Fatal(err)
	}
	clear(secret) // a caller zeroing its copy must not change the signer's key
	if _, err := s.Verify(tok, token.Expect{Audience: token.AudienceModel}); err != nil {
		t.Fatalf("Verify after caller cleared its secret: %v", err)
	}
}

// TestIssueWireFormat pins the format other deploys and the sandbox rely
// on: prefix, base64url payload of exactly six canonical keys, HMAC over
// prefix and payload.
func TestIssueWireFormat(t *testing.T) {
	got := issue(t, token.AudienceEvents, testRun, testModel)
	want := forge(t, testSecret, payloadJSON(1, "events", testRun, testModel, t0.Unix(), t0.Add(testTTL).Unix()))
	if got != want {
		t.Fatalf("Issue = %s\nwant   %s", got, want)
	}
}

func TestVerifyAccepts(t *testing.T) {
	iat := time.Unix(t0.Unix(), 0)
	exp := iat.Add(testTTL)
	for _, tc := range []struct {
		name string
		aud  token.Audience
		want token.Expect
		now  time.Time
		skew *time.Duration
	}{
		{name: "model, all checked", aud: token.AudienceModel, want: token.Expect{Audience: token.AudienceModel, RunID: testRun, Model: testModel}, now: t0},
		{name: "events", aud: token.AudienceEvents, want: token.Expect{Audience: token.AudienceEvents, RunID: testRun}, now: t0},
		{name: "approvals", aud: token.AudienceApprovals, want: token.Expect{Audience: token.AudienceApprovals, RunID: testRun}, now: t0},
		{name: "run and model learnt from token", aud: token.AudienceModel, want: token.Expect{Audience: token.AudienceModel}, now: t0},
		{name: "last second of life", aud: token.AudienceModel, want: token.Expect{Audience: token.AudienceModel}, now: exp.Add(-time.Second)},
		{name: "issued at the skew limit", aud: token.AudienceModel, want: token.Expect{Audience: token.AudienceModel}, now: iat.Add(-token.DefaultMaxClockSkew)},
		{name: "wider configured skew", aud: token.AudienceModel, want: token.Expect{Audience: token.AudienceModel}, now: iat.Add(-90 * time.Second), skew: ptr(2 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := issue(t, tc.aud, testRun, testModel)
			v := newSigner(t, testSecret, tc.now)
			if tc.skew != nil {
				v.MaxClockSkew = *tc.skew
			}
			got, err := v.Verify(tok, tc.want)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want := token.Claims{Version: token.Version, Audience: tc.aud, RunID: testRun, Model: testModel, IssuedAt: iat, ExpiresAt: exp}
			assertClaims(t, got, want)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func assertClaims(tb testing.TB, got, want token.Claims) {
	tb.Helper()
	if got.Version != want.Version || got.Audience != want.Audience || got.RunID != want.RunID ||
		got.Model != want.Model || !got.IssuedAt.Equal(want.IssuedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		tb.Fatalf("claims = %+v\nwant     %+v", got, want)
	}
}

func TestVerifyRefuses(t *testing.T) {
	iat, exp := t0.Unix(), t0.Add(testTTL).Unix()
	valid := issue(t, token.AudienceModel, testRun, testModel)
	validPayload, validSig := parts(t, valid)
	model := token.Expect{Audience: token.AudienceModel, RunID: testRun, Model: testModel}
	otherSecret := bytes.Repeat([]byte{'x'}, 32)
	signed := func(payload string) string { return forge(t, testSecret, payload) }
	shortMAC := func() string {
		p := base64.RawURLEncoding.EncodeToString([]byte(payloadJSON(1, "model", testRun, testModel, iat, exp)))
		m := hmac.New(sha256.New, testSecret)
		m.Write([]byte("bt1." + p))
		return "bt1." + p + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:31])
	}

	covered := map[token.Reason]bool{}
	for _, tc := range []struct {
		name   string
		tok    string
		want   token.Expect
		now    time.Time
		reason token.Reason
	}{
		// Not a token of this format at all.
		{name: "empty", tok: "", reason: token.ReasonMalformed},
		{name: "garbage", tok: "definitely not a run token", reason: token.ReasonMalformed},
		{name: "prefix only", tok: "bt1.", reason: token.ReasonMalformed},
		{name: "no prefix", tok: strings.TrimPrefix(valid, "bt1."), reason: token.ReasonMalformed},
		{name: "other prefix", tok: "bt2." + strings.TrimPrefix(valid, "bt1."), reason: token.ReasonMalformed},
		{name: "bearer scheme left on", tok: "Bearer " + valid, reason: token.ReasonMalformed},
		{name: "trailing newline", tok: valid + "\n", reason: token.ReasonMalformed},
		{name: "newline inside signature", tok: "bt1." + validPayload + "." + validSig[:10] + "\n" + validSig[10:], reason: token.ReasonMalformed},
		{name: "no signature", tok: "bt1." + validPayload, reason: token.ReasonMalformed},
		{name: "empty signature", tok: "bt1." + validPayload + ".", reason: token.ReasonMalformed},
		{name: "empty payload", tok: "bt1.." + validSig, reason: token.ReasonMalformed},
		{name: "extra dot at end", tok: valid + ".", reason: token.ReasonMalformed},
		{name: "extra part", tok: valid + "." + validSig, reason: token.ReasonMalformed},
		{name: "padded signature", tok: valid + "=", reason: token.ReasonMalformed},
		{name: "padded payload", tok: "bt1." + validPayload + "==." + validSig, reason: token.ReasonMalformed},
		{name: "short signature", tok: shortMAC(), reason: token.ReasonMalformed},
		{name: "too long", tok: signed(payloadJSON(1, "model", strings.Repeat("r", token.MaxLen), testModel, iat, exp)), want: token.Expect{Audience: token.AudienceModel}, reason: token.ReasonMalformed},

		// Signed with the right secret but not a payload Issue would write.
		{name: "payload not JSON", tok: signed("run=" + testRun), reason: token.ReasonMalformed},
		{name: "payload null", tok: signed("null"), reason: token.ReasonMalformed},
		{name: "unknown key", tok: signed(strings.TrimSuffix(payloadJSON(1, "model", testRun, testModel, iat, exp), "}") + `,"admin":true}`), reason: token.ReasonMalformed},
		{name: "missing version", tok: signed(fmt.Sprintf(`{"audience":"model","runId":%q,"model":%q,"iat":%d,"exp":%d}`, testRun, testModel, iat, exp)), reason: token.ReasonMalformed},
		{name: "missing audience", tok: signed(fmt.Sprintf(`{"version":1,"runId":%q,"model":%q,"iat":%d,"exp":%d}`, testRun, testModel, iat, exp)), reason: token.ReasonMalformed},
		{name: "missing runId", tok: signed(fmt.Sprintf(`{"version":1,"audience":"model","model":%q,"iat":%d,"exp":%d}`, testModel, iat, exp)), reason: token.ReasonMalformed},
		{name: "missing model", tok: signed(fmt.Sprintf(`{"version":1,"audience":"model","runId":%q,"iat":%d,"exp":%d}`, testRun, iat, exp)), reason: token.ReasonMalformed},
		{name: "missing iat", tok: signed(fmt.Sprintf(`{"version":1,"audience":"model","runId":%q,"model":%q,"exp":%d}`, testRun, testModel, exp)), reason: token.ReasonMalformed},
		{name: "missing exp", tok: signed(fmt.Sprintf(`{"version":1,"audience":"model","runId":%q,"model":%q,"iat":%d}`, testRun, testModel, iat)), reason: token.ReasonMalformed},
		{name: "duplicate key", tok: signed(`{"runId":"other",` + strings.TrimPrefix(payloadJSON(1, "model", testRun, testModel, iat, exp), "{")), reason: token.ReasonMalformed},
		{name: "key in other case", tok: signed(strings.Replace(payloadJSON(1, "model", testRun, testModel, iat, exp), `"runId"`, `"RUNID"`, 1)), reason: token.ReasonMalformed},
		{name: "whitespace", tok: signed(strings.ReplaceAll(payloadJSON(1, "model", testRun, testModel, iat, exp), ",", ", ")), reason: token.ReasonMalformed},
		{name: "trailing data", tok: signed(payloadJSON(1, "model", testRun, testModel, iat, exp) + "{}"), reason: token.ReasonMalformed},
		{name: "fractional iat", tok: signed(strings.Replace(payloadJSON(1, "model", testRun, testModel, iat, exp), fmt.Sprint(iat), fmt.Sprint(iat)+".5", 1)), reason: token.ReasonMalformed},
		{name: "string version", tok: signed(strings.Replace(payloadJSON(1, "model", testRun, testModel, iat, exp), `"version":1`, `"version":"1"`, 1)), reason: token.ReasonMalformed},
		{name: "empty runId", tok: signed(payloadJSON(1, "model", "", testModel, iat, exp)), want: token.Expect{Audience: token.AudienceModel}, reason: token.ReasonMalformed},
		{name: "empty model", tok: signed(payloadJSON(1, "model", testRun, "", iat, exp)), want: token.Expect{Audience: token.AudienceModel}, reason: token.ReasonMalformed},
		{name: "expires before issued", tok: signed(payloadJSON(1, "model", testRun, testModel, iat, iat)), reason: token.ReasonMalformed},

		// Altered or signed by someone else.
		{name: "wrong secret", tok: forge(t, otherSecret, payloadJSON(1, "model", testRun, testModel, iat, exp)), reason: token.ReasonBadSignature},
		{name: "payload swapped", tok: "bt1." + base64.RawURLEncoding.EncodeToString([]byte(payloadJSON(1, "model", "run-other", testModel, iat, exp))) + "." + validSig, reason: token.ReasonBadSignature},
		{name: "signature of another token", tok: "bt1." + validPayload + "." + mustParts(t, issue(t, token.AudienceEvents, testRun, testModel)), reason: token.ReasonBadSignature},

		// Signed and well formed, but not for this request.
		{name: "version 2", tok: signed(payloadJSON(2, "model", testRun, testModel, iat, exp)), reason: token.ReasonUnsupportedVersion},
		{name: "version 0", tok: signed(payloadJSON(0, "model", testRun, testModel, iat, exp)), reason: token.ReasonUnsupportedVersion},
		{name: "events token on model route", tok: issue(t, token.AudienceEvents, testRun, testModel), reason: token.ReasonWrongAudience},
		{name: "model token on approvals route", tok: valid, want: token.Expect{Audience: token.AudienceApprovals, RunID: testRun}, reason: token.ReasonWrongAudience},
		{name: "unknown audience", tok: signed(payloadJSON(1, "admin", testRun, testModel, iat, exp)), reason: token.ReasonWrongAudience},
		{name: "other run", tok: issue(t, token.AudienceModel, "run-other", testModel), reason: token.ReasonWrongRun},
		{name: "other model", tok: issue(t, token.AudienceModel, testRun, "gpt-other"), reason: token.ReasonWrongModel},
		{name: "issued beyond skew", tok: valid, now: t0.Add(-token.DefaultMaxClockSkew - time.Second), reason: token.ReasonIssuedInFuture},
		{name: "expired at exp", tok: valid, now: t0.Add(testTTL), reason: token.ReasonExpired},
		{name: "expired long ago", tok: valid, now: t0.Add(24 * time.Hour), reason: token.ReasonExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, now := tc.want, tc.now
			if want == (token.Expect{}) {
				want = model
			}
			if now.IsZero() {
				now = t0
			}
			claims, err := newSigner(t, testSecret, now).Verify(tc.tok, want)
			assertRefused(t, tc.tok, claims, err, tc.reason)
		})
		covered[tc.reason] = true
	}
	for _, r := range allReasons {
		if !covered[r] {
			t.Errorf("no case refuses with reason %q", r)
		}
	}
}

func mustParts(tb testing.TB, tok string) string {
	tb.Helper()
	_, sig := parts(tb, tok)
	return sig
}

func TestReasonsAreDistinct(t *testing.T) {
	seen := map[token.Reason]bool{}
	for _, r := range allReasons {
		if r == "" || seen[r] {
			t.Errorf("reason %q is empty or repeated", r)
		}
		seen[r] = true
	}
}

func TestZeroSkewRefusesAnyFutureIssue(t *testing.T) {
	tok := issue(t, token.AudienceModel, testRun, testModel)
	v := newSigner(t, testSecret, t0.Add(-time.Second))
	v.MaxClockSkew = 0
	claims, err := v.Verify(tok, token.Expect{Audience: token.AudienceModel})
	assertRefused(t, tok, claims, err, token.ReasonIssuedInFuture)
}

func TestVerifyRefusesEveryAlteredByte(t *testing.T) {
	tok := issue(t, token.AudienceModel, testRun, testModel)
	v := newSigner(t, testSecret, t0)
	want := token.Expect{Audience: token.AudienceModel}
	for i := 0; i < len(tok); i++ {
		for _, c := range []byte{tok[i] ^ 0x01, tok[i] ^ 0x20, 'A', '_', '.', '=', 0, 0xff} {
			if c == tok[i] {
				continue
			}
			bad := tok[:i] + string([]byte{c}) + tok[i+1:]
			claims, err := v.Verify(bad, want)
			if err == nil {
				t.Fatalf("token with byte %d changed to %q verified", i, c)
			}
			assertRefused(t, bad, claims, err, token.ReasonMalformed, token.ReasonBadSignature)
		}
	}
}

func TestVerifyRefusesEveryTruncation(t *testing.T) {
	tok := issue(t, token.AudienceModel, testRun, testModel)
	v := newSigner(t, testSecret, t0)
	for n := 0; n < len(tok); n++ {
		claims, err := v.Verify(tok[:n], token.Expect{Audience: token.AudienceModel})
		assertRefused(t, tok[:n], claims, err, token.ReasonMalformed, token.ReasonBadSignature)
	}
}

// TestVerifyRefusesOtherSpellings checks that the same bytes in another
// base64 spelling do not verify: a token has exactly one accepted form.
func TestVerifyRefusesOtherSpellings(t *testing.T) {
	tok := tokenWithURLSafeChars(t)
	payloadEnc, sigEnc := parts(t, tok)
	payload, _ := base64.RawURLEncoding.DecodeString(payloadEnc)
	sig, _ := base64.RawURLEncoding.DecodeString(sigEnc)

	// The signature's last character carries 4 bits of data and 2 unused
	// bits; setting an unused bit decodes to the same bytes in lax mode.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, sigEnc[len(sigEnc)-1])
	laxSig := sigEnc[:len(sigEnc)-1] + string(alphabet[last|1])
	if lax, err := base64.RawURLEncoding.DecodeString(laxSig); err != nil || !bytes.Equal(lax, sig) {
		t.Fatalf("test setup: %q does not decode leniently to the signature", laxSig)
	}

	v := newSigner(t, testSecret, t0)
	for _, tc := range []struct{ name, tok string }{
		{"standard alphabet", "bt1." + base64.RawStdEncoding.EncodeToString(payload) + "." + base64.RawStdEncoding.EncodeToString(sig)},
		{"standard alphabet, signature only", "bt1." + payloadEnc + "." + base64.RawStdEncoding.EncodeToString(sig)},
		{"standard padded", "bt1." + base64.StdEncoding.EncodeToString(payload) + "." + base64.StdEncoding.EncodeToString(sig)},
		{"url padded", "bt1." + base64.URLEncoding.EncodeToString(payload) + "." + base64.URLEncoding.EncodeToString(sig)},
		{"url padded signature only", "bt1." + payloadEnc + "." + base64.URLEncoding.EncodeToString(sig)},
		{"non-canonical trailing bits", "bt1." + payloadEnc + "." + laxSig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tok == tok {
				t.Fatal("test setup: spelling equals the original token")
			}
			claims, err := v.Verify(tc.tok, token.Expect{Audience: token.AudienceModel})
			assertRefused(t, tc.tok, claims, err, token.ReasonMalformed, token.ReasonBadSignature)
		})
	}
}

// tokenWithURLSafeChars finds a model token whose payload and signature both
// use '-' or '_' and whose payload needs padding, so that every alternative
// spelling really differs from it.
func tokenWithURLSafeChars(tb testing.TB) string {
	tb.Helper()
	s := newSigner(tb, testSecret, t0)
	for i := range 10000 {
		// '?' and '~' have the high bit runs that base64 spells '-' or '_'.
		runID := fmt.Sprintf("run-%d?~", i)
		tok, err := s.Issue(token.AudienceModel, runID, testModel, testTTL)
		if err != nil {
			tb.Fatal(err)
		}
		p, sig := parts(tb, tok)
		raw, _ := base64.RawURLEncoding.DecodeString(p)
		if strings.ContainsAny(p, "-_") && strings.ContainsAny(sig, "-_") && len(raw)%3 != 0 {
			return tok
		}
	}
	tb.Fatal("no token with '-' or '_' in both parts")
	return ""
}

// TestRefusalNeverShowsToken is the canary: whatever the reason, neither the
// log text nor the client message carries the token or either of its parts.
func TestRefusalNeverShowsToken(t *testing.T) {
	tok := issue(t, token.AudienceModel, testRun, testModel)
	payloadEnc, sigEnc := parts(t, tok)
	for _, tc := range []struct {
		name string
		tok  string
		want token.Expect
		now  time.Time
	}{
		{"wrong audience", tok, token.Expect{Audience: token.AudienceEvents}, t0},
		{"wrong run", tok, token.Expect{Audience: token.AudienceModel, RunID: "run-other"}, t0},
		{"expired", tok, token.Expect{Audience: token.AudienceModel}, t0.Add(time.Hour)},
		{"tampered", tok[:len(tok)-2] + "AA", token.Expect{Audience: token.AudienceModel}, t0},
		{"extra dot", tok + ".", token.Expect{Audience: token.AudienceModel}, t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newSigner(t, testSecret, tc.now).Verify(tc.tok, tc.want)
			if err == nil {
				t.Fatal("token accepted")
			}
			for _, text := range []string{err.Error(), belay.ErrorMessage(err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
				for _, secret := range []string{tc.tok, tok, payloadEnc, sigEnc[:20]} {
					if strings.Contains(text, secret) {
						t.Errorf("error text %q contains token material", text)
					}
				}
			}
		})
	}
}

func TestVerifyUnknownExpectedAudienceIsCallerBug(t *testing.T) {
	tok := issue(t, token.AudienceModel, testRun, testModel)
	for _, aud := range []token.Audience{"", "admin", "Model"} {
		_, err := newSigner(t, testSecret, t0).Verify(tok, token.Expect{Audience: aud})
		var ve *token.VerifyError
		if err == nil || errors.As(err, &ve) || belay.ErrorCode(err) != belay.CodeInternal {
			t.Errorf("Verify with expected audience %q: err = %v, want an internal error", aud, err)
		}
	}
}

func TestIssueRefusesCallerBugs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		aud          token.Audience
		runID, model string
		ttl          time.Duration
	}{
		{"unknown audience", "admin", testRun, testModel, testTTL},
		{"empty audience", "", testRun, testModel, testTTL},
		{"empty run", token.AudienceModel, "", testModel, testTTL},
		{"empty model", token.AudienceModel, testRun, "", testTTL},
		{"run not UTF-8", token.AudienceModel, "run-\xff", testModel, testTTL},
		{"model not UTF-8", token.AudienceModel, testRun, "gpt\xc3", testTTL},
		{"zero ttl", token.AudienceModel, testRun, testModel, 0},
		{"negative ttl", token.AudienceModel, testRun, testModel, -time.Minute},
		{"sub-second ttl", token.AudienceModel, testRun, testModel, 999 * time.Millisecond},
		{"too long", token.AudienceModel, strings.Repeat("r", token.MaxLen), testModel, testTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := newSigner(t, testSecret, t0).Issue(tc.aud, tc.runID, tc.model, tc.ttl)
			if err == nil || tok != "" {
				t.Fatalf("Issue = %q, %v; want an error", tok, err)
			}
			if belay.ErrorCode(err) != belay.CodeInternal {
				t.Errorf("code = %q, want internal", belay.ErrorCode(err))
			}
		})
	}
}

func TestIssueTruncatesTTLToWholeSeconds(t *testing.T) {
	tok, err := newSigner(t, testSecret, t0.Add(700*time.Millisecond)).Issue(token.AudienceModel, testRun, testModel, 1900*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := newSigner(t, testSecret, t0).Verify(tok, token.Expect{Audience: token.AudienceModel})
	if err != nil {
		t.Fatal(err)
	}
	if !claims.IssuedAt.Equal(t0) || !claims.ExpiresAt.Equal(t0.Add(time.Second)) {
		t.Errorf("iat, exp = %v, %v; want %v, %v", claims.IssuedAt, claims.ExpiresAt, t0, t0.Add(time.Second))
	}
}

// TestIssueSetOneAudienceEach checks that each token of a set opens only its
// own route family.
func TestIssueSetOneAudienceEach(t *testing.T) {
	set, err := newSigner(t, testSecret, t0).IssueSet(testRun, testModel, testTTL)
	if err != nil {
		t.Fatal(err)
	}
	toks := map[token.Audience]string{
		token.AudienceModel:     set.Model,
		token.AudienceEvents:    set.Events,
		token.AudienceApprovals: set.Approvals,
	}
	v := newSigner(t, testSecret, t0.Add(time.Minute))
	for tokAud, tok := range toks {
		for routeAud := range toks {
			claims, err := v.Verify(tok, token.Expect{Audience: routeAud, RunID: testRun, Model: testModel})
			if tokAud != routeAud {
				assertRefused(t, tok, claims, err, token.ReasonWrongAudience)
				continue
			}
			if err != nil {
				t.Fatalf("%s token on its own route: %v", tokAud, err)
			}
			assertClaims(t, claims, token.Claims{Version: token.Version, Audience: tokAud, RunID: testRun, Model: testModel, IssuedAt: t0, ExpiresAt: t0.Add(testTTL)})
		}
	}
}

func TestIssueSetRefusesCallerBugs(t *testing.T) {
	set, err := newSigner(t, testSecret, t0).IssueSet("", testModel, testTTL)
	if err == nil || set != (token.Set{}) {
		t.Fatalf("IssueSet with empty run = %v, %v; want an error and no tokens", set, err)
	}
}

// TestSetPrintsRedacted checks that logging or printing a Set by mistake
// shows no token, under fmt and both slog handlers.
func TestSetPrintsRedacted(t *testing.T) {
	set, err := newSigner(t, testSecret, t0).IssueSet(testRun, testModel, testTTL)
	if err != nil {
		t.Fatal(err)
	}
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("tokens", "set", set, "ptr", &set)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("tokens", "set", set, "ptr", &set)
	outputs := []string{text.String(), js.String(), set.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outputs = append(outputs, fmt.Sprintf(verb, set), fmt.Sprintf(verb, &set))
	}
	for _, out := range outputs {
		for _, tok := range []string{set.Model, set.Events, set.Approvals} {
			_, sig := parts(t, tok)
			if strings.Contains(out, sig) {
				t.Errorf("printed Set %q contains a token", out)
			}
		}
		if !strings.Contains(out, "redacted") {
			t.Errorf("printed Set %q does not say it is redacted", out)
		}
	}
}

func TestRedactAllRemovesEveryToken(t *testing.T) {
	a := issue(t, token.AudienceEvents, "run_a", testModel)
	b := issue(t, token.AudienceModel, "run_b", testModel)
	text := "first " + a + "\nsecond: \"" + b + "\" and a word bt1. and bt1.x end"
	got := token.RedactAll(text)
	if strings.Contains(got, a) || strings.Contains(got, b) || strings.Count(got, "[redacted]") != 2 {
		t.Fatalf("RedactAll = %q", got)
	}
	if !strings.Contains(got, "bt1. and bt1.x end") {
		t.Fatalf("RedactAll changed text that is no token: %q", got)
	}
	if got := string(token.RedactAllBytes([]byte(text))); strings.Contains(got, a) || strings.Contains(got, b) {
		t.Fatalf("RedactAllBytes = %q", got)
	}
	if plain := "no token here"; token.RedactAll(plain) != plain {
		t.Fatal("RedactAll changed text without a token")
	}
}
