package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Authenticator decides whether a request to a public route (/v1 and
// below, but for the webhook, whose signature is its credential) may go
// on. It returns nil to let the request through. A refusal that is a
// *belay.Error reaches the caller with its code and message; any other
// error is answered 401 unauthorized, so an authenticator fails closed.
// It must not quote a credential in its error.
//
// belay serve and the api and stream functions under BELAY_AUTH=token use
// ControlTokenAuth; under BELAY_AUTH=sigv4 the functions trust the IAM
// identity API Gateway authenticated (internal/apigateway).
type Authenticator func(r *http.Request) error

// errNoControlToken is ControlTokenAuth's one refusal: which of a missing,
// malformed or wrong token it was is nobody's business.
var errNoControlToken = belay.Errorf(belay.CodeUnauthorized, "missing or invalid control-plane token")

// ControlTokenAuth returns the Authenticator that accepts a request whose
// "Authorization: Bearer <token>" names one of tokens (each at least
// MinControlTokenLen bytes; more than one lets an operator rotate without
// downtime). The comparison is constant-time over SHA-256 hashes, so it
// also takes the same time whatever the tokens' lengths.
func ControlTokenAuth(tokens []string) (Authenticator, error) {
	if len(tokens) == 0 {
		return nil, errors.New("at least one control-plane token is required")
	}
	hashes := make([][sha256.Size]byte, 0, len(tokens))
	for i, t := range tokens {
		if len(t) < MinControlTokenLen {
			return nil, fmt.Errorf("control-plane token %d is shorter than %d bytes", i, MinControlTokenLen)
		}
		hashes = append(hashes, sha256.Sum256([]byte(t)))
	}
	return func(r *http.Request) error {
		tok, ok := bearer(r)
		if !ok {
			return errNoControlToken
		}
		got := sha256.Sum256([]byte(tok))
		match := 0
		for _, want := range hashes {
			match |= subtle.ConstantTimeCompare(got[:], want[:])
		}
		if match != 1 {
			return errNoControlToken
		}
		return nil
	}, nil
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) (string, bool) {
	v := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// needsPublicAuth reports whether r is for a public route that the
// Authenticator guards: everything under /v1 but the webhook, when this
// server serves it (its handler checks the signature).
func (s *Server) needsPublicAuth(r *http.Request) bool {
	if r.URL.Path != "/v1" && !strings.HasPrefix(r.URL.Path, "/v1/") {
		return false
	}
	return s.webhooks == nil || r.URL.Path != wire.GitHubWebhookPath
}

// authenticate runs the public routes' Authenticator and turns a refusal
// into the error the caller gets: its own when it carries a code, else a
// plain 401.
func (s *Server) authenticate(r *http.Request) error {
	err := s.publicAuth(r)
	if err == nil {
		return nil
	}
	if e, ok := errors.AsType[*belay.Error](err); ok && e.Code != belay.CodeInternal {
		return e
	}
	return belay.Errorf(belay.CodeUnauthorized, "the request is not authenticated")
}
