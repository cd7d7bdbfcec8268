package main

import (
	"context"
	"fmt"
	"text/tabwriter"
)

// cmdArtifacts runs `belay artifacts ID [NAME]`.
func cmdArtifacts(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "artifacts", "ID [NAME]",
		"Without NAME, lists a run's artifacts and their sizes. With NAME (result.json,\n"+
			"patch.diff or transcript.jsonl), writes that artifact to standard output as is.")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 2 {
		c, err := e.client()
		if err != nil {
			return err
		}
		content, err := c.GetArtifact(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(content)
		return err
	}
	if err := wantArgs(fs, pos, "ID"); err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	list, err := c.ListArtifacts(ctx, pos[0])
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintln(e.stdout, "no artifacts")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tBYTES")
	for _, a := range list {
		fmt.Fprintf(tw, "%s\t%d\n", a.Name, a.Size)
	}
	return tw.Flush()
}
