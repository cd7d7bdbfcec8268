package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// Caps of the tools. The model reads every result, so each is bounded; a
// write is bounded like an uploaded file.
const (
	MaxWriteBytes      = 64 << 10
	MaxReadBytes       = 64 << 10
	MaxListEntries     = 1000
	MaxSearchMatches   = 200
	MaxSearchBytes     = 64 << 10
	MaxSearchFileBytes = 1 << 20
	MaxPatternLen      = 1000
	MaxCommandLen      = 8 << 10
	maxMatchLineLen    = 300
)

// Command time limits. A check gets DefaultCheckTimeout and a shell command
// DefaultShellTimeout, each cut short by the run's wall-time deadline.
const (
	DefaultCheckTimeout = 120 * time.Second
	DefaultShellTimeout = 60 * time.Second
)

// Tool names, as the model calls them.
const (
	ToolListFiles = "list_files"
	ToolReadFile  = "read_file"
	ToolWriteFile = "write_file"
	ToolEditFile  = "edit_file"
	ToolSearch    = "search"
	ToolRunCheck  = "run_check"
	ToolShell     = "shell"
)

// EventEmitter receives the events the tools produce (check.finished). It
// has the shape of agent.EventSink, so the entry's events client serves both.
type EventEmitter interface {
	Emit(typ string, data any)
}

// Approver asks the control plane whether a tool call may run and waits for
// the decision. It returns a decided approval; a timeout comes back as a
// deny decided by "timeout", not as an error.
type Approver interface {
	Approve(ctx context.Context, tool string, args any) (belay.Approval, error)
}

// ToolsConfig configures the tools of one run.
type ToolsConfig struct {
	// RepoDir is the repository the tools work in; HomeDir is HOME for
	// the commands they run.
	RepoDir string
	HomeDir string
	// AllowedPaths are the run's allowedPaths: the only files a write may
	// touch. Checks are the run's checks: the only argv run_check runs.
	AllowedPaths []string
	Checks       [][]string
	// Deadline is the run's wall-time deadline; no command outlives it.
	// Zero means none.
	Deadline time.Time
	// CheckTimeout and ShellTimeout default to DefaultCheckTimeout and
	// DefaultShellTimeout.
	CheckTimeout time.Duration
	ShellTimeout time.Duration
	// Approvals decides shell calls. Nil denies every one.
	Approvals Approver
	// Events receives check.finished; nil drops it.
	Events EventEmitter
	// Transcript receives one JSON line per command with its longer output
	// tail (TranscriptTailBytes); nil drops it.
	Transcript io.Writer
	Now        func() time.Time
	Logger     *slog.Logger
}

// Tools are the agent's tools for one run (DESIGN.md "The agent's tools"),
// all but finish, which the agent loop handles itself (agent.FinishTool).
// They treat every argument as untrusted: a call that the sandbox does not
// allow comes back as an error result the model can read, and never as an
// approval question. Calls are serialised.
type Tools struct {
	cfg  ToolsConfig
	repo *repoFS
	root *os.Root

	mu           sync.Mutex
	shellSession bool
}

// NewTools opens the repository for the tools. Close releases it.
func NewTools(cfg ToolsConfig) (*Tools, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	if cfg.ShellTimeout <= 0 {
		cfg.ShellTimeout = DefaultShellTimeout
	}
	repo, err := openRepoFS(cfg.RepoDir)
	if err != nil {
		return nil, fmt.Errorf("new tools: %w", err)
	}
	root, err := os.OpenRoot(cfg.RepoDir)
	if err != nil {
		repo.Close()
		return nil, fmt.Errorf("new tools: %w", err)
	}
	return &Tools{cfg: cfg, repo: repo, root: root}, nil
}

// Close releases the repository.
func (t *Tools) Close() error {
	return errors.Join(t.repo.Close(), t.root.Close())
}

// toolSpec is one tool as the model sees it.
type toolSpec struct {
	name, description string
	parameters        map[string]any
}

func objectSchema(required []string, props map[string]any) map[string]any {
	return map[string]any{
		"type":                 "object",
		"properties":           props,
		"required":             required,
		"additionalProperties": false,
	}
}

func stringProp(desc string) map[string]any {
	return map[string]any{"type": "string", "description": desc}
}

func (t *Tools) specs() []toolSpec {
	checks := make([]string, len(t.cfg.Checks))
	for i, c := range t.cfg.Checks {
		b, _ := json.Marshal(c)
		checks[i] = string(b)
	}
	return []toolSpec{
		{ToolListFiles, fmt.Sprintf("List the files and directories under a directory of the repository, recursively (at most %d entries). Use \"\" or \".\" for the root.", MaxListEntries),
			objectSchema([]string{"path"}, map[string]any{"path": stringProp("Directory relative to the repository root.")})},
		{ToolReadFile, fmt.Sprintf("Read a file of the repository (at most %d bytes are returned).", MaxReadBytes),
			objectSchema([]string{"path"}, map[string]any{"path": stringProp("File path relative to the repository root.")})},
		{ToolWriteFile, fmt.Sprintf("Create or replace a file with the given content (at most %d bytes). Only these paths may be written: %s.", MaxWriteBytes, strings.Join(t.cfg.AllowedPaths, ", ")),
			objectSchema([]string{"path", "content"}, map[string]any{
				"path":    stringProp("File path relative to the repository root."),
				"content": stringProp("The complete new content of the file."),
			})},
		{ToolEditFile, "Replace one occurrence of old with new in a file. old must occur exactly once; include enough surrounding text to make it unique. Only allowed paths may be edited.",
			objectSchema([]string{"path", "old", "new"}, map[string]any{
				"path": stringProp("File path relative to the repository root."),
				"old":  stringProp("The exact text to replace; it must occur exactly once."),
				"new":  stringProp("The text to put in its place."),
			})},
		{ToolSearch, fmt.Sprintf("Search the files under a directory for lines matching a regular expression (RE2 syntax; at most %d matches).", MaxSearchMatches),
			objectSchema([]string{"pattern", "path"}, map[string]any{
				"pattern": stringProp("Regular expression, RE2 syntax."),
				"path":    stringProp("Directory or file relative to the repository root; \"\" or \".\" for all."),
			})},
		{ToolRunCheck, "Run one of the run's checks and return its exit code and the end of its output. argv must equal one of: " + strings.Join(checks, ", ") + ".",
			objectSchema([]string{"argv"}, map[string]any{
				"argv": map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "The check's argv, exactly as listed."},
			})},
		{ToolShell, fmt.Sprintf("Run a shell command in the repository (no network, no secrets, %s at most). It needs approval under the run's policy and may be denied.", t.cfg.ShellTimeout),
			objectSchema([]string{"command"}, map[string]any{"command": stringProp("The command line, run with /bin/sh -c.")})},
	}
}

// toolError is a refusal or failure the model reads.
func toolError(format string, args ...any) error { return fmt.Errorf(format, args...) }

// Call runs one tool call. It never panics: a bad name, bad arguments, a
// refusal or a failure all come back as an error result for the model.
func (t *Tools) Call(ctx context.Context, name string, args json.RawMessage) (result string, isError bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			// The name is the model's: bounded, like every model-chosen
			// string the sandbox logs.
			t.cfg.Logger.Error("tool panicked", "tool", truncate(name, 100), "panic", fmt.Sprint(r))
			result, isError = fmt.Sprintf("%s failed: internal error in the sandbox", name), true
		}
	}()
	var out string
	var err error
	switch name {
	case ToolListFiles:
		out, err = t.listFiles(args)
	case ToolReadFile:
		out, err = t.readFile(args)
	case ToolWriteFile:
		out, err = t.writeFile(args)
	case ToolEditFile:
		out, err = t.editFile(args)
	case ToolSearch:
		out, err = t.search(args)
	case ToolRunCheck:
		out, err = t.runCheck(ctx, args)
	case ToolShell:
		out, err = t.shell(ctx, args)
	default:
		names := make([]string, 0, 8)
		for _, s := range t.specs() {
			names = append(names, s.name)
		}
		return fmt.Sprintf("unknown tool %q; the tools are %s", truncate(name, 100), strings.Join(names, ", ")), true
	}
	if err != nil {
		return name + ": " + err.Error(), true
	}
	return out, false
}

// decodeArgs decodes a tool call's JSON arguments into v. Unknown fields
// are ignored: models add them, and the required ones are checked by the
// tool.
func decodeArgs(args json.RawMessage, v any) error {
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	if err := json.Unmarshal(args, v); err != nil {
		return toolError("the arguments are not a valid JSON object of the expected fields: %v", err)
	}
	return nil
}

// modelPath turns a path the model gave into a clean path relative to the
// repository root. "", "." and "./" mean the root when root is true. A
// leading "./" and a trailing "/" are forgiven; anything else that is not a
// clean relative path inside the tree (absolute, "..", ".git", NUL,
// backslash) is refused.
func modelPath(p string, root bool) (string, error) {
	q := p
	for strings.HasPrefix(q, "./") {
		q = q[2:]
	}
	if len(q) > 1 {
		q = strings.TrimSuffix(q, "/")
	}
	if q == "" || q == "." {
		if root {
			return ".", nil
		}
		return "", toolError("path is required: give a file path relative to the repository root")
	}
	if err := belay.CheckPath(q); err != nil {
		return "", toolError("refused: %v", err)
	}
	return q, nil
}

// writablePath checks a path the model wants to write: a clean relative
// path, not in .git, and inside the run's allowedPaths.
func (t *Tools) writablePath(p string) (string, error) {
	q, err := modelPath(p, false)
	if err != nil {
		return "", err
	}
	if !belay.PathAllowed(t.cfg.AllowedPaths, q) {
		return "", toolError("refused: %q is outside the paths this run may change (%s)", q, strings.Join(t.cfg.AllowedPaths, ", "))
	}
	return q, nil
}

func (t *Tools) listFiles(args json.RawMessage) (string, error) {
	var a struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	start, err := modelPath(a.Path, true)
	if err != nil {
		return "", err
	}
	if start != "." {
		mode, err := t.repo.lstat(start)
		if err != nil {
			return "", err
		}
		switch {
		case mode&fs.ModeSymlink != 0:
			return "", toolError("refused: %q is a symbolic link, and the tools never follow symbolic links", start)
		case !mode.IsDir():
			return start + "\n", nil
		}
	}
	var b strings.Builder
	n := 0
	truncated := false
	err = fs.WalkDir(t.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start {
				return err
			}
			return nil // an unreadable subdirectory is left out
		}
		if p == start {
			return nil
		}
		if strings.EqualFold(d.Name(), ".git") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if n == MaxListEntries {
			truncated = true
			return fs.SkipAll
		}
		n++
		switch {
		case d.IsDir():
			fmt.Fprintf(&b, "%s/\n", p)
		case d.Type()&fs.ModeSymlink != 0:
			fmt.Fprintf(&b, "%s (symbolic link, not followed)\n", p)
		case d.Type().IsRegular():
			size := int64(-1)
			if fi, err := d.Info(); err == nil {
				size = fi.Size()
			}
			fmt.Fprintf(&b, "%s (%d bytes)\n", p, size)
		default:
			fmt.Fprintf(&b, "%s (not a regular file)\n", p)
		}
		return nil
	})
	if err != nil {
		return "", toolError("list %q: %v", start, plainFSError(err))
	}
	if n == 0 {
		return "(empty directory)\n", nil
	}
	if truncated {
		fmt.Fprintf(&b, "[truncated: more than %d entries; list a subdirectory]\n", MaxListEntries)
	}
	return b.String(), nil
}

// plainFSError drops the absolute path an *fs.PathError carries, so a
// message names only the repository-relative path.
func plainFSError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (t *Tools) readFile(args json.RawMessage) (string, error) {
	var a struct {
		Path string `json:"path"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	p, err := modelPath(a.Path, false)
	if err != nil {
		return "", err
	}
	b, size, err := t.repo.readFile(p, MaxReadBytes)
	if err != nil {
		return "", err
	}
	s := string(b)
	if size > int64(len(b)) {
		s += fmt.Sprintf("\n[truncated: the file is %d bytes; the first %d are shown]", size, len(b))
	}
	return s, nil
}

func (t *Tools) writeFile(args json.RawMessage) (string, error) {
	var a struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	p, err := t.writablePath(a.Path)
	if err != nil {
		return "", err
	}
	if a.Content == nil {
		return "", toolError("content is required (use \"\" for an empty file)")
	}
	if len(*a.Content) > MaxWriteBytes {
		return "", toolError("refused: content is %d bytes; at most %d bytes may be written", len(*a.Content), MaxWriteBytes)
	}
	if err := t.repo.writeFile(p, []byte(*a.Content)); err != nil {
		return "", err
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(*a.Content), p), nil
}

func (t *Tools) editFile(args json.RawMessage) (string, error) {
	var a struct {
		Path string  `json:"path"`
		Old  *string `json:"old"`
		New  *string `json:"new"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	p, err := t.writablePath(a.Path)
	if err != nil {
		return "", err
	}
	switch {
	case a.Old == nil || *a.Old == "":
		return "", toolError("old is required and must not be empty: give the exact text to replace")
	case a.New == nil:
		return "", toolError("new is required (use \"\" to delete the text)")
	}
	cur, size, err := t.repo.readFile(p, MaxWriteBytes+1)
	if err != nil {
		return "", err
	}
	if size > MaxWriteBytes {
		return "", toolError("refused: %s is %d bytes; files over %d bytes cannot be edited", p, size, MaxWriteBytes)
	}
	content := string(cur)
	switch n := strings.Count(content, *a.Old); n {
	case 1:
	case 0:
		return "", toolError("old text not found in %s; read the file and copy the text exactly", p)
	default:
		return "", toolError("old text occurs %d times in %s; include more surrounding text so it occurs exactly once", n, p)
	}
	updated := strings.Replace(content, *a.Old, *a.New, 1)
	if len(updated) > MaxWriteBytes {
		return "", toolError("refused: the edited file would be %d bytes; at most %d bytes are allowed", len(updated), MaxWriteBytes)
	}
	if err := t.repo.writeFile(p, []byte(updated)); err != nil {
		return "", err
	}
	return fmt.Sprintf("edited %s: replaced %d bytes with %d bytes", p, len(*a.Old), len(*a.New)), nil
}

func (t *Tools) search(args json.RawMessage) (string, error) {
	var a struct {
		Pattern string `json:"pattern"`
		Path    string `json:"path"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	if a.Pattern == "" {
		return "", toolError("pattern is required")
	}
	if len(a.Pattern) > MaxPatternLen {
		return "", toolError("pattern is %d bytes; at most %d are allowed", len(a.Pattern), MaxPatternLen)
	}
	re, err := regexp.Compile(a.Pattern)
	if err != nil {
		return "", toolError("pattern is not a valid regular expression (RE2 syntax): %v", err)
	}
	start, err := modelPath(a.Path, true)
	if err != nil {
		return "", err
	}
	if start != "." {
		mode, err := t.repo.lstat(start)
		if err != nil {
			return "", err
		}
		if mode&fs.ModeSymlink != 0 {
			return "", toolError("refused: %q is a symbolic link, and the tools never follow symbolic links", start)
		}
	}
	var b strings.Builder
	matches, skipped := 0, 0
	full := false
	err = fs.WalkDir(t.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start {
				return err
			}
			return nil
		}
		if strings.EqualFold(d.Name(), ".git") && d.IsDir() {
			return fs.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err != nil || fi.Size() > MaxSearchFileBytes {
			skipped++
			return nil
		}
		content, _, err := t.repo.readFile(p, MaxSearchFileBytes)
		if err != nil || bytes.IndexByte(content[:min(len(content), 8<<10)], 0) >= 0 {
			return nil // unreadable, or binary
		}
		sc := bufio.NewScanner(bytes.NewReader(content))
		sc.Buffer(make([]byte, 0, 64<<10), MaxSearchFileBytes)
		for line := 1; sc.Scan(); line++ {
			if !re.Match(sc.Bytes()) {
				continue
			}
			entry := fmt.Sprintf("%s:%d: %s\n", p, line, truncate(sc.Text(), maxMatchLineLen))
			if matches == MaxSearchMatches || b.Len()+len(entry) > MaxSearchBytes {
				full = true
				return fs.SkipAll
			}
			b.WriteString(entry)
			matches++
		}
		return nil
	})
	if err != nil {
		return "", toolError("search %q: %v", start, plainFSError(err))
	}
	if matches == 0 {
		b.WriteString("no matches\n")
	}
	if full {
		fmt.Fprintf(&b, "[truncated after %d matches; narrow the pattern or the path]\n", matches)
	}
	if skipped > 0 {
		fmt.Fprintf(&b, "[%d files over %d bytes were not searched]\n", skipped, MaxSearchFileBytes)
	}
	return b.String(), nil
}

// commandTimeout returns limit, cut to the time left before the deadline.
func (t *Tools) commandTimeout(limit time.Duration) (time.Duration, error) {
	if t.cfg.Deadline.IsZero() {
		return limit, nil
	}
	left := t.cfg.Deadline.Sub(t.cfg.Now())
	if left <= 0 {
		return 0, toolError("refused: the run's wall time is used up")
	}
	return min(limit, left), nil
}

// commandRecord is the transcript line of one command the tools ran.
type commandRecord struct {
	Type        string   `json:"type"`
	Time        string   `json:"time"`
	Tool        string   `json:"tool"`
	Argv        []string `json:"argv"`
	ExitCode    int      `json:"exitCode"`
	DurationMs  int64    `json:"durationMs"`
	TimedOut    bool     `json:"timedOut,omitempty"`
	Interrupted bool     `json:"interrupted,omitempty"`
	OutputBytes int64    `json:"outputBytes"`
	Output      string   `json:"output"`
}

func (t *Tools) record(tool string, argv []string, res CommandResult) {
	if t.cfg.Transcript == nil {
		return
	}
	line, err := json.Marshal(commandRecord{
		Type: "command", Time: t.cfg.Now().UTC().Format(time.RFC3339Nano), Tool: tool, Argv: argv,
		ExitCode: res.ExitCode, DurationMs: res.Duration.Milliseconds(), TimedOut: res.TimedOut,
		Interrupted: res.Interrupted, OutputBytes: res.OutputBytes, Output: res.Tail(TranscriptTailBytes),
	})
	if err == nil {
		_, _ = t.cfg.Transcript.Write(append(line, '\n'))
	}
}

// CheckFinished is the data of a check.finished event the sandbox sends
// for a run_check call of the agent. It never says "final": the final
// checks are the control plane's to report, from the bundle it validates,
// and its events route refuses a sandbox's claim to one.
type CheckFinished struct {
	Argv       []string `json:"argv"`
	ExitCode   int      `json:"exitCode"`
	DurationMs int64    `json:"durationMs"`
	TimedOut   bool     `json:"timedOut,omitempty"`
}

func (t *Tools) emit(typ string, data any) {
	if t.cfg.Events != nil {
		t.cfg.Events.Emit(typ, data)
	}
}

func (t *Tools) runCheck(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		Argv []string `json:"argv"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	if !slices.ContainsFunc(t.cfg.Checks, func(c []string) bool { return slices.Equal(c, a.Argv) }) {
		b, _ := json.Marshal(t.cfg.Checks)
		return "", toolError("refused: argv %s is not one of the run's checks %s; run_check runs only those, exactly", truncate(fmt.Sprintf("%q", a.Argv), 300), b)
	}
	timeout, err := t.commandTimeout(t.cfg.CheckTimeout)
	if err != nil {
		return "", err
	}
	res, err := RunCommand(ctx, Command{Argv: a.Argv, Dir: t.cfg.RepoDir, Env: CleanEnv(t.cfg.HomeDir), Timeout: timeout})
	if err != nil {
		return "", err
	}
	t.record(ToolRunCheck, a.Argv, res)
	t.emit(belay.EventCheckFinished, CheckFinished{Argv: a.Argv, ExitCode: res.ExitCode, DurationMs: res.Duration.Milliseconds(), TimedOut: res.TimedOut})
	return commandResultText(res), nil
}

func commandResultText(res CommandResult) string {
	return fmt.Sprintf("exit code %d after %.1fs\n%s", res.ExitCode, res.Duration.Seconds(), res.Tail(ResultTailBytes))
}

func (t *Tools) shell(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		Command string `json:"command"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	switch {
	case strings.TrimSpace(a.Command) == "":
		return "", toolError("command is required")
	case len(a.Command) > MaxCommandLen:
		return "", toolError("refused: command is %d bytes; at most %d are allowed", len(a.Command), MaxCommandLen)
	case strings.IndexByte(a.Command, 0) >= 0:
		return "", toolError("refused: command contains a NUL byte")
	}
	if !t.shellSession {
		if t.cfg.Approvals == nil {
			return "", toolError("denied: this sandbox has no approval channel, so shell commands cannot run")
		}
		ap, err := t.cfg.Approvals.Approve(ctx, ToolShell, map[string]string{"command": a.Command})
		if err != nil {
			t.cfg.Logger.Warn("approval request failed", "tool", ToolShell, "err", err)
			return "", toolError("denied: the approval could not be obtained (%s)", belay.ErrorMessage(err))
		}
		if !ap.Decision.Allows() {
			msg := fmt.Sprintf("denied: the command was not approved (decision %s", ap.Decision)
			if ap.DecidedBy != "" {
				msg += " by " + ap.DecidedBy
			}
			msg += ")"
			if ap.Reason != "" {
				msg += ": " + truncate(ap.Reason, 500)
			}
			return "", errors.New(msg)
		}
		if ap.Decision == belay.DecisionAllowSession {
			t.shellSession = true
		}
	}
	timeout, err := t.commandTimeout(t.cfg.ShellTimeout)
	if err != nil {
		return "", err
	}
	argv := []string{"/bin/sh", "-c", a.Command}
	res, err := RunCommand(ctx, Command{Argv: argv, Dir: t.cfg.RepoDir, Env: CleanEnv(t.cfg.HomeDir), Timeout: timeout})
	if err != nil {
		return "", err
	}
	t.record(ToolShell, argv, res)
	return commandResultText(res), nil
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return truncateBytes(s, n) + "…"
}
