package lambdaenv

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/belay-dev/belay/internal/apigateway"
	"github.com/belay-dev/belay/internal/httpapi"
)

// EnvAuth selects how the public routes (the api and stream functions)
// authenticate a caller: AuthToken or AuthSigV4. The stack sets it from
// its auth context value.
const EnvAuth = "BELAY_AUTH"

// The values of EnvAuth.
const (
	// AuthToken (the default): the control-plane bearer token, as
	// belay serve checks it (EnvToken or EnvControlTokenSecretARN).
	AuthToken = "token"
	// AuthSigV4: API Gateway checks the caller's AWS signature and IAM
	// policy (the public methods' authorization is AWS_IAM); the
	// functions accept a request only when API Gateway's request context
	// names the IAM identity it authenticated, and hold no control-plane
	// token.
	AuthSigV4 = "sigv4"
)

// Auth returns EnvAuth: AuthToken when unset. Any other value is an
// error naming the variable and the values it takes.
func (e *Env) Auth() (string, error) {
	switch v := e.Get(EnvAuth); v {
	case "", AuthToken:
		return AuthToken, nil
	case AuthSigV4:
		return AuthSigV4, nil
	default:
		return "", fmt.Errorf("%s is %q; want %q (the control-plane token, the default) or %q (AWS IAM signatures checked by API Gateway)",
			EnvAuth, v, AuthToken, AuthSigV4)
	}
}

// PublicAuth returns the public routes' authenticator for EnvAuth. Under
// AuthToken it reads the control-plane token (see ControlTokens), once,
// at start; under AuthSigV4 it reads no secret, and a control-plane token
// in the environment is reported as ignored.
func (e *Env) PublicAuth(ctx context.Context, log *slog.Logger) (httpapi.Authenticator, error) {
	mode, err := e.Auth()
	if err != nil {
		return nil, err
	}
	if mode == AuthSigV4 {
		for _, name := range []string{EnvToken, EnvControlTokenSecretARN} {
			if e.Get(name) != "" {
				log.Warn(fmt.Sprintf("%s is set, but %s=%s: the control-plane token is not accepted; callers sign with their AWS credentials", name, EnvAuth, AuthSigV4))
			}
		}
		return apigateway.RequireIAM(log), nil
	}
	tokens, err := e.ControlTokens(ctx)
	if err != nil {
		return nil, err
	}
	return httpapi.ControlTokenAuth(tokens)
}
