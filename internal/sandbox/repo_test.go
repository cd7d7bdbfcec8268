package sandbox_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
)

func TestBaseCommitIsDeterministic(t *testing.T) {
	a := newWorkspace(t, testFiles)
	b := newWorkspace(t, testFiles)
	if a.base != b.base {
		t.Errorf("two builds of the same files gave base %s and %s", a.base, b.base)
	}
	// The hash depends only on the files, the fixed identity and date and
	// the message; it is pinned so that a change to any of them is seen.
	const want = "167a7a6547db6b3bd39e0328edc3ba2743d351fb"
	if a.base != want {
		t.Errorf("base commit %s, want %s", a.base, want)
	}
	other := slices.Clone(testFiles)
	other[0].Content += "\n"
	if c := newWorkspace(t, other); c.base == a.base {
		t.Error("different files gave the same base commit")
	}
	// The base holds exactly the uploaded files.
	out, err := a.git.Run(context.Background(), "ls-tree", "-r", "--name-only", a.base)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{"README.md", "calc.py", "docs/guide.md", "tests/test_calc.py"}) {
		t.Errorf("base tree %q", got)
	}
}

func TestBuildRepoRefusesBadPaths(t *testing.T) {
	for _, p := range []string{"../x.py", "/abs.py", ".git/config", "a//b.py", `a\b.py`} {
		t.Run(p, func(t *testing.T) {
			dir := t.TempDir()
			files := []belay.File{{Path: "ok.py", Content: "x\n"}, {Path: p, Content: "pwned\n"}}
			_, err := sandbox.BuildRepo(context.Background(), sandbox.Git{Dir: filepath.Join(dir, "repo"), Home: dir}, files)
			if err == nil || !strings.Contains(err.Error(), "files[1]") {
				t.Errorf("BuildRepo with %q: %v; want an error naming files[1]", p, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "x.py")); err == nil {
				t.Error("a file was written outside the repository")
			}
		})
	}
}

func TestPatchAppliesToTheOriginalFiles(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, nil)
	ctx := context.Background()
	for _, c := range []struct{ tool, args string }{
		{sandbox.ToolEditFile, `{"path":"calc.py","old":"a - b","new":"a + b"}`},
		{sandbox.ToolWriteFile, `{"path":"tests/test_more.py","content":"def test_more():\n    assert True\n"}`},
	} {
		if out, isErr := tools.Call(ctx, c.tool, []byte(c.args)); isErr {
			t.Fatal(out)
		}
	}
	// What checks leave behind is not part of the change.
	mustDo(t, os.MkdirAll(filepath.Join(w.repo, "__pycache__"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "__pycache__", "calc.cpython-311.pyc"), []byte{0, 1, 2}, 0o644))
	mustDo(t, os.MkdirAll(filepath.Join(w.repo, ".pytest_cache", "v"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(w.repo, ".pytest_cache", "v", "lastfailed"), []byte("{}"), 0o644))

	head, err := w.git.CommitAll(ctx, "belay: agent changes", false)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := w.git.ChangedFiles(ctx, w.base, head)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"calc.py", "tests/test_more.py"}; !slices.Equal(changed, want) {
		t.Errorf("changed files %q, want %q", changed, want)
	}
	patch, err := w.git.Diff(ctx, w.base, head)
	if err != nil {
		t.Fatal(err)
	}

	// A fresh copy of the uploaded files, not a repository: the patch
	// applies, and gives the agent's result.
	fresh := t.TempDir()
	for _, f := range testFiles {
		p := filepath.Join(fresh, filepath.FromSlash(f.Path))
		mustDo(t, os.MkdirAll(filepath.Dir(p), 0o755))
		mustDo(t, os.WriteFile(p, []byte(f.Content), 0o644))
	}
	patchFile := filepath.Join(t.TempDir(), "patch.diff")
	mustDo(t, os.WriteFile(patchFile, patch, 0o644))
	for _, args := range [][]string{{"apply", "--check", patchFile}, {"apply", patchFile}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = fresh
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + fresh, "GIT_CONFIG_NOSYSTEM=1"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s\npatch:\n%s", strings.Join(args, " "), err, out, patch)
		}
	}
	for _, p := range []string{"calc.py", "tests/test_more.py"} {
		want, _ := os.ReadFile(filepath.Join(w.repo, p))
		got, _ := os.ReadFile(filepath.Join(fresh, p))
		if string(got) != string(want) {
			t.Errorf("%s after applying the patch = %q, want %q", p, got, want)
		}
	}
}

func TestEntryGitIgnoresHooksAndConfigInTheRepository(t *testing.T) {
	// An approved shell command can write .git; the entry's own git calls
	// must not run anything it put there.
	w := newWorkspace(t, testFiles)
	marker := filepath.Join(w.dir, "hook-ran")
	hook := "#!/bin/sh\ntouch " + marker + "\n"
	mustDo(t, os.MkdirAll(filepath.Join(w.repo, ".git", "hooks"), 0o755))
	for _, h := range []string{"pre-commit", "commit-msg", "post-commit", "pre-auto-gc"} {
		mustDo(t, os.WriteFile(filepath.Join(w.repo, ".git", "hooks", h), []byte(hook), 0o755))
	}
	f, err := os.OpenFile(filepath.Join(w.repo, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
	mustDo(t, err)
	_, err = f.WriteString("[core]\n\tfsmonitor = " + filepath.Join(w.repo, ".git", "hooks", "pre-commit") + "\n")
	mustDo(t, err)
	mustDo(t, f.Close())
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "calc.py"), []byte("changed\n"), 0o644))

	head, err := w.git.CommitAll(context.Background(), "belay: agent changes", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.git.Diff(context.Background(), w.base, head); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a hook or fsmonitor command from the repository ran")
	}
}

func TestCommitAllowedKeepsOnlyAllowedRegularFiles(t *testing.T) {
	w := newWorkspace(t, testFiles)
	ctx := context.Background()
	// What an approved shell command could do besides the tools' writes.
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "calc.py"), []byte("def add(a, b):\n    return a + b\n"), 0o644))
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "tests", "test_new.py"), []byte("x = 1\n"), 0o644))
	mustDo(t, os.Chmod(filepath.Join(w.repo, "tests", "test_calc.py"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "README.md"), []byte("rewritten\n"), 0o644))
	mustDo(t, os.Remove(filepath.Join(w.repo, "docs", "guide.md")))
	mustDo(t, os.Symlink("../calc.py", filepath.Join(w.repo, "tests", "link.py")))
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "stray.txt"), []byte("stray\n"), 0o644))

	head, discarded, err := w.git.CommitAllowed(ctx, w.base, testAllowed, "belay: agent changes")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"README.md", "docs/guide.md", "stray.txt", "tests/link.py"}; !slices.Equal(discarded, want) {
		t.Errorf("discarded %q, want %q", discarded, want)
	}
	changed, err := w.git.ChangedFiles(ctx, w.base, head)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"calc.py", "tests/test_calc.py", "tests/test_new.py"}; !slices.Equal(changed, want) {
		t.Errorf("changed %q, want %q", changed, want)
	}
	patch, err := w.git.Diff(ctx, w.base, head)
	if err != nil {
		t.Fatal(err)
	}
	// The control plane's own check of a result accepts this patch.
	req := belay.RunRequest{AllowedPaths: testAllowed, Checks: [][]string{{"git", "diff", "--check"}}}
	bundle := belay.ResultBundle{
		Version: belay.ResultBundleVersion, RunID: "run_1", Status: belay.StatusCompleted,
		ChangedFiles: changed, Checks: []belay.CheckResult{{Argv: req.Checks[0]}},
		BaseCommit: w.base, HeadCommit: head,
	}
	result, err := json.Marshal(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := belay.ValidateResult("run_1", req, map[string][]byte{"result.json": result, "patch.diff": patch}); err != nil {
		t.Errorf("ValidateResult refuses the head commit's patch: %v\n%s", err, patch)
	}
}
