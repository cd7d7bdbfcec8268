package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
)

const runDoc = `Uploads the text files under DIR and asks belay to run the agent on them:
the agent follows the instruction, may change only the --allow paths, and
its change is proved by the --check commands.

With --repo URL instead of DIR, the server fetches the tree from that git
repository (https; plain http only to a loopback server) at --ref (a branch,
a tag, a full ref or a full commit id; the default branch when absent), with
its own git credentials, within its repository limits (belay config shows
them); the sandbox gets the commit with its history, and the patch is
against that commit. The --allow paths must name files or folders of it.

Files: regular files with an extension the server accepts (GET /v1/config,
shown by belay config: .py, .md, .json, ... and what the operator added),
each within the server's size limit. Every file or folder left out is named
on stderr: symbolic links, files over the limit, files with another
extension or that are not UTF-8 text, and the folders never uploaded (.git
and every other folder whose name starts with a dot, __pycache__ and
node_modules).

A --check is split on spaces into an argv: no shell is involved, so quotes,
pipes, globs and variables have no special meaning. It must equal one of the
server's allowed checks, for example "python3 -m pytest -q".

It prints the run id. With --follow it then prints the run's events live and,
at the end, the outcome, the check results and the patch; it exits 0 only if
the run completed.`

// hasRepoFlag reports whether args give --repo (looked at before parsing,
// to know whether DIR is expected).
func hasRepoFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--repo" || a == "-repo" || strings.HasPrefix(a, "--repo=") || strings.HasPrefix(a, "-repo=") {
			return true
		}
	}
	return false
}

// skippedDirs are directories never uploaded: tool caches and dependencies.
var skippedDirs = map[string]bool{"__pycache__": true, "node_modules": true}

// cmdRun runs `belay run DIR ...`.
func cmdRun(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "run", "DIR|--repo URL [--ref REF] --instruction TEXT --allow PATH... --check CMD... [flags]", runDoc)
	repo := fs.String("repo", "", "git repository `URL` the server fetches the tree from, instead of DIR")
	ref := fs.String("ref", "", "with --repo: the branch, tag, full ref or commit `id` to run on (default: the default branch)")
	instruction := fs.String("instruction", "", "what the agent should do (required)")
	var allow, checks, approvalAllow stringList
	fs.Var(&allow, "allow", "a `path` the agent may change, relative to DIR; end it in /** for a subtree (repeatable)")
	fs.Var(&checks, "check", "a `command` that proves the change, split on spaces, no shell (repeatable)")
	maxSteps := fs.Int("max-steps", 0, "most agent steps (server default when 0)")
	wallTime := fs.Int("wall-time", 0, "most `seconds` the run may take (server default when 0)")
	approval := fs.String("approval", "", "approval `policy` for shell commands: deny_all (default), allow_list, allow_all or ask")
	fs.Var(&approvalAllow, "approval-allow", "a `tool` the allow_list or ask policy allows without asking (repeatable)")
	idemKey := fs.String("idempotency-key", "", "retry-safe `key`: the same key and request return the same run")
	follow := fs.Bool("follow", false, "print the events live, then the outcome and the patch")
	var pos []string
	var err error
	if hasRepoFlag(args) {
		pos, err = parseExact(fs, args)
	} else {
		pos, err = parseExact(fs, args, "DIR")
	}
	if err != nil {
		return err
	}
	if *repo == "" && *ref != "" {
		return usagef("--ref goes with --repo")
	}
	if strings.TrimSpace(*instruction) == "" {
		return usagef("--instruction is required: say what the agent should do")
	}
	if len(allow) == 0 {
		return usagef("--allow is required: name the paths the agent may change")
	}
	if len(checks) == 0 {
		return usagef(`--check is required: give a command that proves the change, for example --check "python3 -m pytest -q"`)
	}
	req := belay.RunRequest{
		Instruction:     *instruction,
		AllowedPaths:    allow,
		MaxSteps:        *maxSteps,
		WallTimeSeconds: *wallTime,
		Approval:        belay.ApprovalConfig{Policy: belay.ApprovalPolicy(*approval), Allow: approvalAllow},
	}
	for _, c := range checks {
		argv := strings.Fields(c)
		if len(argv) == 0 {
			return usagef("--check %q is empty", c)
		}
		req.Checks = append(req.Checks, argv)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	lim, err := serverLimits(ctx, c, e.stderr)
	if err != nil {
		return err
	}
	if *repo != "" {
		// The server checks these too; checked here, a typo costs no
		// request.
		if err := belay.CheckGitURL(*repo, lim.GitURLs); err != nil {
			return usagef("--repo: %s", strings.TrimPrefix(belay.ErrorMessage(err), "source.git.url: "))
		}
		if err := belay.CheckGitRef(*ref); err != nil {
			return usagef("--ref: %s", strings.TrimPrefix(belay.ErrorMessage(err), "source.git.ref: "))
		}
		req.Source = &belay.Source{Git: &belay.GitSource{URL: *repo, Ref: *ref}}
	} else if req.Files, err = readTree(pos[0], lim, e.stderr); err != nil {
		return err
	}
	created, err := c.CreateRun(ctx, req, *idemKey)
	if err != nil {
		return err
	}
	id := created.RunID
	fmt.Fprintln(e.stdout, id)
	if !*follow {
		fmt.Fprintf(e.stderr, "belay: follow it with: belay events %s --follow\n", id)
		return nil
	}
	if err := followEvents(ctx, e, c, id, 0, func(ev belay.Event) error { return printEvent(e.stdout, id, ev, false) }); err != nil {
		return err
	}
	if ctx.Err() != nil {
		// Interrupted (Ctrl-C, SIGTERM): the run goes on and has not
		// completed, so a script must not read this as success.
		return fmt.Errorf("interrupted before run %s ended", id)
	}
	return printOutcome(ctx, e.stdout, c, id)
}

// runEndedError reports a followed run that did not complete.
type runEndedError struct {
	id     string
	status belay.RunStatus
	reason string
}

func (e runEndedError) Error() string {
	if e.reason == "" {
		return fmt.Sprintf("run %s %s", e.id, e.status)
	}
	return fmt.Sprintf("run %s %s: %s", e.id, e.status, e.reason)
}

// printOutcome prints how a run ended, its checks and its patch, and
// returns a runEndedError unless it completed.
func printOutcome(ctx context.Context, w io.Writer, c *httpapi.Client, id string) error {
	run, err := c.GetRun(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	printRun(w, run)
	for _, a := range run.Artifacts {
		if a != "patch.diff" {
			continue
		}
		patch, err := c.GetArtifact(ctx, id, a)
		if err != nil {
			return err
		}
		if len(patch) == 0 {
			fmt.Fprintln(w, "patch: none (no file changed)")
			break
		}
		// Shown for a person, with control characters escaped; the
		// artifacts command gives it as is.
		fmt.Fprintf(w, "patch (belay artifacts %s patch.diff):\n%s", id, printable(string(patch)))
		if patch[len(patch)-1] != '\n' {
			fmt.Fprintln(w)
		}
	}
	if run.Status != belay.StatusCompleted {
		return runEndedError{id: id, status: run.Status, reason: run.Reason}
	}
	return nil
}

// serverLimits asks the server what it accepts (GET /v1/config). A server
// without the route (an older belay) gets the reference limits, with a note.
func serverLimits(ctx context.Context, c *httpapi.Client, warn io.Writer) (belay.Limits, error) {
	cfg, err := c.Config(ctx)
	if apiErr, ok := errors.AsType[*httpapi.APIError](err); ok && apiErr.Code == belay.CodeNotFound {
		fmt.Fprintln(warn, "belay: the server does not say what it accepts (no GET /v1/config); choosing files by the reference extensions")
		return belay.DefaultLimits(""), nil
	}
	if err != nil {
		return belay.Limits{}, err
	}
	return cfg.RunLimits(), nil
}

// maxNamedSkips bounds the files and folders readTree names one by one;
// past it, it counts them.
const maxNamedSkips = 20

// readTree reads the files to upload under dir, as POSIX paths relative to
// it, naming on warn each file or folder it leaves out.
func readTree(dir string, lim belay.Limits, warn io.Writer) ([]belay.File, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	var files []belay.File
	total, skipped := 0, 0
	skip := func(format string, args ...any) {
		skipped++
		if skipped <= maxNamedSkips {
			fmt.Fprintf(warn, "belay: skipping "+format+"\n", args...)
		}
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != dir && (strings.HasPrefix(d.Name(), ".") || skippedDirs[d.Name()]) {
				skip("%s/: hidden folders, __pycache__ and node_modules are not uploaded", printableLine(rel))
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			skip("%s: a symbolic link (only regular files are uploaded)", printableLine(rel))
			return nil
		case !d.Type().IsRegular():
			skip("%s: not a regular file", printableLine(rel))
			return nil
		}
		if err := belay.CheckPath(rel); err != nil {
			skip("%s: %v", printableLine(rel), err)
			return nil
		}
		if !lim.ExtensionAllowed(rel) {
			skip("%s: the server does not accept this extension (belay config lists those it does)", printableLine(rel))
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Size() > int64(lim.MaxFileBytes) {
			skip("%s: %d KiB is over the %d KiB a file may have", printableLine(rel), (info.Size()+1023)/1024, lim.MaxFileBytes/1024)
			return nil
		}
		content, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if len(content) > lim.MaxFileBytes {
			skip("%s: it grew over the %d KiB a file may have while being read", printableLine(rel), lim.MaxFileBytes/1024)
			return nil
		}
		if !utf8.Valid(content) || strings.IndexByte(string(content), 0) >= 0 {
			skip("%s: not UTF-8 text", printableLine(rel))
			return nil
		}
		total += len(content)
		files = append(files, belay.File{Path: rel, Content: string(content)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	if skipped > maxNamedSkips {
		fmt.Fprintf(warn, "belay: skipping %d more files and folders\n", skipped-maxNamedSkips)
	}
	switch {
	case len(files) == 0:
		return nil, errors.New("no files to upload under " + dir + ": it needs text files with an extension the server accepts (belay config lists them)")
	case len(files) > lim.MaxFiles:
		return nil, fmt.Errorf("%s has %d files to upload; a run takes at most %d: point DIR at a smaller folder", dir, len(files), lim.MaxFiles)
	case total > lim.MaxTreeBytes:
		return nil, fmt.Errorf("the files under %s total %d KiB; a run takes at most %d KiB", dir, total/1024, lim.MaxTreeBytes/1024)
	}
	fmt.Fprintf(warn, "belay: uploading %d file(s), %d bytes\n", len(files), total)
	return files, nil
}
