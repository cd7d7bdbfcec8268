package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

const runsDoc = `Lists runs, newest first, or with "show ID" prints one run in full.`

// cmdRuns runs `belay runs [--status S] [--limit N]` and `belay runs show ID`.
func cmdRuns(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "show" {
		return cmdRunsShow(ctx, e, args[1:])
	}
	fs := newFlagSet(e, "runs", "[--status S] [--limit N] [--cursor C] [--json] | belay runs show ID [--json]", runsDoc)
	status := fs.String("status", "", "only runs in this `state`: queued, running, completed, failed or cancelled")
	limit := fs.Int("limit", 0, "most runs to list (server default when 0)")
	cursor := fs.String("cursor", "", "continue a listing where the previous page ended")
	asJSON := fs.Bool("json", false, "print the page as JSON")
	if _, err := parseExact(fs, args); err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit must not be negative")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	list, err := c.ListRuns(ctx, httpapi.ListRunsOptions{Status: belay.RunStatus(*status), Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSONLine(e.stdout, list)
	}
	if len(list.Runs) == 0 {
		fmt.Fprintln(e.stdout, "no runs")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tCREATED\tMODEL CALLS\tREASON")
	for _, r := range list.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", r.RunID, statusText(r), r.CreatedAt.Local().Format(time.DateTime),
			r.Usage.ModelRequests, r.Usage.MaxRequests, clip(printableLine(r.Reason), 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.NextCursor != "" {
		fmt.Fprintf(e.stderr, "belay: more runs: belay runs --cursor %s\n", list.NextCursor)
	}
	return nil
}

func statusText(r wire.RunView) string {
	if r.CancelRequested && !r.Status.Terminal() {
		return string(r.Status) + " (cancelling)"
	}
	return string(r.Status)
}

// cmdRunsShow runs `belay runs show ID`.
func cmdRunsShow(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "runs show", "ID [--json]", "Prints one run: its state, usage, checks, changed files and artifacts.")
	asJSON := fs.Bool("json", false, "print the run as JSON")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	run, err := c.GetRun(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSONLine(e.stdout, run)
	}
	printRun(e.stdout, run)
	return nil
}

// printRun writes a run's state and outcome for a person.
func printRun(w io.Writer, r wire.RunView) {
	fmt.Fprintf(w, "run %s: %s\n", r.RunID, statusText(r))
	if r.Reason != "" {
		fmt.Fprintf(w, "  reason:        %s\n", printableLine(r.Reason))
	}
	if r.ExitCode != nil {
		fmt.Fprintf(w, "  exit code:     %d\n", *r.ExitCode)
	}
	fmt.Fprintf(w, "  model:         %s\n", r.Model)
	fmt.Fprintf(w, "  created:       %s\n", r.CreatedAt.Local().Format(time.DateTime))
	if !r.StartedAt.IsZero() {
		fmt.Fprintf(w, "  started:       %s\n", r.StartedAt.Local().Format(time.DateTime))
	}
	if !r.FinishedAt.IsZero() {
		from := r.StartedAt
		if from.IsZero() {
			from = r.CreatedAt
		}
		fmt.Fprintf(w, "  finished:      %s (took %s)\n", r.FinishedAt.Local().Format(time.DateTime),
			r.FinishedAt.Sub(from).Round(time.Second))
	}
	if len(r.Attempts) > 1 {
		fmt.Fprintf(w, "  attempts:      %d\n", len(r.Attempts))
		for _, a := range r.Attempts {
			lost := "running"
			switch {
			case a.Lost != "":
				lost = "sandbox lost: " + printableLine(a.Lost)
			case !a.EndedAt.IsZero():
				lost = "ended"
			}
			fmt.Fprintf(w, "    %d: from %s, %s\n", a.Attempt, a.StartedAt.Local().Format(time.DateTime), lost)
		}
	}
	if c := r.Checkpoint; c != nil {
		pending := ""
		if c.Pending != "" {
			pending = ", " + printableLine(c.Pending) + " pending"
		}
		fmt.Fprintf(w, "  checkpoint:    %d of attempt %d at step %d%s, %d bytes\n", c.Seq, c.Attempt, c.Step, pending, c.Size)
	}
	fmt.Fprintf(w, "  model calls:   %d of %d (tokens: %d prompt, %d completion)\n",
		r.Usage.ModelRequests, r.Usage.MaxRequests, r.Usage.PromptTokens, r.Usage.CompletionTokens)
	fmt.Fprintf(w, "  files:         %s\n", printableLine(strings.Join(r.Request.Files, ", ")))
	fmt.Fprintf(w, "  may change:    %s\n", printableLine(strings.Join(r.Request.AllowedPaths, ", ")))
	if len(r.Checks) == 0 {
		checks := make([]string, len(r.Request.Checks))
		for i, c := range r.Request.Checks {
			checks[i] = strings.Join(c, " ")
		}
		fmt.Fprintf(w, "  checks:        %s (no results)\n", printableLine(strings.Join(checks, "; ")))
	} else {
		fmt.Fprintln(w, "  checks:")
		for _, c := range r.Checks {
			verdict := "passed"
			if c.ExitCode != 0 {
				verdict = fmt.Sprintf("FAILED (exit %d)", c.ExitCode)
			}
			fmt.Fprintf(w, "    %s: %s in %s\n", printableLine(strings.Join(c.Argv, " ")), verdict, time.Duration(c.DurationMs)*time.Millisecond)
			if c.ExitCode != 0 && c.OutputTail != "" {
				for line := range strings.SplitSeq(strings.TrimRight(c.OutputTail, "\n"), "\n") {
					fmt.Fprintf(w, "      | %s\n", printableLine(line))
				}
			}
		}
	}
	if len(r.ChangedFiles) > 0 {
		fmt.Fprintf(w, "  changed files: %s\n", printableLine(strings.Join(r.ChangedFiles, ", ")))
	} else if r.Status.Terminal() {
		fmt.Fprintln(w, "  changed files: none")
	}
	if len(r.Artifacts) > 0 {
		fmt.Fprintf(w, "  artifacts:     %s (belay artifacts %s NAME)\n", strings.Join(r.Artifacts, ", "), r.RunID)
	}
}
