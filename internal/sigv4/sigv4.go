// Package sigv4 signs belay's HTTP calls with AWS Signature Version 4
// (aws-sdk-go-v2's signer and credential chain), for a public API deployed
// with AWS IAM authorization (cdk deploy -c auth=sigv4): API Gateway checks
// the signature, so callers use their AWS identities instead of sharing
// one control-plane token.
package sigv4

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
)

// Service is API Gateway's signing name.
const Service = "execute-api"

// TokenPlaceholder stands in for the control-plane token in an
// httpapi.Client whose calls the Transport signs: the client always sets a
// bearer Authorization header, and the Transport replaces it with the
// signature, so the placeholder never leaves the process.
const TokenPlaceholder = "aws-sigv4-signed-request"

// Transport signs each request before Base sends it.
type Transport struct {
	Base        http.RoundTripper
	Credentials aws.CredentialsProvider
	Region      string
	// Now is the signing time; nil means time.Now.
	Now    func() time.Time
	signer *v4.Signer
}

// executeAPIHost matches an API Gateway endpoint and captures its region.
var executeAPIHost = regexp.MustCompile(`^[a-z0-9]+\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$`)

// RegionOf returns the region in an execute-api host name, or "".
func RegionOf(host string) string {
	if m := executeAPIHost.FindStringSubmatch(host); m != nil {
		return m[1]
	}
	return ""
}

// New returns a Transport with the default AWS credential chain
// (environment, shared files and AWS_PROFILE, SSO, container and instance
// roles). The region is the configuration's, else the one in host.
func New(ctx context.Context, host string) (*Transport, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration for signing: %w", err)
	}
	region := cfg.Region
	if region == "" {
		region = RegionOf(host)
	}
	if region == "" {
		return nil, fmt.Errorf("no AWS region to sign for: set AWS_REGION (the endpoint %s names none)", host)
	}
	if cfg.Credentials == nil {
		return nil, errors.New("no AWS credentials to sign with: configure them as for the AWS CLI")
	}
	return &Transport{Base: http.DefaultTransport, Credentials: cfg.Credentials, Region: region}, nil
}

// RoundTrip signs a copy of req (its body hashed, its bearer header
// dropped) and sends it.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.signer == nil {
		t.signer = v4.NewSigner()
	}
	creds, err := t.Credentials.Retrieve(req.Context())
	if err != nil {
		return nil, fmt.Errorf("AWS credentials for signing: %w", err)
	}
	signed := req.Clone(req.Context())
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		signed.Body = io.NopCloser(bytes.NewReader(body))
		signed.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		signed.ContentLength = int64(len(body))
	}
	sum := sha256.Sum256(body)
	signed.Header.Del("Authorization")
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	if err := t.signer.SignHTTP(req.Context(), creds, signed, hex.EncodeToString(sum[:]), Service, t.Region, now()); err != nil {
		return nil, fmt.Errorf("sign the request: %w", err)
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(signed)
}
