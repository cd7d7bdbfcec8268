package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"
)

// cmdApprovals runs `belay approvals ID`: the approval requests of a run,
// so a person can find the id to answer.
func cmdApprovals(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "approvals", "ID [--json]",
		"Lists a run's approval requests, pending and decided, oldest first. A pending request\n"+
			"past its expiry shows as denied (by timeout).")
	asJSON := fs.Bool("json", false, "print the approvals as JSON")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	list, err := c.ListApprovals(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSONLine(e.stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(e.stdout, "no approval requests")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APPROVAL\tTOOL\tSTATUS\tDECISION\tEXPIRES\tARGUMENTS")
	for _, a := range list {
		decision := string(a.Decision)
		if a.DecidedBy != "" {
			decision += " (" + a.DecidedBy + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Tool, a.Status, decision,
			a.ExpiresAt.Local().Format(time.TimeOnly), clip(printableLine(compactJSON(a.Arguments)), 80))
	}
	return tw.Flush()
}
