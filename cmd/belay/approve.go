package main

import (
	"context"
	"fmt"

	"github.com/belay-dev/belay/internal/belay"
)

// cmdApprove runs `belay approve ID APPROVAL DECISION [--reason R]`.
func cmdApprove(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "approve", "ID APPROVAL DECISION [--reason R]",
		"Answers a pending approval request of run ID. DECISION is one of:\n"+
			"  allow_once     run this tool call\n"+
			"  allow_session  run it, and every later call of the same tool in this run\n"+
			"  deny           refuse it; the agent is told and goes on\n"+
			"  cancel         refuse it and cancel the run")
	reason := fs.String("reason", "", "why, for the run's record")
	pos, err := parseExact(fs, args, "ID", "APPROVAL", "DECISION")
	if err != nil {
		return err
	}
	d := belay.Decision(pos[2])
	if !d.Valid() {
		return usagef("decision %q is not one of allow_once, allow_session, deny, cancel", pos[2])
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	a, err := c.Decide(ctx, pos[0], pos[1], d, *reason)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "approval %s (%s): %s\n", a.ID, a.Tool, a.Decision)
	if d == belay.DecisionCancel {
		fmt.Fprintf(e.stdout, "run %s is being cancelled\n", pos[0])
	}
	return nil
}
