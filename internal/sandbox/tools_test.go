package sandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
)

// testFiles is a small uploaded tree: a module, its tests, and files the
// agent may read but not change.
var testFiles = []belay.File{
	{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"},
	{Path: "tests/test_calc.py", Content: "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
	{Path: "README.md", Content: "# calc\n\nAdds numbers.\n"},
	{Path: "docs/guide.md", Content: "Call add(a, b).\n"},
}

var testAllowed = []string{"calc.py", "tests/**"}

// workspace is a sandbox workspace with its repository built: ws/repo, and
// next to it ws/outside.txt, which no tool may ever change or read.
type workspace struct {
	dir  string
	repo string
	home string
	base string
	git  sandbox.Git
	// built is the entry's memory of the repository as built.
	built *sandbox.Base
}

func newWorkspace(tb testing.TB, files []belay.File) workspace {
	tb.Helper()
	dir := tb.TempDir()
	w := workspace{dir: dir, repo: filepath.Join(dir, "repo"), home: filepath.Join(dir, "home")}
	mustDo(tb, os.Mkdir(w.home, 0o755))
	mustDo(tb, os.WriteFile(filepath.Join(dir, "outside.txt"), []byte("outside the repository\n"), 0o644))
	mustDo(tb, os.Mkdir(filepath.Join(dir, "outdir"), 0o755))
	w.git = sandbox.Git{Dir: w.repo, Home: w.home}
	base, err := sandbox.BuildRepo(context.Background(), w.git, files)
	if err != nil {
		tb.Fatalf("BuildRepo: %v", err)
	}
	w.base, w.built = base.Commit, base
	return w
}

// recorder collects emitted events.
type recorder struct {
	mu     sync.Mutex
	events []recorded
}

type recorded struct {
	typ  string
	data any
}

func (r *recorder) Emit(typ string, data any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{typ, data})
}

func (r *recorder) all() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.events...)
}

func newTools(tb testing.TB, w workspace, mod func(*sandbox.ToolsConfig)) *sandbox.Tools {
	tb.Helper()
	cfg := sandbox.ToolsConfig{
		RepoDir: w.repo, HomeDir: w.home,
		AllowedPaths: testAllowed,
		Checks:       [][]string{{"git", "diff", "--check"}, {"python3", "-c", "print('checked')"}},
	}
	if mod != nil {
		mod(&cfg)
	}
	tools, err := sandbox.NewTools(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tools.Close() })
	return tools
}

func call(tb testing.TB, tools *sandbox.Tools, name string, args any) (string, bool) {
	tb.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		tb.Fatal(err)
	}
	return tools.Call(context.Background(), name, b)
}

func TestWritesOutsideTheAllowedPathsAreRefused(t *testing.T) {
	w := newWorkspace(t, testFiles)
	// Traps a model might use: links out of the repository, a link from an
	// allowed path to one that is not, a hard link to a file outside.
	mustDo(t, os.Symlink(filepath.Join(w.dir, "outside.txt"), filepath.Join(w.repo, "tests", "abs_link.py")))
	mustDo(t, os.Symlink("../../outside.txt", filepath.Join(w.repo, "tests", "rel_link.py")))
	mustDo(t, os.Symlink("../README.md", filepath.Join(w.repo, "tests", "inner_link.py")))
	mustDo(t, os.Symlink(filepath.Join(w.dir, "outdir"), filepath.Join(w.repo, "tests", "outdir")))
	mustDo(t, os.Link(filepath.Join(w.dir, "outside.txt"), filepath.Join(w.repo, "tests", "hard_link.py")))
	tools := newTools(t, w, nil)

	tests := []struct {
		path string
		want string
	}{
		{"../x.py", `".." segment`},
		{"../outside.txt", `".." segment`},
		{"tests/../README.md", `".." segment`},
		{filepath.Join(w.dir, "outside.txt"), "absolute"},
		{"/etc/passwd", "absolute"},
		{".git/config", ".git segment"},
		{".GIT/config", ".git segment"},
		{"tests/.git/hooks/pre-commit", ".git segment"},
		{"README.md", "outside the paths this run may change"},
		{"docs/guide.md", "outside the paths this run may change"},
		{"new.py", "outside the paths this run may change"},
		{"tests/abs_link.py", "symbolic link"},
		{"tests/rel_link.py", "symbolic link"},
		{"tests/inner_link.py", "symbolic link"},
		{"tests/outdir/x.py", "symbolic link"},
		{"tests/hard_link.py", "hard links"},
		{`tests\x.py`, "backslash"},
		{"tests//x.py", "empty segment"},
		{"", "path is required"},
		{"tests/x\x00.py", "NUL"},
	}
	before := treeHash(t, w.dir)
	for _, tt := range tests {
		for _, tool := range []string{sandbox.ToolWriteFile, sandbox.ToolEditFile} {
			t.Run(tool+" "+tt.path, func(t *testing.T) {
				args := map[string]string{"path": tt.path, "content": "pwned\n", "old": "outside", "new": "pwned"}
				out, isErr := call(t, tools, tool, args)
				if !isErr {
					t.Fatalf("%s %q succeeded: %q", tool, tt.path, out)
				}
				if !strings.Contains(out, tt.want) {
					t.Errorf("result %q does not say %q", out, tt.want)
				}
			})
		}
	}
	if after := treeHash(t, w.dir); after != before {
		t.Error("a refused write changed the workspace")
	}
	if b, _ := os.ReadFile(filepath.Join(w.dir, "outside.txt")); string(b) != "outside the repository\n" {
		t.Errorf("outside.txt = %q", b)
	}
}

func TestReadsAreConfinedToTheRepository(t *testing.T) {
	w := newWorkspace(t, testFiles)
	mustDo(t, os.Symlink(filepath.Join(w.dir, "outside.txt"), filepath.Join(w.repo, "escape.md")))
	mustDo(t, os.Symlink(filepath.Join(w.dir, "outdir"), filepath.Join(w.repo, "escape_dir")))
	mustDo(t, os.WriteFile(filepath.Join(w.dir, "outdir", "secret.md"), []byte("outside the repository\n"), 0o644))
	tools := newTools(t, w, nil)

	for _, p := range []string{"../outside.txt", filepath.Join(w.dir, "outside.txt"), "escape.md", "escape_dir/secret.md", ".git/config", ".git/HEAD"} {
		t.Run("read_file "+p, func(t *testing.T) {
			out, isErr := call(t, tools, sandbox.ToolReadFile, map[string]string{"path": p})
			if !isErr || strings.Contains(out, "outside the repository") || strings.Contains(out, "[core]") {
				t.Errorf("read_file %q = %q, %v; want a refusal", p, out, isErr)
			}
		})
	}
	for _, p := range []string{"escape_dir", "..", ".git"} {
		t.Run("list_files "+p, func(t *testing.T) {
			out, isErr := call(t, tools, sandbox.ToolListFiles, map[string]string{"path": p})
			if !isErr || strings.Contains(out, "secret.md") {
				t.Errorf("list_files %q = %q, %v; want a refusal", p, out, isErr)
			}
		})
	}
	out, isErr := call(t, tools, sandbox.ToolSearch, map[string]string{"pattern": "outside the repository|repositoryformatversion", "path": ""})
	if isErr || !strings.Contains(out, "no matches") {
		t.Errorf("search through links and .git found something: %q", out)
	}
}

func TestListFiles(t *testing.T) {
	w := newWorkspace(t, testFiles)
	mustDo(t, os.Symlink("calc.py", filepath.Join(w.repo, "link.py")))
	tools := newTools(t, w, nil)
	out, isErr := call(t, tools, sandbox.ToolListFiles, map[string]string{"path": ""})
	if isErr {
		t.Fatal(out)
	}
	want := "README.md (22 bytes)\ncalc.py (32 bytes)\ndocs/\ndocs/guide.md (16 bytes)\nlink.py (symbolic link, not followed)\ntests/\ntests/test_calc.py (65 bytes)\n"
	if out != want {
		t.Errorf("list_files:\n got %q\nwant %q", out, want)
	}
	out, _ = call(t, tools, sandbox.ToolListFiles, map[string]string{"path": "tests/"})
	if out != "tests/test_calc.py (65 bytes)\n" {
		t.Errorf("list_files tests/ = %q", out)
	}
}

func TestListFilesIsCapped(t *testing.T) {
	w := newWorkspace(t, testFiles)
	many := filepath.Join(w.repo, "tests", "many")
	mustDo(t, os.Mkdir(many, 0o755))
	for i := range sandbox.MaxListEntries + 50 {
		mustDo(t, os.WriteFile(filepath.Join(many, fmt.Sprintf("f%04d.py", i)), nil, 0o644))
	}
	tools := newTools(t, w, nil)
	out, isErr := call(t, tools, sandbox.ToolListFiles, map[string]string{"path": "."})
	if isErr {
		t.Fatal(out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != sandbox.MaxListEntries+1 || !strings.HasPrefix(lines[len(lines)-1], "[truncated") {
		t.Errorf("got %d lines ending %q; want %d entries and a truncation note", len(lines), lines[len(lines)-1], sandbox.MaxListEntries)
	}
}

func TestReadFile(t *testing.T) {
	w := newWorkspace(t, testFiles)
	big := strings.Repeat("x", sandbox.MaxReadBytes+100)
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "big.txt"), []byte(big), 0o644))
	tools := newTools(t, w, nil)

	out, isErr := call(t, tools, sandbox.ToolReadFile, map[string]string{"path": "./calc.py"})
	if isErr || out != testFiles[0].Content {
		t.Errorf("read_file calc.py = %q, %v", out, isErr)
	}
	out, isErr = call(t, tools, sandbox.ToolReadFile, map[string]string{"path": "big.txt"})
	if isErr || !strings.HasPrefix(out, big[:sandbox.MaxReadBytes]) || !strings.Contains(out, "[truncated: the file is 65636 bytes") {
		t.Errorf("read_file big.txt: error %v, %d bytes, ending %q", isErr, len(out), out[max(0, len(out)-80):])
	}
	if len(out) > sandbox.MaxReadBytes+200 {
		t.Errorf("read result is %d bytes; cap is %d", len(out), sandbox.MaxReadBytes)
	}
	for _, p := range []string{"missing.py", "docs"} {
		if out, isErr := call(t, tools, sandbox.ToolReadFile, map[string]string{"path": p}); !isErr {
			t.Errorf("read_file %q = %q; want an error", p, out)
		}
	}
}

func TestWriteFile(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, nil)
	content := "def add(a, b):\n    return a + b\n"
	if out, isErr := call(t, tools, sandbox.ToolWriteFile, map[string]string{"path": "calc.py", "content": content}); isErr {
		t.Fatal(out)
	}
	if b, _ := os.ReadFile(filepath.Join(w.repo, "calc.py")); string(b) != content {
		t.Errorf("calc.py = %q", b)
	}
	// A new file in a new directory under an allowed subtree.
	if out, isErr := call(t, tools, sandbox.ToolWriteFile, map[string]string{"path": "tests/unit/test_more.py", "content": "x = 1\n"}); isErr {
		t.Fatal(out)
	}
	if fi, err := os.Stat(filepath.Join(w.repo, "tests", "unit", "test_more.py")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("new file: %v, %v", fi, err)
	}
	out, isErr := call(t, tools, sandbox.ToolWriteFile, map[string]string{"path": "calc.py", "content": strings.Repeat("x", sandbox.MaxWriteBytes+1)})
	if !isErr || !strings.Contains(out, "at most 65536 bytes") {
		t.Errorf("oversized write: %q, %v", out, isErr)
	}
	if out, isErr := call(t, tools, sandbox.ToolWriteFile, map[string]string{"path": "calc.py"}); !isErr || !strings.Contains(out, "content is required") {
		t.Errorf("write without content: %q, %v", out, isErr)
	}
	if out, isErr := tools.Call(context.Background(), sandbox.ToolWriteFile, json.RawMessage(`{"path": 3}`)); !isErr || !strings.Contains(out, "not a valid JSON object") {
		t.Errorf("write with bad arguments: %q, %v", out, isErr)
	}
}

func TestEditFile(t *testing.T) {
	tests := []struct {
		name     string
		old, new string
		wantErr  string
		want     string
	}{
		{"replaces the one occurrence", "a - b", "a + b", "", "def add(a, b):\n    return a + b\n"},
		{"deletes with an empty new", "    return a - b\n", "", "", "def add(a, b):\n"},
		{"not found", "a * b", "a + b", "old text not found", ""},
		{"more than once", "a", "z", "occurs 3 times", ""},
		{"empty old", "", "x", "old is required", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorkspace(t, testFiles)
			tools := newTools(t, w, nil)
			out, isErr := call(t, tools, sandbox.ToolEditFile, map[string]string{"path": "calc.py", "old": tt.old, "new": tt.new})
			got, _ := os.ReadFile(filepath.Join(w.repo, "calc.py"))
			if tt.wantErr != "" {
				if !isErr || !strings.Contains(out, tt.wantErr) {
					t.Errorf("result %q, %v; want an error saying %q", out, isErr, tt.wantErr)
				}
				if string(got) != testFiles[0].Content {
					t.Errorf("a failed edit changed the file to %q", got)
				}
				return
			}
			if isErr {
				t.Fatal(out)
			}
			if string(got) != tt.want {
				t.Errorf("calc.py = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSearch(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, nil)
	tests := []struct {
		pattern, path string
		want          string
		isErr         bool
	}{
		{`def \w+\(`, "", "calc.py:1: def add(a, b):\ntests/test_calc.py:4: def test_add():\n", false},
		{`add`, "tests", "tests/test_calc.py:1: from calc import add\ntests/test_calc.py:4: def test_add():\ntests/test_calc.py:5:     assert add(2, 3) == 5\n", false},
		{`nothing-like-this`, ".", "no matches\n", false},
		{`(`, "", "not a valid regular expression", true},
		{``, "", "pattern is required", true},
		{`x`, "../", `".." segment`, true},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" in "+tt.path, func(t *testing.T) {
			out, isErr := call(t, tools, sandbox.ToolSearch, map[string]string{"pattern": tt.pattern, "path": tt.path})
			if isErr != tt.isErr {
				t.Fatalf("isError = %v: %q", isErr, out)
			}
			if tt.isErr && !strings.Contains(out, tt.want) || !tt.isErr && out != tt.want {
				t.Errorf("search = %q, want %q", out, tt.want)
			}
		})
	}
}

func TestSearchIsCapped(t *testing.T) {
	w := newWorkspace(t, testFiles)
	mustDo(t, os.WriteFile(filepath.Join(w.repo, "many.txt"), []byte(strings.Repeat("match me\n", 1000)), 0o644))
	tools := newTools(t, w, nil)
	out, isErr := call(t, tools, sandbox.ToolSearch, map[string]string{"pattern": "match", "path": "many.txt"})
	if isErr {
		t.Fatal(out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != sandbox.MaxSearchMatches+1 || !strings.HasPrefix(lines[len(lines)-1], "[truncated after 200 matches") {
		t.Errorf("got %d lines, last %q", len(lines), lines[len(lines)-1])
	}
}

func TestRunCheckRunsOnlyTheRunsChecks(t *testing.T) {
	w := newWorkspace(t, testFiles)
	rec := &recorder{}
	tools := newTools(t, w, func(c *sandbox.ToolsConfig) { c.Events = rec })
	for _, argv := range [][]string{
		{"python3", "-c", "print('checked')", "extra"},
		{"python3", "-c"},
		{"git", "diff", "--check", "; rm -rf /"},
		{"sh", "-c", "git diff --check"},
		{"git diff --check"},
		{},
	} {
		out, isErr := call(t, tools, sandbox.ToolRunCheck, map[string]any{"argv": argv})
		if !isErr || !strings.Contains(out, "not one of the run's checks") {
			t.Errorf("run_check %q = %q, %v; want a refusal", argv, out, isErr)
		}
	}
	if n := len(rec.all()); n != 0 {
		t.Errorf("refused checks emitted %d events", n)
	}
	out, isErr := call(t, tools, sandbox.ToolRunCheck, map[string]any{"argv": []string{"python3", "-c", "print('checked')"}})
	if isErr || !strings.HasPrefix(out, "exit code 0 after") || !strings.Contains(out, "checked") {
		t.Fatalf("run_check = %q, %v", out, isErr)
	}
	ev := rec.all()
	if len(ev) != 1 || ev[0].typ != belay.EventCheckFinished {
		t.Fatalf("events %+v; want one check.finished", ev)
	}
	cf := ev[0].data.(sandbox.CheckFinished)
	if raw, _ := json.Marshal(cf); strings.Contains(string(raw), "final") {
		t.Errorf("a sandbox's check.finished says final: %s", raw)
	}
	if cf.ExitCode != 0 || strings.Join(cf.Argv, " ") != "python3 -c print('checked')" {
		t.Errorf("check.finished data %+v", cf)
	}
}

func TestShellWithoutApprovalsIsDenied(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, nil)
	before := treeHash(t, w.dir)
	out, isErr := call(t, tools, sandbox.ToolShell, map[string]string{"command": "echo pwned > calc.py"})
	if !isErr || !strings.Contains(out, "denied") {
		t.Errorf("shell = %q, %v; want a denial", out, isErr)
	}
	if treeHash(t, w.dir) != before {
		t.Error("a denied shell command changed the workspace")
	}
}

func TestUnknownTool(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, nil)
	for _, name := range []string{"rm_rf", "finish", ""} {
		if out, isErr := call(t, tools, name, map[string]string{}); !isErr || !strings.Contains(out, "unknown tool") {
			t.Errorf("tool %q: %q, %v", name, out, isErr)
		}
	}
}

func TestDefinitionsOfferEveryToolButFinish(t *testing.T) {
	w := newWorkspace(t, testFiles)
	tools := newTools(t, w, func(c *sandbox.ToolsConfig) { c.ShellTimeout = 90 * time.Second })
	var names []string
	for _, d := range tools.Definitions() {
		names = append(names, d.Name)
		if d.Description == "" || d.Parameters["type"] != "object" {
			t.Errorf("tool %s: description %q, parameters %v", d.Name, d.Description, d.Parameters)
		}
		// The model is told the shell's real time limit.
		if d.Name == sandbox.ToolShell && !strings.Contains(d.Description, "1m30s at most") {
			t.Errorf("shell description %q does not state its 1m30s limit", d.Description)
		}
	}
	want := []string{"list_files", "read_file", "write_file", "edit_file", "search", "run_check", "shell"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("tools %q, want %q (finish is the agent loop's)", names, want)
	}
}
