package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// The identity and date of every commit the entry makes. They are fixed so
// that the same upload always gives the same base commit, whoever runs it
// and whenever: the control plane and a person can recompute it.
const (
	GitName  = "belay sandbox"
	GitEmail = "sandbox@belay.invalid"
	GitDate  = "2000-01-01T00:00:00Z"
)

// excludePatterns keep what the checks leave behind (bytecode, pytest's
// cache) out of the head commit, so running a check never shows up as a
// change outside allowedPaths. They are .git/info/exclude.
const excludePatterns = `# Written by the belay sandbox: what checks leave behind is never part of a patch.
__pycache__/
*.py[cod]
.pytest_cache/
`

// attributePatterns are .git/info/attributes, which git reads after every
// .gitattributes file in the tree and which wins over them, attribute by
// attribute. They switch off everything that would make the bytes git
// stores differ from the bytes in the work tree (filters, end-of-line
// conversion, $Id$ expansion, re-encoding) and any diff driver, so the patch
// says exactly what the checked files hold, whatever .gitattributes the
// upload or the agent brings.
const attributePatterns = `# Written by the belay sandbox: files go in and out of git byte for byte.
* -text -crlf !eol -ident -filter !working-tree-encoding !diff
`

// gitTimeout bounds each git command the entry runs.
const gitTimeout = 60 * time.Second

// Git runs git in one repository with a hermetic configuration: the git
// directory and work tree named outright (no discovery), no system or
// global config, HOME in the workspace, no hooks, no fsmonitor, no
// attributes or excludes file from HOME, no replace objects, commit graph
// or multi-pack index, no external diff or text conversion, and the fixed
// identity and date. The model can write into the repository through an
// approved shell command, so nothing in its config may make the entry's
// own git calls run code; the entry also puts .git back as it built it
// before it reads the work tree for the last time (see Base.Finalize).
type Git struct {
	// Dir is the work tree; Home is HOME for git. The git directory is
	// Dir/.git.
	Dir  string
	Home string
}

// gitFlags come before every command's arguments. They hold whatever the
// repository's own config says, since -c wins over it.
var gitFlags = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "core.attributesFile=/dev/null",
	"-c", "core.excludesFile=/dev/null",
	"-c", "core.commitGraph=false",
	"-c", "core.multiPackIndex=false",
	"-c", "core.untrackedCache=false",
	"-c", "core.sparseCheckout=false",
	"-c", "core.splitIndex=false",
	"-c", "core.autocrlf=false",
	"-c", "core.quotePath=false",
	"-c", "commit.gpgSign=false",
	"-c", "init.defaultBranch=main",
	"-c", "gc.auto=0",
	"-c", "maintenance.auto=false",
	"-c", "user.name=" + GitName,
	"-c", "user.email=" + GitEmail,
}

// gitDir is the repository's git directory.
func (g Git) gitDir() string { return filepath.Join(g.Dir, ".git") }

func (g Git) env() []string {
	return []string{
		"PATH=" + workspace.CleanPath,
		"HOME=" + g.Home,
		"LANG=C.UTF-8",
		"GIT_DIR=" + g.gitDir(),
		"GIT_WORK_TREE=" + g.Dir,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=" + GitName,
		"GIT_AUTHOR_EMAIL=" + GitEmail,
		"GIT_AUTHOR_DATE=" + GitDate,
		"GIT_COMMITTER_NAME=" + GitName,
		"GIT_COMMITTER_EMAIL=" + GitEmail,
		"GIT_COMMITTER_DATE=" + GitDate,
	}
}

// Run runs git with args and returns its standard output. A non-zero exit
// is an error carrying the end of standard error.
func (g Git) Run(ctx context.Context, args ...string) ([]byte, error) {
	var stdout bytes.Buffer
	if err := g.run(ctx, nil, &stdout, args...); err != nil {
		return nil, err
	}
	return stdout.Bytes(), nil
}

// run runs git with args, stdin and stdout; every git command of the entry
// goes through it, so all get the same flags and environment.
func (g Git) run(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) error {
	argv := append(append([]string{"git"}, gitFlags...), args...)
	res, err := RunCommand(ctx, Command{
		Argv: argv, Dir: g.Dir, Env: g.env(), Timeout: gitTimeout,
		MaxOutput: 4 << 10, Stdout: stdout, Stdin: stdin,
	})
	if err != nil {
		return fmt.Errorf("git %s: %w", args[0], err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("git %s: exit code %d: %s", args[0], res.ExitCode, strings.TrimSpace(string(res.Output)))
	}
	return nil
}

// Init makes Dir a repository with the exclude patterns of the checks and
// the attributes that keep files byte for byte.
func (g Git) Init(ctx context.Context) error {
	if _, err := g.Run(ctx, "init", "-q"); err != nil {
		return err
	}
	info := filepath.Join(g.gitDir(), "info")
	if err := os.MkdirAll(info, 0o755); err != nil {
		return fmt.Errorf("git init: %w", err)
	}
	for name, content := range map[string]string{"exclude": excludePatterns, "attributes": attributePatterns} {
		if err := os.WriteFile(filepath.Join(info, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("git init: write info/%s: %w", name, err)
		}
	}
	return nil
}

// CommitAll stages everything in the work tree (with force, every file even
// if ignored) and commits it, even when nothing changed, returning the
// commit's hash.
func (g Git) CommitAll(ctx context.Context, message string, force bool) (string, error) {
	add := []string{"add", "-A"}
	if force {
		add = append(add, "-f")
	}
	if _, err := g.Run(ctx, add...); err != nil {
		return "", err
	}
	if _, err := g.Run(ctx, "commit", "-q", "--allow-empty", "--no-verify", "-m", message); err != nil {
		return "", err
	}
	out, err := g.Run(ctx, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// CommitAllowed commits the agent's changes as the head commit, with base
// as its only parent, keeping only what the run may change: a changed path
// outside allowedPaths, or one that is not a regular file (a symbolic link,
// a submodule), is left out of the commit and returned in discarded. Only
// an approved shell command or a check can make such a change, since the
// tools refuse them; the sandbox holds the run's limits either way, and the
// control plane checks again.
//
// The index is built afresh from base, without the file times an index
// keeps, so every file in the work tree is read and hashed again: an index
// the agent wrote could otherwise pass a changed file off as unchanged.
// HEAD does not move.
func (g Git) CommitAllowed(ctx context.Context, base string, allowedPaths []string, message string) (head string, discarded []string, err error) {
	if err := os.Remove(filepath.Join(g.gitDir(), "index")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("remove the index: %w", err)
	}
	if _, err := g.Run(ctx, "read-tree", base); err != nil {
		return "", nil, err
	}
	if _, err := g.Run(ctx, "add", "-A"); err != nil {
		return "", nil, err
	}
	raw, err := g.Run(ctx, "diff", "--cached", "--raw", "-z", "--no-renames", "--no-ext-diff", base, "--")
	if err != nil {
		return "", nil, err
	}
	fields := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	for i := 0; i+1 < len(fields); i += 2 {
		// ":oldmode newmode oldsha newsha status", then the path.
		meta, p := strings.Fields(fields[i]), fields[i+1]
		if len(meta) < 2 {
			return "", nil, fmt.Errorf("git diff --raw: unexpected entry %q", truncate(fields[i], 100))
		}
		newMode := meta[1]
		allowed := belay.CheckPath(p) == nil && belay.PathAllowed(allowedPaths, p)
		regular := newMode == "100644" || newMode == "100755" || newMode == "000000"
		if !allowed || !regular {
			discarded = append(discarded, p)
		}
	}
	for chunk := range slices.Chunk(discarded, 100) {
		if _, err := g.Run(ctx, append([]string{"reset", "-q", base, "--"}, literalPathspecs(chunk)...)...); err != nil {
			return "", nil, err
		}
	}
	tree, err := g.Run(ctx, "write-tree")
	if err != nil {
		return "", nil, err
	}
	out, err := g.Run(ctx, "commit-tree", strings.TrimSpace(string(tree)), "-p", base, "-m", message)
	if err != nil {
		return "", nil, err
	}
	return strings.TrimSpace(string(out)), discarded, nil
}

// literalPathspecs makes each path a pathspec that matches only itself.
func literalPathspecs(paths []string) []string {
	specs := make([]string, len(paths))
	for i, p := range paths {
		specs[i] = ":(literal)" + p
	}
	return specs
}

// Diff returns the binary-safe patch from base to head.
func (g Git) Diff(ctx context.Context, base, head string) ([]byte, error) {
	return g.Run(ctx, "diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", base, head, "--")
}

// ChangedFiles returns the paths that differ between base and head,
// sorted, renames listed as a deletion and an addition.
func (g Git) ChangedFiles(ctx context.Context, base, head string) ([]string, error) {
	out, err := g.Run(ctx, "diff", "--name-only", "-z", "--no-renames", base, head, "--")
	if err != nil {
		return nil, err
	}
	files := []string{}
	for p := range strings.SplitSeq(string(out), "\x00") {
		if p != "" {
			files = append(files, p)
		}
	}
	return files, nil
}

// BuildRepo creates the repository dir from the uploaded files and commits
// them as the base, returning the entry's memory of it (see Base). Every path is checked again with
// belay.CheckPath (the spec is input, even from the control plane), and the
// files are written through the same no-symlink opens as the tools' writes.
// dir must not exist or be empty.
func BuildRepo(ctx context.Context, g Git, files []belay.File) (*Base, error) {
	if len(files) == 0 {
		return nil, errors.New("build repository: the spec has no files")
	}
	if err := os.Mkdir(g.Dir, 0o755); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("build repository: %w", err)
		}
		entries, rerr := os.ReadDir(g.Dir)
		if rerr != nil || len(entries) > 0 {
			return nil, fmt.Errorf("build repository: %s exists and is not an empty directory", g.Dir)
		}
	}
	fsys, err := openRepoFS(g.Dir)
	if err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	defer fsys.Close()
	seen := make(map[string]bool, len(files))
	for i, f := range files {
		if err := belay.CheckPath(f.Path); err != nil {
			return nil, fmt.Errorf("build repository: files[%d]: %w", i, err)
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("build repository: files[%d]: path %q appears twice", i, f.Path)
		}
		seen[f.Path] = true
		if err := fsys.writeFile(f.Path, []byte(f.Content)); err != nil {
			return nil, fmt.Errorf("build repository: files[%d]: %w", i, err)
		}
	}
	if err := g.Init(ctx); err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	commit, err := g.CommitAll(ctx, "belay: base", true)
	if err != nil {
		return nil, fmt.Errorf("build repository: commit base: %w", err)
	}
	base, err := newBase(ctx, g, commit)
	if err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	return base, nil
}
