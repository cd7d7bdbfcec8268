package main

import (
	"context"
	"fmt"
	"strings"
)

const configDoc = `Prints what the server accepts in a run (GET /v1/config): the model runs
use, the file extensions and extensionless names that may be uploaded, the
allowlisted checks, and the limits. belay run chooses the files it uploads
by the same answer.`

// cmdConfig runs `belay config [--json]`.
func cmdConfig(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "config", "[--json]", configDoc)
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	if _, err := parseExact(fs, args); err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	cfg, err := c.Config(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSONLine(e.stdout, cfg)
	}
	w := e.stdout
	l := cfg.Limits
	fmt.Fprintf(w, "model:               %s\n", printableLine(cfg.Model))
	fmt.Fprintf(w, "extensions:          %s\n", printableLine(strings.Join(cfg.Extensions, " ")))
	fmt.Fprintf(w, "extensionless names: %s\n", printableLine(strings.Join(cfg.ExtensionlessNames, " ")))
	fmt.Fprintln(w, "checks:")
	for _, argv := range cfg.AllowedChecks {
		fmt.Fprintf(w, "  %s\n", printableLine(strings.Join(argv, " ")))
	}
	fmt.Fprintln(w, "limits:")
	fmt.Fprintf(w, "  files:             at most %d, %d KiB each, %d KiB in all\n", l.MaxFiles, l.MaxFileBytes/1024, l.MaxTreeBytes/1024)
	fmt.Fprintf(w, "  instruction:       at most %d characters\n", l.MaxInstructionChars)
	fmt.Fprintf(w, "  checks:            at most %d a run\n", l.MaxChecks)
	fmt.Fprintf(w, "  steps:             %d by default, at most %d\n", l.DefaultMaxSteps, l.MaxSteps)
	fmt.Fprintf(w, "  wall time:         %d s by default, at most %d s\n", l.DefaultWallTimeSeconds, l.MaxWallTimeSeconds)
	fmt.Fprintf(w, "  approval timeout:  %d s by default, at most %d s\n", l.DefaultApprovalTimeoutSeconds, l.MaxApprovalTimeoutSeconds)
	if cfg.GitSources {
		fmt.Fprintf(w, "  git sources:       fetched by the server (belay run --repo); at most %d files, %d MiB\n", l.RepoMaxFiles, l.RepoMaxBytes>>20)
	} else {
		fmt.Fprintf(w, "  git sources:       not taken by this server\n")
	}
	return nil
}
