package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/gitsource/gittest"
	"github.com/belay-dev/belay/internal/sandbox"
)

// TestBuildRepoFromBundle: a repository made by git with history becomes
// the sandbox's repository with the named commit as its base and its
// history kept; the agent's change then gives the same patch git gives.
func TestBuildRepoFromBundle(t *testing.T) {
	gittest.NeedGit(t)
	src := t.TempDir()
	gittest.Git(t, "", "init", "-q", "-b", "main", src)
	write := func(p, content string) {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("calc.py", "def add(a, b):\n    return a - b\n")
	write("tests/test_calc.py", "from calc import add\n")
	gittest.Git(t, src, "add", "-A")
	gittest.Git(t, src, "commit", "-q", "-m", "first")
	first := strings.TrimSpace(gittest.Git(t, src, "rev-parse", "HEAD"))
	write(".gitattributes", "*.py filter=evil\n")
	write("README.md", "# calc\n")
	gittest.Git(t, src, "add", "-A")
	gittest.Git(t, src, "commit", "-q", "-m", "second")
	second := strings.TrimSpace(gittest.Git(t, src, "rev-parse", "HEAD"))
	gittest.Git(t, src, "update-ref", "refs/belay/base", second)
	bundle := filepath.Join(t.TempDir(), "source.bundle")
	gittest.Git(t, src, "bundle", "create", "-q", bundle, "refs/belay/base")

	ws := t.TempDir()
	g := sandbox.Git{Dir: filepath.Join(ws, "repo"), Home: filepath.Join(ws, "home")}
	if err := os.MkdirAll(g.Home, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base, err := sandbox.BuildRepoFromBundle(ctx, g, bundle, second)
	if err != nil {
		t.Fatalf("BuildRepoFromBundle: %v", err)
	}
	if base.Commit != second {
		t.Errorf("base %s, want the source commit %s", base.Commit, second)
	}
	log, err := g.Run(ctx, "log", "--format=%H")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(log)); !slices.Equal(got, []string{second, first}) {
		t.Errorf("history %v, want [%s %s]", got, second, first)
	}
	if b, err := os.ReadFile(filepath.Join(g.Dir, "README.md")); err != nil || string(b) != "# calc\n" {
		t.Errorf("README.md = %q, %v", b, err)
	}

	// The agent's change, then the patch.
	if err := os.WriteFile(filepath.Join(g.Dir, "calc.py"), []byte("def add(a, b):\n    return a + b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fin, err := base.Finalize(ctx, []string{"calc.py"}, "belay: agent changes")
	if err != nil {
		t.Fatalf("Finalize: %v", err)
	}
	if !slices.Equal(fin.Changed, []string{"calc.py"}) || !strings.Contains(string(fin.Patch), "+    return a + b") {
		t.Errorf("changed %v, patch %q", fin.Changed, fin.Patch)
	}
	// The same edit made by git itself gives the same patch.
	write("calc.py", "def add(a, b):\n    return a + b\n")
	want := gittest.Git(t, src, "diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", second, "--")
	if string(fin.Patch) != want {
		t.Errorf("patch differs from git's:\n got %q\nwant %q", fin.Patch, want)
	}

	// A bundle that names another commit is refused.
	ws2 := t.TempDir()
	g2 := sandbox.Git{Dir: filepath.Join(ws2, "repo"), Home: filepath.Join(ws2, "home")}
	os.MkdirAll(g2.Home, 0o700)
	if _, err := sandbox.BuildRepoFromBundle(ctx, g2, bundle, first); err == nil {
		t.Errorf("a bundle at %s was taken for commit %s", second, first)
	}
}
