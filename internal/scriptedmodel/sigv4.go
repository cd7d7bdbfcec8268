package scriptedmodel

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// sigv4Check is what WithSigV4 configured.
type sigv4Check struct {
	creds  aws.Credentials
	region string
}

// WithSigV4 makes the server check every Converse request's SigV4
// signature (service "bedrock") against creds and region, as Bedrock
// does: a request that is unsigned, signed by other credentials, for
// another region or service, more than five minutes off the server's
// clock, or altered after signing is answered 403 and recorded with its
// SignatureError.
func WithSigV4(creds aws.Credentials, region string) Option {
	return func(s *Server) { s.sigv4 = &sigv4Check{creds: creds, region: region} }
}

// sigv4Skew is how far a signature's time may be from the server's.
const sigv4Skew = 5 * time.Minute

// VerifySigV4 recomputes r's SigV4 signature with creds, for the region
// and service, over body (the request's body, already read), using
// aws-sdk-go-v2's own signer, and compares it with the one r carries. It
// returns nil when they match; the error says what differs, without any
// secret.
func VerifySigV4(r *http.Request, body []byte, creds aws.Credentials, region, service string, now time.Time) error {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return errors.New("not signed with AWS4-HMAC-SHA256")
	}
	fields := map[string]string{}
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[4] != "aws4_request" {
		return errors.New("malformed credential scope")
	}
	switch {
	case scope[0] != creds.AccessKeyID:
		return errors.New("signed with another access key")
	case scope[2] != region:
		return fmt.Errorf("signed for region %q, want %q", scope[2], region)
	case scope[3] != service:
		return fmt.Errorf("signed for service %q, want %q", scope[3], service)
	}
	signedAt, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return errors.New("no valid X-Amz-Date")
	}
	if d := now.Sub(signedAt); d > sigv4Skew || d < -sigv4Skew {
		return fmt.Errorf("signed at %s, more than %s from now", signedAt.Format(time.RFC3339), sigv4Skew)
	}
	if scope[1] != signedAt.Format("20060102") {
		return errors.New("the credential scope's date is not the signing date")
	}
	if creds.SessionToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Amz-Security-Token")), []byte(creds.SessionToken)) != 1 {
		return errors.New("the session token does not match")
	}
	sum := sha256.Sum256(body)
	payloadHash := hex.EncodeToString(sum[:])
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" && h != payloadHash {
		return errors.New("X-Amz-Content-Sha256 is not the body's hash")
	}

	// The request as the client signed it: the same method, path and
	// query, and exactly the headers it says it signed.
	u := *r.URL
	u.Scheme, u.Host = "http", r.Host
	again := &http.Request{Method: r.Method, URL: &u, Host: r.Host, Header: http.Header{}, ContentLength: r.ContentLength}
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		switch h {
		case "host", "content-length":
			continue
		}
		if vs := r.Header.Values(h); len(vs) > 0 {
			again.Header[http.CanonicalHeaderKey(h)] = vs
		}
	}
	signer := v4.NewSigner()
	if err := signer.SignHTTP(context.Background(), creds, again, payloadHash, service, region, signedAt); err != nil {
		return fmt.Errorf("recompute the signature: %w", err)
	}
	want := signatureOf(again.Header.Get("Authorization"))
	got := fields["Signature"]
	if signedHeadersOf(again.Header.Get("Authorization")) != fields["SignedHeaders"] {
		return errors.New("the signed headers differ")
	}
	if want == "" || subtle.ConstantTimeCompare([]byte(want), []byte(got)) != 1 {
		return errors.New("the signature does not match")
	}
	return nil
}

func signatureOf(auth string) string {
	_, sig, _ := strings.Cut(auth, "Signature=")
	return sig
}

func signedHeadersOf(auth string) string {
	_, rest, _ := strings.Cut(auth, "SignedHeaders=")
	sh, _, _ := strings.Cut(rest, ",")
	return sh
}
