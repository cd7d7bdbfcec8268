// Command belay-sandbox is the sandbox entry: it runs one belay run's agent
// inside a hardened sandbox (a Fargate task, or a local subprocess started
// by the embedded control plane) and leaves the result bundle in the
// workspace's out/ folder. See internal/sandbox.
//
// Usage:
//
//	belay-sandbox --workspace DIR
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
	workspace := flag.String("workspace", "", "the sandbox workspace: spec.json, tokens/, repo/, out/, home/")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("belay-sandbox", version)
		return
	}
	if *workspace == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: belay-sandbox --workspace DIR")
		os.Exit(2)
	}
	// SIGTERM (a stopped task or a cancelled run) ends the agent loop; the
	// entry still writes what it can before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := sandbox.Main(ctx, *workspace)
	stop()
	os.Exit(code)
}
