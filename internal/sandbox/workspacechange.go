package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// Bounds of a workspace change, which a checkpoint carries whole: the
// content it may hold (a checkpoint must fit belay.MaxCheckpointBytes with
// its conversation) and the entries a walk looks at before it gives up.
const (
	maxChangeBytes   = belay.MaxCheckpointBytes
	maxChangeEntries = 20000
	maxChangePathLen = 4096
)

// errChangeTooLarge is a workspace change over its bounds: the checkpoint
// that would carry it is saved as unresumable instead.
var errChangeTooLarge = errors.New("the workspace change is too large for a checkpoint")

// changeSkipDir reports whether a walk of the repository passes over the
// folder name: .git at any depth (a nested repository is never part of a
// patch), and what checks leave behind (excludePatterns).
func changeSkipDir(name string) bool {
	return strings.EqualFold(name, ".git") || name == "__pycache__" || name == ".pytest_cache"
}

// changeSkipFile reports whether the walk passes over the file name: the
// bytecode excludePatterns leave out of every commit.
func changeSkipFile(name string) bool {
	return strings.HasSuffix(name, ".pyc") || strings.HasSuffix(name, ".pyo") || strings.HasSuffix(name, ".pyd")
}

// WorkspaceChange walks the repository at dir and returns its change since
// the base, whose files are base (path → content, all 0644): every regular
// file whose content differs or that is executable, every new one, and
// every base file that is no longer a regular file there. Files are read
// without following a symbolic link (repoFS); symbolic links and other
// files that are not regular are named in Omitted. It fails with
// errChangeTooLarge past maxChangeBytes of content or maxChangeEntries
// entries. It may run while a command changes the tree: what it reads of a
// file being written is whatever the file held then.
func WorkspaceChange(dir string, base map[string]string) (wire.WorkspaceChange, error) {
	fsys, err := openRepoFS(dir)
	if err != nil {
		return wire.WorkspaceChange{}, err
	}
	defer fsys.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return wire.WorkspaceChange{}, err
	}
	defer root.Close()

	change := wire.WorkspaceChange{Files: []wire.FileChange{}}
	seen := make(map[string]bool, len(base))
	size, entries := 0, 0
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			return nil // gone meanwhile, or unreadable: as if absent
		}
		if p == "." {
			return nil
		}
		if entries++; entries > maxChangeEntries {
			return fmt.Errorf("%w: more than %d files and folders", errChangeTooLarge, maxChangeEntries)
		}
		switch {
		case d.IsDir():
			if changeSkipDir(d.Name()) {
				return fs.SkipDir
			}
			return nil
		case changeSkipFile(d.Name()):
			return nil
		case !d.Type().IsRegular():
			change.Omitted = append(change.Omitted, p)
			return nil
		}
		content, n, err := fsys.readFile(p, maxChangeBytes+1)
		if err != nil {
			return nil // replaced by something else meanwhile
		}
		if n > maxChangeBytes {
			return fmt.Errorf("%w: %s is %d bytes", errChangeTooLarge, truncate(p, 200), n)
		}
		executable := false
		if fi, err := d.Info(); err == nil {
			executable = fi.Mode().Perm()&0o111 != 0
		}
		old, inBase := base[p]
		seen[p] = inBase
		if inBase && !executable && old == string(content) {
			return nil
		}
		if size += len(content); size > maxChangeBytes {
			return fmt.Errorf("%w: more than %d bytes of changed files", errChangeTooLarge, maxChangeBytes)
		}
		fc := wire.FileChange{Path: p, Executable: executable}
		if utf8.Valid(content) {
			text := string(content)
			fc.Text = &text
		} else {
			fc.Binary = content
		}
		change.Files = append(change.Files, fc)
		return nil
	})
	if err != nil {
		return wire.WorkspaceChange{}, err
	}
	for p := range base {
		if !seen[p] {
			change.Files = append(change.Files, wire.FileChange{Path: p, Deleted: true})
		}
	}
	slices.SortFunc(change.Files, func(a, b wire.FileChange) int { return strings.Compare(a.Path, b.Path) })
	return change, nil
}

// checkChangePath returns an error for a path a workspace change may not
// name: empty, too long, absolute, not clean, with a ".." or ".git"
// segment, or a NUL byte.
func checkChangePath(p string) error {
	switch {
	case p == "" || len(p) > maxChangePathLen:
		return fmt.Errorf("path of %d bytes", len(p))
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("a path holds a NUL byte")
	case strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".":
		return fmt.Errorf("path %q is not clean and relative", truncate(p, 200))
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." || strings.EqualFold(seg, ".git") {
			return fmt.Errorf("path %q has a %q segment", truncate(p, 200), seg)
		}
	}
	return nil
}

// ApplyWorkspaceChange makes the repository at dir, freshly built on the
// base, hold change: every path is checked first (nothing is written when
// one is refused), then deleted files are removed and the others written
// through the tools' no-symlink opens, executable where they were.
func ApplyWorkspaceChange(dir string, change wire.WorkspaceChange) error {
	seen := make(map[string]bool, len(change.Files))
	for i, f := range change.Files {
		if err := checkChangePath(f.Path); err != nil {
			return fmt.Errorf("workspace change: files[%d]: %w", i, err)
		}
		if seen[f.Path] {
			return fmt.Errorf("workspace change: files[%d]: %q appears twice", i, truncate(f.Path, 200))
		}
		seen[f.Path] = true
		if f.Text != nil && f.Binary != nil {
			return fmt.Errorf("workspace change: files[%d]: both text and binary content", i)
		}
	}
	fsys, err := openRepoFS(dir)
	if err != nil {
		return err
	}
	defer fsys.Close()
	// Deletions first: a deleted file may be where a new folder goes.
	for _, f := range change.Files {
		if f.Deleted {
			if err := fsys.remove(f.Path); err != nil {
				return fmt.Errorf("workspace change: remove %q: %w", truncate(f.Path, 200), err)
			}
		}
	}
	for _, f := range change.Files {
		if f.Deleted {
			continue
		}
		perm := os.FileMode(0o644)
		if f.Executable {
			perm = 0o755
		}
		if err := fsys.writeFileMode(f.Path, bytes.Clone(f.Content()), perm); err != nil {
			return fmt.Errorf("workspace change: write %q: %w", truncate(f.Path, 200), err)
		}
	}
	return nil
}

// baseContents is the base as WorkspaceChange compares with it.
func baseContents(files []belay.File) map[string]string {
	m := make(map[string]string, len(files))
	for _, f := range files {
		m[f.Path] = f.Content
	}
	return m
}

// TreeFiles reads the regular files of the repository at dir as a
// workspace change's walk sees them (no .git, no bytecode, no symbolic
// link followed): the base of a run whose tree was fetched from git, read
// right after the repository was built, so its checkpoints carry only what
// the agent changed. The fetch bounded the tree (the repository limits).
func TreeFiles(dir string) ([]belay.File, error) {
	fsys, err := openRepoFS(dir)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var files []belay.File
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p == ".":
			return nil
		case d.IsDir():
			if changeSkipDir(d.Name()) {
				return fs.SkipDir
			}
			return nil
		case changeSkipFile(d.Name()) || !d.Type().IsRegular():
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		content, _, err := fsys.readFile(p, int(fi.Size()))
		if err != nil {
			return err
		}
		files = append(files, belay.File{Path: p, Content: string(content)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the base tree: %w", err)
	}
	return files, nil
}
