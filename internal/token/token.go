// Package token issues and verifies run tokens: the short-lived, HMAC-signed
// capabilities a sandbox presents on belay's internal routes. A run gets one
// token per audience (model calls, event append, approval polling) so that a
// token leaked from one channel cannot buy the other two authorities.
//
// A token is "bt1." + base64url(payload) + "." + base64url(HMAC-SHA256), with
// no padding. The MAC covers the prefix and the encoded payload. The payload
// is a JSON object with exactly the keys version, audience, runId, model, iat
// and exp, in canonical form; anything else is refused. Verification tells
// the caller's logs why a token was refused (see Reason) and gives the client
// one answer for every refusal, so a prober learns nothing from the response.
package token

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
)

// Version is the payload version this package issues and the only one it
// accepts. A change to the claims or their meaning bumps it, so an old
// verifier refuses a new token instead of misreading it.
const Version = 1

// MinSecretLen is the shortest HMAC secret NewSigner accepts: 32 bytes, the
// size of the SHA-256 output, below which the key, not the hash, is the weak
// link.
const MinSecretLen = 32

// DefaultMaxClockSkew is how far in the future a token's issued-at may lie
// and still be accepted, for control-plane hosts whose clocks disagree a little.
const DefaultMaxClockSkew = 30 * time.Second

// MaxLen bounds the length of a token, in bytes. Verify refuses anything
// longer before doing any work, and Issue refuses to mint a token it would
// later refuse.
const MaxLen = 4096

const (
	// prefix marks the token format. It is covered by the MAC, and it lets a
	// secret scanner or a log filter recognise a run token on sight.
	prefix = "bt1."
	// macLen is the size of an HMAC-SHA256 tag.
	macLen = sha256.Size
	// refusedMessage is the single answer a client gets for any refused
	// token. It never names the reason or quotes the token.
	refusedMessage = "invalid or expired run token"
)

// b64 is unpadded base64url in strict mode, so each byte string has exactly
// one accepted encoding: a token cannot be altered into another spelling that
// still verifies.
var b64 = base64.RawURLEncoding.Strict()

// Audience names the one internal route family a token is good for.
type Audience string

// The audiences of a run's tokens, one per internal route family.
const (
	// AudienceModel authorises POST /internal/v1/chat/completions.
	AudienceModel Audience = "model"
	// AudienceEvents authorises appending to the run's event log.
	AudienceEvents Audience = "events"
	// AudienceApprovals authorises asking for and polling approvals.
	AudienceApprovals Audience = "approvals"
)

// valid reports whether a is one of the three audiences; anything else is a
// caller bug on the issuing or expecting side.
func (a Audience) valid() bool {
	switch a {
	case AudienceModel, AudienceEvents, AudienceApprovals:
		return true
	}
	return false
}

// Claims is what a verified token asserts. It holds the six payload fields
// and nothing else: no keys, prompts or run state ever ride in a token.
type Claims struct {
	Version   int
	Audience  Audience
	RunID     string
	Model     string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// payload is the wire form of Claims. Field order fixes the canonical JSON
// that Issue writes and Verify insists on.
type payload struct {
	Version  int      `json:"version"`
	Audience Audience `json:"audience"`
	RunID    string   `json:"runId"`
	Model    string   `json:"model"`
	IssuedAt int64    `json:"iat"`
	Expires  int64    `json:"exp"`
}

// Set is the three tokens of one run. It is handed to the sandbox once and
// then only read; its String, Format and LogValue methods redact, so logging
// a Set by mistake leaks no token.
type Set struct {
	Model     string `json:"model"`
	Events    string `json:"events"`
	Approvals string `json:"approvals"`
}

const redactedSet = "token.Set{Model:[redacted] Events:[redacted] Approvals:[redacted]}"

// String redacts the tokens so a Set printed by mistake leaks nothing.
func (Set) String() string { return redactedSet }

// Format redacts the tokens under every fmt verb, including %#v and %d,
// which would otherwise print the fields.
func (Set) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redactedSet)) }

// LogValue redacts the tokens in slog output, including the JSON handler,
// which would otherwise marshal the fields.
func (Set) LogValue() slog.Value { return slog.StringValue(redactedSet) }

// Expect is what the route verifying a token requires of it. Audience is
// always checked. An empty RunID or Model means the route does not know it
// yet and learns it from the verified claims (the model proxy learns the run
// id this way); the caller then must use the claims, not its own guess.
type Expect struct {
	Audience Audience
	RunID    string
	Model    string
}

// Reason says why a token was refused. It is for logs and metrics only; the
// client gets the same answer whatever the reason.
type Reason string

// The reasons Verify refuses a token with, one per check.
const (
	// ReasonMalformed: not a token of this format (bad prefix, parts,
	// base64, length, or payload JSON), including payloads that are signed
	// but not canonical.
	ReasonMalformed Reason = "malformed"
	// ReasonBadSignature: the MAC does not match; the token was altered or
	// signed with another secret.
	ReasonBadSignature Reason = "bad_signature"
	// ReasonUnsupportedVersion: signed by us, but with a payload version
	// this build does not understand.
	ReasonUnsupportedVersion Reason = "unsupported_version"
	// ReasonWrongAudience: a token for another route family.
	ReasonWrongAudience Reason = "wrong_audience"
	// ReasonWrongRun: a token for another run.
	ReasonWrongRun Reason = "wrong_run"
	// ReasonWrongModel: a token for another model.
	ReasonWrongModel Reason = "wrong_model"
	// ReasonIssuedInFuture: issued-at lies beyond the allowed clock skew.
	ReasonIssuedInFuture Reason = "issued_in_future"
	// ReasonExpired: the token's lifetime is over.
	ReasonExpired Reason = "expired"
)

// VerifyError is a refused token. Its Reason tells the logs which check
// failed; it unwraps to a *belay.Error with code unauthorized and one fixed
// message, so the HTTP adapter answers every refusal the same way. Neither
// text ever includes the token.
type VerifyError struct {
	Reason Reason
}

// Error names the reason, for logs. Clients see belay.ErrorMessage instead.
func (e *VerifyError) Error() string {
	return "run token refused: " + string(e.Reason)
}

// Unwrap gives belay.ErrorCode and belay.ErrorMessage the single external
// answer: unauthorized, "invalid or expired run token".
func (e *VerifyError) Unwrap() error {
	return &belay.Error{Code: belay.CodeUnauthorized, Message: refusedMessage}
}

func refuse(r Reason) (Claims, error) {
	return Claims{}, &VerifyError{Reason: r}
}

// Signer issues and verifies run tokens with one HMAC secret. The control
// plane holds one Signer for its lifetime; it is safe for concurrent use once
// configured.
type Signer struct {
	key []byte
	now func() time.Time

	// MaxClockSkew is how far in the future issued-at may lie before Verify
	// refuses the token. NewSigner sets DefaultMaxClockSkew; set it before
	// first use. A negative value counts as zero.
	MaxClockSkew time.Duration
}

// NewSigner returns a Signer for secret, reading time from now (time.Now when
// nil). It refuses a secret shorter than MinSecretLen so that the server
// refuses to start rather than mint forgeable tokens. The secret is copied.
func NewSigner(secret []byte, now func() time.Time) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("run token secret is %d bytes, need at least %d", len(secret), MinSecretLen)
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{
		key:          bytes.Clone(secret),
		now:          now,
		MaxClockSkew: DefaultMaxClockSkew,
	}, nil
}

// Issue mints a token for one audience of one run, valid from now for ttl
// (whole seconds; ttl must be at least one second). An error here is a caller
// bug, not a client's fault: an unknown audience, an empty or non-UTF-8 run
// id or model, or values too long to fit MaxLen.
func (s *Signer) Issue(aud Audience, runID, model string, ttl time.Duration) (string, error) {
	tok, err := s.issue(aud, runID, model, s.now(), ttl)
	if err != nil {
		return "", fmt.Errorf("issue %s run token: %w", aud, err)
	}
	return tok, nil
}

// IssueSet mints the three tokens of a run, with one issued-at and one expiry.
func (s *Signer) IssueSet(runID, model string, ttl time.Duration) (Set, error) {
	now := s.now()
	var set Set
	for _, t := range []struct {
		aud Audience
		dst *string
	}{
		{AudienceModel, &set.Model},
		{AudienceEvents, &set.Events},
		{AudienceApprovals, &set.Approvals},
	} {
		tok, err := s.issue(t.aud, runID, model, now, ttl)
		if err != nil {
			return Set{}, fmt.Errorf("issue run token set: %s: %w", t.aud, err)
		}
		*t.dst = tok
	}
	return set, nil
}

func (s *Signer) issue(aud Audience, runID, model string, now time.Time, ttl time.Duration) (string, error) {
	switch {
	case !aud.valid():
		return "", fmt.Errorf("unknown audience %q", aud)
	case runID == "" || !utf8.ValidString(runID):
		// JSON would silently replace invalid UTF-8, and the token would
		// then name a run other than the one asked for.
		return "", errors.New("run id is empty or not valid UTF-8")
	case model == "" || !utf8.ValidString(model):
		return "", errors.New("model is empty or not valid UTF-8")
	case ttl < time.Second:
		return "", fmt.Errorf("ttl %v is shorter than one second", ttl)
	}
	iat := now.Unix()
	p := payload{
		Version:  Version,
		Audience: aud,
		RunID:    runID,
		Model:    model,
		IssuedAt: iat,
		Expires:  iat + int64(ttl/time.Second),
	}
	body, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode payload: %w", err)
	}
	signed := prefix + b64.EncodeToString(body)
	tok := signed + "." + b64.EncodeToString(s.mac(signed))
	if len(tok) > MaxLen {
		return "", fmt.Errorf("token would be %d bytes, more than %d", len(tok), MaxLen)
	}
	return tok, nil
}

// Verify checks tok against want and returns its claims. Every refusal is a
// *VerifyError with its own Reason and the single external answer (code
// unauthorized). The checks run in this order, so the reason names the first
// that failed: shape, signature (constant time, before the payload is
// parsed), payload, version, audience, run, model, issued-at, expiry. An
// invalid want.Audience is a caller bug and returns an internal error.
func (s *Signer) Verify(tok string, want Expect) (Claims, error) {
	if !want.Audience.valid() {
		return Claims{}, fmt.Errorf("verify run token: expected audience %q is unknown", want.Audience)
	}
	if len(tok) > MaxLen {
		return refuse(ReasonMalformed)
	}
	rest, ok := strings.CutPrefix(tok, prefix)
	if !ok {
		return refuse(ReasonMalformed)
	}
	encPayload, encMAC, ok := strings.Cut(rest, ".")
	// The decoder skips '\r' and '\n', so check the alphabet first: a
	// token must have one spelling only.
	if !ok || !isBase64URL(encPayload) || !isBase64URL(encMAC) {
		return refuse(ReasonMalformed)
	}
	gotMAC, err := b64.DecodeString(encMAC)
	if err != nil || len(gotMAC) != macLen {
		return refuse(ReasonMalformed)
	}
	if !hmac.Equal(gotMAC, s.mac(prefix+encPayload)) {
		return refuse(ReasonBadSignature)
	}

	// From here on the payload is ours; the checks below are defence in
	// depth against a bug in some issuer, and the claims checks proper.
	body, err := b64.DecodeString(encPayload)
	if err != nil {
		return refuse(ReasonMalformed)
	}
	p, ok := decodePayload(body)
	if !ok {
		return refuse(ReasonMalformed)
	}
	if p.Version != Version {
		return refuse(ReasonUnsupportedVersion)
	}
	if p.Audience != want.Audience {
		return refuse(ReasonWrongAudience)
	}
	if want.RunID != "" && p.RunID != want.RunID {
		return refuse(ReasonWrongRun)
	}
	if want.Model != "" && p.Model != want.Model {
		return refuse(ReasonWrongModel)
	}
	now := s.now()
	iat, exp := time.Unix(p.IssuedAt, 0), time.Unix(p.Expires, 0)
	if iat.After(now.Add(max(s.MaxClockSkew, 0))) {
		return refuse(ReasonIssuedInFuture)
	}
	if !now.Before(exp) {
		return refuse(ReasonExpired)
	}
	return Claims{
		Version:   p.Version,
		Audience:  p.Audience,
		RunID:     p.RunID,
		Model:     p.Model,
		IssuedAt:  iat,
		ExpiresAt: exp,
	}, nil
}

// decodePayload parses body and accepts it only if it is exactly what Issue
// would have written for the same claims. Re-encoding and comparing rejects
// unknown, missing, duplicate and differently-cased keys, other number
// spellings and whitespace in one rule, which encoding/json alone does not.
func decodePayload(body []byte) (payload, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var p payload
	if err := dec.Decode(&p); err != nil {
		return payload{}, false
	}
	canonical, err := json.Marshal(p)
	if err != nil || !bytes.Equal(canonical, body) {
		return payload{}, false
	}
	if p.RunID == "" || p.Model == "" || p.Expires <= p.IssuedAt {
		return payload{}, false
	}
	return p, true
}

func (s *Signer) mac(signed string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(signed))
	return m.Sum(nil)
}

// isBase64URL reports whether v is non-empty and uses only the base64url
// alphabet (no padding, no '+' or '/', no whitespace).
func isBase64URL(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// tokenShape matches anything shaped like a run token: the prefix and two
// base64url parts. It is broader than what Verify accepts, on purpose.
var tokenShape = regexp.MustCompile(`bt1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+`)

// RedactAll replaces everything in s shaped like a run token with
// "[redacted]", whichever run or attempt it belongs to. It is for text a
// sandbox produced and the control plane stores or logs, where the tokens
// the sandbox held are not all known to the caller (the claim exchange
// issues them), so a run token quoted verbatim is never kept.
func RedactAll(s string) string {
	if !strings.Contains(s, prefix) {
		return s
	}
	return tokenShape.ReplaceAllString(s, "[redacted]")
}

// RedactAllBytes is RedactAll for a file's content.
func RedactAllBytes(b []byte) []byte {
	if !bytes.Contains(b, []byte(prefix)) {
		return b
	}
	return tokenShape.ReplaceAll(b, []byte("[redacted]"))
}
