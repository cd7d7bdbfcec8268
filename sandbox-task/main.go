// Command belay-sandbox is the sandbox entry: it runs one belay run's agent
// inside a hardened sandbox (a Fargate task, the OCI image under runc, or a
// local subprocess started by the embedded control plane) and uploads the
// result bundle through the control plane's internal API. See
// internal/sandbox.
//
// Usage:
//
//	belay-sandbox --workspace DIR   file mode: spec.json and token files in DIR
//	belay-sandbox                   claim mode: BELAY_CLAIM, BELAY_API_URL,
//	                                BELAY_API_SOCKET, BELAY_API_PEER_UID,
//	                                BELAY_WORKSPACE (see internal/sandbox/workspace)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/belay-dev/belay/internal/sandbox"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	workspace := flag.String("workspace", "", "file mode: the sandbox workspace holding spec.json and tokens/ (without it: claim mode, from BELAY_CLAIM)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("belay-sandbox", version)
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: belay-sandbox [--workspace DIR]")
		os.Exit(2)
	}
	// SIGTERM (a stopped task or a cancelled run) ends the agent loop; the
	// entry still uploads what it can before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	var code int
	if *workspace != "" {
		code = sandbox.Main(ctx, *workspace)
	} else {
		code = sandbox.MainClaim(ctx, os.Getenv, sandbox.ECSTaskARN)
	}
	stop()
	os.Exit(code)
}
