package main

import (
	"context"
	"strings"
	"testing"
)

// TestAuthChoice: BELAY_AUTH picks how the client commands authenticate;
// a mistake is a usage error, and sigv4 needs the stack's https endpoint.
func TestAuthChoice(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		code int
		want string
	}{
		{map[string]string{envAuth: "kerberos", envEndpoint: "https://x.execute-api.eu-west-1.amazonaws.com/prod"}, 2, `BELAY_AUTH="kerberos"`},
		{map[string]string{envAuth: "sigv4", envEndpoint: "http://127.0.0.1:1"}, 1, "needs an https BELAY_ENDPOINT"},
	} {
		r := belayCLI(t, context.Background(), tc.env, "runs")
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.env, r.code, r.stderr, tc.code, tc.want)
		}
	}
}
