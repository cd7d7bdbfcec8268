package token_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/token"
)

var update = flag.Bool("update", false, "rewrite the FuzzVerify seed corpus in testdata")

// fuzzNow is the verifier's clock in FuzzVerify: a minute after t0, inside
// the seed tokens' lifetime, so the fuzzer starts from tokens that verify.
var fuzzNow = t0.Add(time.Minute)

// seedCorpus is the FuzzVerify seed corpus in testdata, by file name. It is
// built from the fixed secret and clock, so TestSeedCorpusIsCurrent also
// catches any change to the wire format: a token issued by the previous
// build must still verify.
func seedCorpus(tb testing.TB) map[string]string {
	tb.Helper()
	s := newSigner(tb, testSecret, t0)
	set, err := s.IssueSet(testRun, testModel, testTTL)
	if err != nil {
		tb.Fatal(err)
	}
	iat, exp := t0.Unix(), t0.Add(testTTL).Unix()
	return map[string]string{
		"valid_model":     set.Model,
		"valid_events":    set.Events,
		"valid_approvals": set.Approvals,
		"wrong_secret":    forge(tb, []byte("another-secret-of-thirty-two-bytes!!"), payloadJSON(1, "model", testRun, testModel, iat, exp)),
		"version_2":       forge(tb, testSecret, payloadJSON(2, "model", testRun, testModel, iat, exp)),
		"unknown_key":     forge(tb, testSecret, `{"version":1,"audience":"model","runId":"r","model":"m","iat":1,"exp":2,"x":0}`),
		"extra_dot":       set.Model + ".",
		"empty":           "",
		"garbage":         "bt1.!!!.???",
	}
}

func TestSeedCorpusIsCurrent(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzVerify")
	for name, tok := range seedCorpus(t) {
		want := "go test fuzz v1\nstring(" + strconv.Quote(tok) + ")\n"
		path := filepath.Join(dir, name)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("read seed (run go test -run TestSeedCorpusIsCurrent -update): %v", err)
		}
		if string(got) != want {
			t.Errorf("%s is stale: the token format changed (rerun with -update only if that is intended)\ngot  %s\nwant %s", path, got, want)
		}
	}
}

// FuzzVerify feeds arbitrary strings to Verify. It must never panic; a
// refusal must carry the single external answer and a text that depends on
// the reason alone; and anything that verifies must be exactly the token
// Issue writes for its claims, so verifying it again gives identical claims.
func FuzzVerify(f *testing.F) {
	for _, tok := range seedCorpus(f) {
		f.Add(tok)
	}
	v := newSigner(f, testSecret, fuzzNow)
	f.Fuzz(func(t *testing.T, tok string) {
		for _, aud := range []token.Audience{token.AudienceModel, token.AudienceEvents, token.AudienceApprovals} {
			claims, err := v.Verify(tok, token.Expect{Audience: aud})
			if err != nil {
				var ve *token.VerifyError
				if !errors.As(err, &ve) {
					t.Fatalf("refusal %v is not a *token.VerifyError", err)
				}
				assertRefused(t, tok, claims, err, allReasons...)
				continue
			}
			if claims.Audience != aud || claims.Version != token.Version {
				t.Fatalf("verified claims %+v for audience %s", claims, aud)
			}
			again, err := newSigner(t, testSecret, claims.IssuedAt).
				Issue(claims.Audience, claims.RunID, claims.Model, claims.ExpiresAt.Sub(claims.IssuedAt))
			if err != nil {
				t.Fatalf("reissue verified claims %+v: %v", claims, err)
			}
			if again != tok {
				t.Fatalf("verified token is not canonical:\n got %q\nwant %q", tok, again)
			}
			reclaims, err := v.Verify(again, token.Expect{Audience: aud, RunID: claims.RunID, Model: claims.Model})
			if err != nil {
				t.Fatalf("reissued token refused: %v", err)
			}
			if reclaims != claims {
				t.Fatalf("round trip changed claims: %+v != %+v", reclaims, claims)
			}
		}
	})
}
