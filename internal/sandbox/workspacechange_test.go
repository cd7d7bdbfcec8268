package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/wire"
)

// buildRepo builds a repository of files in a fresh folder, as the entry
// does, and returns its path.
func buildRepo(tb testing.TB, files []belay.File) string {
	tb.Helper()
	dir := tb.TempDir()
	g := sandbox.Git{Dir: filepath.Join(dir, "repo"), Home: filepath.Join(dir, "home")}
	mustDo(tb, os.Mkdir(g.Home, 0o700))
	if _, err := sandbox.BuildRepo(context.Background(), g, files); err != nil {
		tb.Fatal(err)
	}
	return g.Dir
}

func changedPaths(c wire.WorkspaceChange) []string {
	var out []string
	for _, f := range c.Files {
		p := f.Path
		if f.Deleted {
			p = "-" + p
		}
		out = append(out, p)
	}
	return out
}

// TestWorkspaceChangeRoundTrip changes a built repository in every way a
// command can (edit, add text and binary files, delete, make executable,
// nest a repository, leave bytecode, plant a symbolic link) and rebuilds
// another from its base plus the change: the two trees hold the same
// files, byte for byte and mode for mode, but for what a checkpoint leaves
// out.
func TestWorkspaceChangeRoundTrip(t *testing.T) {
	repo := buildRepo(t, testFiles)
	binary := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0}
	write := func(p string, b []byte, mode os.FileMode) {
		t.Helper()
		mustDo(t, os.MkdirAll(filepath.Dir(filepath.Join(repo, p)), 0o755))
		mustDo(t, os.WriteFile(filepath.Join(repo, p), b, mode))
		mustDo(t, os.Chmod(filepath.Join(repo, p), mode))
	}
	write("calc.py", []byte("def add(a, b):\n    return a + b\n"), 0o644)
	write("tests/data/blob.bin", binary, 0o644)
	write("tools/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755)
	write("tests/nested/.git/config", []byte("[core]\n"), 0o644)
	write("__pycache__/calc.cpython-311.pyc", []byte("bytecode"), 0o644)
	write("tests/x.pyc", []byte("bytecode"), 0o644)
	mustDo(t, os.Chmod(filepath.Join(repo, "README.md"), 0o755)) // same content, now executable
	mustDo(t, os.Remove(filepath.Join(repo, "docs/guide.md")))
	mustDo(t, os.Symlink("/etc/passwd", filepath.Join(repo, "link")))

	base := map[string]string{}
	for _, f := range testFiles {
		base[f.Path] = f.Content
	}
	change, err := sandbox.WorkspaceChange(repo, base)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"README.md", "calc.py", "-docs/guide.md", "tests/data/blob.bin", "tools/run.sh"}
	if got := changedPaths(change); !slices.Equal(got, want) {
		t.Fatalf("change = %v, want %v", got, want)
	}
	if !slices.Equal(change.Omitted, []string{"link"}) {
		t.Errorf("omitted = %v, want the symbolic link", change.Omitted)
	}
	for _, f := range change.Files {
		switch f.Path {
		case "tests/data/blob.bin":
			if f.Text != nil || !bytes.Equal(f.Binary, binary) {
				t.Errorf("the binary file travels as %+v", f)
			}
		case "tools/run.sh", "README.md":
			if !f.Executable {
				t.Errorf("%s is not marked executable", f.Path)
			}
		}
	}

	other := buildRepo(t, testFiles)
	if err := sandbox.ApplyWorkspaceChange(other, change); err != nil {
		t.Fatal(err)
	}
	again, err := sandbox.WorkspaceChange(other, base)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(again.Files, change.Files, func(a, b wire.FileChange) bool {
		return a.Path == b.Path && a.Deleted == b.Deleted && a.Executable == b.Executable && bytes.Equal(a.Content(), b.Content())
	}) {
		t.Fatalf("rebuilt tree's change %v differs from %v", changedPaths(again), changedPaths(change))
	}
	if fi, err := os.Stat(filepath.Join(other, "tools/run.sh")); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("tools/run.sh rebuilt as %v, %v; want executable", fi, err)
	}
	for _, p := range []string{"link", "tests/nested/.git", "__pycache__", "docs/guide.md"} {
		if _, err := os.Lstat(filepath.Join(other, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is in the rebuilt tree (%v)", p, err)
		}
	}
}

// TestApplyWorkspaceChangeRefusesBadPaths: a change naming a path out of
// the repository, into .git or through a symbolic link writes nothing.
func TestApplyWorkspaceChangeRefusesBadPaths(t *testing.T) {
	text := "x"
	for _, p := range []string{"../outside.txt", "/etc/passwd", "a/../../b", ".git/config", "x/.GIT/hooks/pre-commit", "", "a//b", "./a", "nul\x00"} {
		repo := buildRepo(t, testFiles)
		change := wire.WorkspaceChange{Files: []wire.FileChange{{Path: "calc.py", Text: &text}, {Path: p, Text: &text}}}
		if err := sandbox.ApplyWorkspaceChange(repo, change); err == nil {
			t.Errorf("path %q: applied", p)
		}
		if b, _ := os.ReadFile(filepath.Join(repo, "calc.py")); string(b) == text {
			t.Errorf("path %q: calc.py was written before the refusal", p)
		}
	}
	repo := buildRepo(t, testFiles)
	outside := t.TempDir()
	mustDo(t, os.Symlink(outside, filepath.Join(repo, "escape")))
	err := sandbox.ApplyWorkspaceChange(repo, wire.WorkspaceChange{Files: []wire.FileChange{{Path: "escape/planted", Text: &text}}})
	if err == nil {
		t.Error("a write through a symbolic link was applied")
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was planted outside the repository: %v", err)
	}
}

// TestWorkspaceChangeTooLarge: a tree whose change cannot fit a checkpoint
// says so rather than giving a partial change.
func TestWorkspaceChangeTooLarge(t *testing.T) {
	repo := buildRepo(t, testFiles)
	mustDo(t, os.WriteFile(filepath.Join(repo, "big.bin"), bytes.Repeat([]byte{0}, belay.MaxCheckpointBytes+1), 0o644))
	_, err := sandbox.WorkspaceChange(repo, map[string]string{})
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("WorkspaceChange of an oversized tree = %v, want too large", err)
	}
}
