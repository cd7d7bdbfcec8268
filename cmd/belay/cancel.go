package main

import (
	"context"
	"fmt"
)

// cmdCancel runs `belay cancel ID`.
func cmdCancel(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "cancel", "ID",
		"Cancels a run: its model calls stop at once, its sandbox is stopped, and it ends\n"+
			"cancelled. Cancelling again is harmless; a run that has ended cannot be cancelled.")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	run, err := c.Cancel(ctx, pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "run %s: cancel requested (status %s)\n", run.RunID, run.Status)
	return nil
}
