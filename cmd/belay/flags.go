package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/sigv4"
)

// This file holds what the subcommands share: flag parsing, and finding the
// server and its token.

// defaultEndpoint is where `belay serve` listens by default.
const defaultEndpoint = "http://" + embedded.DefaultAddr

// envEndpoint names the variable holding the API's base URL.
const envEndpoint = "BELAY_ENDPOINT"

// envAuth says how the client authenticates: "token" (the default, the
// control-plane token) or "sigv4" (the caller's AWS credentials, for a
// stack deployed with -c auth=sigv4).
const envAuth = "BELAY_AUTH"

// sigv4Client returns a client whose calls are signed with the AWS
// credentials of the default chain (AWS_PROFILE, AWS_REGION, ...).
func sigv4Client(endpoint string) (*httpapi.Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "https" {
		return nil, fmt.Errorf("%s=sigv4 needs an https %s (the stack's ApiUrl output); got %q", envAuth, envEndpoint, endpoint)
	}
	tr, err := sigv4.New(context.Background(), u.Hostname())
	if err != nil {
		return nil, err
	}
	return httpapi.NewClient(endpoint, sigv4.TokenPlaceholder,
		httpapi.WithUserAgent("belay-cli/"+version), httpapi.WithHTTPClient(&http.Client{Transport: tr}))
}

// flagError is a command line the flag package refused; it has already
// printed why, with the usage.
type flagError struct{ err error }

func (e flagError) Error() string { return e.err.Error() }

// newFlagSet returns a flag set for a subcommand whose usage names its
// positional arguments.
func newFlagSet(e *env, name, args, doc string) *flag.FlagSet {
	fs := flag.NewFlagSet("belay "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: belay %s %s\n\n%s\n", name, args, doc)
		if hasFlags(fs) {
			fmt.Fprintln(e.stderr, "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parseArgs parses flags anywhere among the arguments, so `belay run DIR
// --follow` works as well as `belay run --follow DIR`, and returns the
// positional arguments. Everything after "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, flagError{err}
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// parseExact parses like parseArgs and requires exactly the named
// positional arguments.
func parseExact(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, pos, names...); err != nil {
		return nil, err
	}
	return pos, nil
}

// wantArgs checks the number of positional arguments.
func wantArgs(fs *flag.FlagSet, got []string, names ...string) error {
	name := strings.TrimPrefix(fs.Name(), "belay ")
	switch {
	case len(got) == len(names):
		return nil
	case len(names) == 0:
		return usagef("%s takes no arguments (got %q); see belay %s -h", name, got, name)
	}
	return usagef("%s takes %s (got %d argument(s)); see belay %s -h", name, strings.Join(names, " "), len(got), name)
}

// stringList is a flag that may be given many times.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ", ") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// client returns a client of BELAY_ENDPOINT (default 127.0.0.1:8700)
// authenticated with BELAY_TOKEN, or with the token `belay serve` wrote to
// the data directory.
func (e *env) client() (*httpapi.Client, error) {
	endpoint := defaultEndpoint
	if v, ok := e.lookup(envEndpoint); ok && strings.TrimSpace(v) != "" {
		endpoint = strings.TrimSpace(v)
	}
	auth, _ := e.lookup(envAuth)
	switch strings.TrimSpace(auth) {
	case "", "token":
	case "sigv4":
		return sigv4Client(endpoint)
	default:
		return nil, usagef("%s=%q: want token (the control-plane token, the default) or sigv4 (sign with your AWS credentials)", envAuth, auth)
	}
	tok, _ := e.lookup(embedded.EnvToken)
	tok = strings.TrimSpace(tok)
	if tok == "" {
		dir := embedded.DefaultDataDir(e.lookup)
		if dir == "" {
			return nil, fmt.Errorf("no control-plane token: set %s (or %s, or HOME, to find the token file of `belay serve`)", embedded.EnvToken, embedded.EnvDataDir)
		}
		var err error
		if tok, err = embedded.ReadControlToken(dir); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no control-plane token: set %s, or start `belay serve` once so it writes %s/%s (data directory from %s)",
					embedded.EnvToken, dir, embedded.ControlTokenFile, embedded.EnvDataDir)
			}
			return nil, fmt.Errorf("control-plane token: %w", err)
		}
	}
	return httpapi.NewClient(endpoint, tok, httpapi.WithUserAgent("belay-cli/"+version))
}
