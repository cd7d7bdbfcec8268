// Command belay is belay's command line: `belay serve` runs the embedded
// control plane on this machine, and the other subcommands are clients of
// the public API (DESIGN.md "API contract (v1)"), of this machine's server
// or of one on AWS, built on httpapi.Client. Each subcommand lives in a file
// of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

// env is what a subcommand may use of the process: its output streams and
// its environment. Tests pass their own.
type env struct {
	// stdin is read by interactive commands (belay session chat); nil
	// reads nothing.
	stdin          io.Reader
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
}

// command is one subcommand.
type command struct {
	name, args, summary string
	run                 func(ctx context.Context, e *env, args []string) error
}

// commands are the subcommands, in the order `belay help` lists them.
var commands = []command{
	{"serve", "[flags]", "run the embedded control plane on this machine", cmdServe},
	{"run", "DIR --instruction TEXT --allow PATH --check CMD [flags]", "ask for a run on the files under DIR", cmdRun},
	{"config", "[--json]", "print what the server accepts: model, extensions, checks, limits", cmdConfig},
	{"runs", "[--status S] [--limit N] [--cursor C] [--json] | runs show ID [--json]", "list runs, or show one", cmdRuns},
	{"events", "ID [--follow] [--after N] [--json]", "print a run's events", cmdEvents},
	{"approvals", "ID [--json]", "list a run's approval requests", cmdApprovals},
	{"approve", "ID APPROVAL DECISION [--reason R]", "answer an approval: allow_once, allow_session, deny or cancel", cmdApprove},
	{"cancel", "ID", "cancel a run", cmdCancel},
	{"artifacts", "ID [NAME]", "list a run's artifacts, or print one", cmdArtifacts},
	{"session", "new DIR ... | chat ID | show ID | patch ID | close ID", "multi-turn sessions with the agent over one workspace", cmdSession},
	{"version", "", "print belay's version", cmdVersion},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookup: os.LookupEnv})
	stop()
	os.Exit(code)
}

// run runs the subcommand named by args[0] and returns the exit status: 0,
// 1 for an error, 2 for a usage error.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return exitStatus(e.stderr, c.run(ctx, e, args[1:]))
		}
	}
	fmt.Fprintf(e.stderr, "belay: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "belay %s: run an AI coding agent in a hardened sandbox\n\nUsage:\n", version)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n      %s\n", strings.TrimSpace("belay "+c.name+" "+c.args), c.summary)
	}
	fmt.Fprintf(w, "\nThe client commands call BELAY_ENDPOINT (default %s) with the token in BELAY_TOKEN,\n"+
		"or in <data dir>/control-token, which `belay serve` writes on first start.\n"+
		"With BELAY_AUTH=sigv4 they sign with your AWS credentials instead (a stack deployed with -c auth=sigv4).\n"+
		"Run `belay COMMAND -h` for a command's flags.\n", defaultEndpoint)
}

// usageError is a mistake in the command line; it exits 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// exitStatus prints err as "belay: <message>" and maps it to the exit
// status. An API error's message already ends in "(code, request id ...)".
func exitStatus(stderr io.Writer, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(flagError)):
		return 2 // the flag package has printed the problem and the usage
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "belay: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "belay: %v\n", err)
	return 1
}
