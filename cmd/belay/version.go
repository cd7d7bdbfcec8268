package main

import (
	"context"
	"fmt"
	"runtime"
)

// cmdVersion prints the version set at build time, and the Go toolchain and
// platform, which matter when reporting a problem.
func cmdVersion(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "version", "", "Prints belay's version.")
	if _, err := parseExact(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "belay %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
