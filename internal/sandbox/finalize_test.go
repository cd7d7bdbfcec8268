package sandbox_test

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
)

// The agent's changes in the finalize tests, as its tools would write them:
// a fix of calc.py marked SAFE, and a new test. An attack that works shows
// as EVIL in the patch or in the checked tree.
const (
	safeCalc = "def add(a, b):\n    return a + b  # SAFE\n"
	evilCalc = "def add(a, b):\n    return a + b  # EVIL\n"
	newTest  = "from calc import add\n\n\ndef test_new():\n    assert add(1, 1) == 2  # SAFE\n"
)

// shell runs script with /bin/sh in the repository, as an approved shell
// command would: same user, same clean environment. {home} in script is
// home, {ws} the workspace.
func shell(tb testing.TB, w workspace, script string) {
	tb.Helper()
	script = strings.NewReplacer("{home}", w.home, "{ws}", w.dir).Replace(script)
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"/bin/sh", "-ec", script}, Dir: w.repo, Env: sandbox.CleanEnv(w.home),
	})
	if err != nil || res.ExitCode != 0 {
		tb.Fatalf("shell %q: %v, exit %d: %s", script, err, res.ExitCode, res.Output)
	}
}

// agentEdits writes the agent's changes.
func agentEdits(tb testing.TB, w workspace) {
	tb.Helper()
	mustDo(tb, os.WriteFile(filepath.Join(w.repo, "calc.py"), []byte(safeCalc), 0o644))
	mustDo(tb, os.WriteFile(filepath.Join(w.repo, "tests", "test_new.py"), []byte(newTest), 0o644))
}

// treeFiles describes every entry under dir but its top-level .git: a
// regular file as its exec bit and content, anything else as its type.
func treeFiles(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == ".git":
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			files[rel] = "not a regular file: " + d.Type().String()
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = fmt.Sprintf("exec=%v %q", fi.Mode()&0o100 != 0, b)
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// patchResult applies patch to a fresh copy of the upload, as whoever
// takes the result would, and describes the tree it gives.
func patchResult(tb testing.TB, files []belay.File, patch []byte) map[string]string {
	tb.Helper()
	fresh := tb.TempDir()
	for _, f := range files {
		p := filepath.Join(fresh, filepath.FromSlash(f.Path))
		mustDo(tb, os.MkdirAll(filepath.Dir(p), 0o755))
		mustDo(tb, os.WriteFile(p, []byte(f.Content), 0o644))
	}
	if len(patch) > 0 {
		patchFile := filepath.Join(tb.TempDir(), "patch.diff")
		mustDo(tb, os.WriteFile(patchFile, patch, 0o644))
		cmd := exec.Command("git", "apply", patchFile)
		cmd.Dir = fresh
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + fresh, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git apply: %v\n%s\npatch:\n%s", err, out, patch)
		}
	}
	return treeFiles(tb, fresh)
}

// assertCheckedTreeIsThePatch fails unless the work tree (what the final
// checks run on) is exactly the upload with the patch applied.
func assertCheckedTreeIsThePatch(tb testing.TB, repo string, files []belay.File, patch []byte) {
	tb.Helper()
	got, want := treeFiles(tb, repo), patchResult(tb, files, patch)
	for p, w := range want {
		if got[p] != w {
			tb.Errorf("work tree %s = %s; the patch gives %s", p, got[p], w)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			tb.Errorf("work tree has %s (%s), which the patch does not give", p, g)
		}
	}
}

func TestFinalizeUndoesWhatAShellDidToGit(t *testing.T) {
	// Each attack is what an approved shell command could do to .git, to
	// home or to the tree, before the agent's SAFE edits. A filter or
	// command that runs touches the marker; one that changes content
	// turns SAFE into EVIL.
	filterX := `[filter "x"]` + "\n\tclean = \"touch {ws}/marker; sed s/SAFE/EVIL/\"\n\tsmudge = \"touch {ws}/marker; sed s/SAFE/EVIL/\"\n"
	tests := []struct {
		name   string
		attack string
		// extra are files the attack adds inside allowedPaths, so in the
		// patch, besides the agent's two.
		extra []string
	}{
		{"filter in config and info/attributes",
			`printf '` + filterX + `' >> .git/config && echo 'calc.py filter=x' > .git/info/attributes`, nil},
		{"filter through include.path",
			`printf '` + filterX + `' > {home}/evil.cfg && printf '[include]\n\tpath = {home}/evil.cfg\n' >> .git/config && echo '* filter=x' > .git/info/attributes`, nil},
		{"core.attributesFile",
			`printf '` + filterX + `[core]\n\tattributesFile = {home}/attrs\n' >> .git/config && echo 'calc.py filter=x' > {home}/attrs`, nil},
		{"attributes and config in home",
			`mkdir -p {home}/.config/git && printf '` + filterX + `' > {home}/.config/git/config && cp {home}/.config/git/config {home}/.gitconfig && echo 'calc.py filter=x' > {home}/.config/git/attributes`, nil},
		{".gitattributes in the tree, inside and outside allowedPaths",
			`printf '` + filterX + `' >> .git/config && echo '*.py filter=x' > tests/.gitattributes && echo 'calc.py filter=x' > .gitattributes`, []string{"tests/.gitattributes"}},
		{"ident and crlf from a .gitattributes in allowedPaths",
			`echo '* ident eol=crlf working-tree-encoding=UTF-16' > tests/.gitattributes && printf 'ID = "$Id$"\n' > tests/test_id.py`, []string{"tests/.gitattributes", "tests/test_id.py"}},
		{"fsmonitor",
			`printf '#!/bin/sh\ntouch {ws}/marker\n' > {home}/fsm && chmod +x {home}/fsm && printf '[core]\n\tfsmonitor = {home}/fsm\n' >> .git/config`, nil},
		{"hooks and hooksPath",
			`mkdir -p {home}/hooks && for h in pre-commit post-commit post-checkout post-index-change reference-transaction; do printf '#!/bin/sh\ntouch {ws}/marker\n' > .git/hooks/$h; chmod +x .git/hooks/$h; cp .git/hooks/$h {home}/hooks/; done && printf '[core]\n\thooksPath = {home}/hooks\n' >> .git/config`, nil},
		{"commondir to a git directory with a filter",
			`cp -r .git {ws}/evilgit && printf '` + filterX + `' >> {ws}/evilgit/config && echo '* filter=x' > {ws}/evilgit/info/attributes && echo {ws}/evilgit > .git/commondir`, nil},
		{"core.worktree elsewhere",
			`mkdir -p {ws}/elsewhere && printf '` + strings.ReplaceAll(evilCalc, "\n", `\n`) + `' > {ws}/elsewhere/calc.py && printf '[core]\n\tworktree = {ws}/elsewhere\n' >> .git/config`, nil},
		{"sparse checkout leaving calc.py out",
			`printf '[core]\n\tsparseCheckout = true\n' >> .git/config && echo '/tests/' > .git/info/sparse-checkout`, nil},
		{"info/exclude hiding the new test",
			`echo 'tests/test_new.py' >> .git/info/exclude`, nil},
		{"excludes in home and core.excludesFile",
			`mkdir -p {home}/.config/git && echo 'test_new.py' > {home}/.config/git/ignore && echo 'test_new.py' > {home}/ign && printf '[core]\n\texcludesFile = {home}/ign\n' >> .git/config`, nil},
		{"a replace ref for the base",
			`printf '` + strings.ReplaceAll(evilCalc, "\n", `\n`) + `' > calc.py && git add calc.py && c=$(git -c user.name=x -c user.email=x@x commit-tree $(git write-tree) -p HEAD -m evil) && git replace HEAD $c && git reset -q && git checkout -q -- calc.py`, nil},
		{"EVIL staged in the index",
			`printf '` + strings.ReplaceAll(evilCalc, "\n", `\n`) + `' > calc.py && git add -A`, nil},
		{"HEAD and branch moved, packed refs",
			`printf '` + strings.ReplaceAll(evilCalc, "\n", `\n`) + `' > calc.py && git add -A && git -c user.name=x -c user.email=x@x commit -qm evil && git pack-refs --all && git checkout -q -b other`, nil},
		{"nested repository, symbolic link and FIFO left behind",
			`mkdir -p tests/sub && git init -q tests/sub && echo x > tests/sub/x.py && ln -s ../calc.py tests/link.py && mkfifo tests/fifo.py && mkdir -p __pycache__ && echo junk > __pycache__/calc.cpython-311.pyc && echo 'cheat' > conftest.py`, []string{"tests/sub/x.py"}},
		{"permissions taken away",
			`mkdir -p junk/deep && echo x > junk/deep/f && chmod 000 junk/deep junk .git/info && chmod 000 README.md`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorkspace(t, testFiles)
			shell(t, w, tt.attack)
			agentEdits(t, w)
			// Whatever the attack did in the last step, its own effects on the
			// marker do not count: only the entry's git calls matter.
			_ = os.Remove(filepath.Join(w.dir, "marker"))

			fin, err := w.built.Finalize(context.Background(), testAllowed, "belay: agent changes")
			if err != nil {
				t.Fatalf("Finalize: %v", err)
			}
			if _, err := os.Stat(filepath.Join(w.dir, "marker")); err == nil {
				t.Error("a filter, hook or fsmonitor from the shell ran in the entry's git")
			}
			if bytes.Contains(fin.Patch, []byte("EVIL")) || !bytes.Contains(fin.Patch, []byte("+    return a + b  # SAFE\n")) {
				t.Errorf("the patch does not say what the agent wrote:\n%s", fin.Patch)
			}
			want := append([]string{"calc.py", "tests/test_new.py"}, tt.extra...)
			slices.Sort(want)
			if !slices.Equal(fin.Changed, want) {
				t.Errorf("changed %q, want %q", fin.Changed, want)
			}
			assertCheckedTreeIsThePatch(t, w.repo, testFiles, fin.Patch)

			// A check that asks git what changed, as `git diff --check`
			// does, sees exactly the patch: the index is the base, the new
			// files intent-to-add.
			res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
				Argv: []string{"git", "diff", "--name-only"}, Dir: w.repo, Env: sandbox.CleanEnv(w.home),
			})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("git diff: %v %s", err, res.Output)
			}
			if got := strings.Fields(string(res.Output)); !slices.Equal(got, want) {
				t.Errorf("git diff in the checked tree lists %q, want %q", got, want)
			}
			if _, err := os.Stat(filepath.Join(w.dir, "marker")); err == nil {
				t.Error("the checks' git runs a filter, hook or fsmonitor from the shell")
			}
		})
	}
}

// writeLooseObject writes an object of type typ with content into the
// store under name id, whatever its real hash, as a shell could.
func writeLooseObject(tb testing.TB, repo, id, typ string, content []byte) {
	tb.Helper()
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	fmt.Fprintf(zw, "%s %d\x00", typ, len(content))
	_, _ = zw.Write(content)
	mustDo(tb, zw.Close())
	p := filepath.Join(repo, ".git", "objects", id[:2], id[2:])
	mustDo(tb, os.MkdirAll(filepath.Dir(p), 0o755))
	_ = os.Remove(p)
	mustDo(tb, os.WriteFile(p, buf.Bytes(), 0o444))
}

func gitOut(tb testing.TB, w workspace, args ...string) string {
	tb.Helper()
	out, err := w.git.Run(context.Background(), args...)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// evilTree writes the base tree with calc.py EVIL into the store and
// returns its name.
func evilTree(tb testing.TB, w workspace) string {
	tb.Helper()
	blob := gitOut(tb, w, "hash-object", "-w", writeTemp(tb, evilCalc))
	var tree bytes.Buffer
	for _, line := range strings.Split(gitOut(tb, w, "ls-tree", w.base), "\n") {
		meta, name, _ := strings.Cut(line, "\t")
		f := strings.Fields(meta)
		id := f[2]
		if name == "calc.py" {
			id = blob
		}
		raw, _ := hex.DecodeString(id)
		fmt.Fprintf(&tree, "%s %s\x00%s", strings.TrimPrefix(f[0], "0"), name, raw)
	}
	sum := sha1.Sum(append(fmt.Appendf(nil, "tree %d\x00", tree.Len()), tree.Bytes()...))
	id := hex.EncodeToString(sum[:])
	writeLooseObject(tb, w.repo, id, "tree", tree.Bytes())
	return id
}

func writeTemp(tb testing.TB, content string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "content")
	mustDo(tb, os.WriteFile(p, []byte(content), 0o644))
	return p
}

func TestFinalizeRefusesATamperedRepository(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, w workspace)
	}{
		{"base commit rewritten to name another tree", func(t *testing.T, w workspace) {
			commit := gitOut(t, w, "cat-file", "commit", w.base) + "\n"
			evil := strings.Replace(commit, "tree "+w.built.Tree, "tree "+evilTree(t, w), 1)
			writeLooseObject(t, w.repo, w.base, "commit", []byte(evil))
		}},
		{"base tree object rewritten", func(t *testing.T, w workspace) {
			raw, err := w.git.Run(context.Background(), "cat-file", "tree", evilTree(t, w))
			mustDo(t, err)
			writeLooseObject(t, w.repo, w.built.Tree, "tree", raw)
		}},
		{"EVIL planted under the name of the agent's SAFE calc.py", func(t *testing.T, w workspace) {
			sum := sha1.Sum(fmt.Appendf(nil, "blob %d\x00%s", len(safeCalc), safeCalc))
			writeLooseObject(t, w.repo, hex.EncodeToString(sum[:]), "blob", []byte(evilCalc))
		}},
		{".git replaced by a copy", func(t *testing.T, w workspace) {
			shell(t, w, `cp -a .git {ws}/copy && rm -rf .git && mv {ws}/copy .git`)
		}},
		{".git removed", func(t *testing.T, w workspace) {
			shell(t, w, `rm -rf .git`)
		}},
		{".git/objects a symbolic link", func(t *testing.T, w workspace) {
			shell(t, w, `mv .git/objects {ws}/objects && ln -s {ws}/objects .git/objects`)
		}},
		{"base objects only through alternates", func(t *testing.T, w workspace) {
			shell(t, w, `mv .git/objects {ws}/objects && mkdir -p .git/objects/info && echo {ws}/objects > .git/objects/info/alternates`)
		}},
		{"repository folder replaced", func(t *testing.T, w workspace) {
			shell(t, w, `cd .. && cp -a repo copy && rm -rf repo && mv copy repo`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorkspace(t, testFiles)
			tt.tamper(t, w)
			agentEdits(t, w)
			fin, err := w.built.Finalize(context.Background(), testAllowed, "belay: agent changes")
			t.Logf("Finalize: %v", err)
			if !errors.Is(err, sandbox.ErrRepositoryTampered) {
				t.Fatalf("Finalize = %v (patch:\n%s); want an error wrapping ErrRepositoryTampered", err, fin.Patch)
			}
		})
	}
}
