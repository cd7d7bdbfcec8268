package belay_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

const (
	resultRunID = "run-0123456789abcdef"
	// resultCanary stands in for file content. No error may repeat it.
	resultCanary = "CANARY-content-5e1d07b2"
	sha1Base     = "0123456789abcdef0123456789abcdef01234567"
	sha1Head     = "89abcdef0123456789abcdef0123456789abcdef"
)

func resultRequest() belay.RunRequest {
	return belay.RunRequest{
		Instruction: "Fix the failing test",
		Model:       "test-model",
		Files: []belay.File{
			{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"},
			{Path: "tests/test_calc.py", Content: "import calc\n"},
			{Path: "pkg/a.py", Content: "a = 1\n"},
		},
		AllowedPaths:    []string{"calc.py", "pkg/**"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}, {"git", "diff", "--check"}},
		MaxSteps:        12,
		WallTimeSeconds: 180,
	}
}

// goodPatch changes calc.py and adds pkg/new.py. Its hunk removes a line
// that reads "--- ..." once prefixed, so a parser that forgets hunk counts
// would take it for a header.
const goodPatch = `diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -1,3 +1,2 @@
 def add(a, b):
--- a/tests/test_calc.py ` + resultCanary + `
-    return a - b
+    return a + b
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1 @@
+x = "` + resultCanary + `"
\ No newline at end of file
`

func goodBundle() belay.ResultBundle {
	return belay.ResultBundle{
		Version:      belay.ResultBundleVersion,
		RunID:        resultRunID,
		Status:       belay.StatusCompleted,
		ExitCode:     0,
		Summary:      "Fixed add. " + resultCanary,
		ChangedFiles: []string{"calc.py", "pkg/new.py"},
		Checks: []belay.CheckResult{
			{Argv: []string{"python3", "-m", "pytest", "-q"}, ExitCode: 0, DurationMs: 812, OutputTail: "1 passed " + resultCanary},
			{Argv: []string{"git", "diff", "--check"}, ExitCode: 0, DurationMs: 9},
		},
		Usage:      belay.BundleUsage{ModelRequests: 3, PromptTokens: 900, CompletionTokens: 120},
		BaseCommit: sha1Base,
		HeadCommit: sha1Head,
	}
}

func resultFiles(tb testing.TB, b belay.ResultBundle, patch string) map[string][]byte {
	tb.Helper()
	raw, err := json.Marshal(b)
	if err != nil {
		tb.Fatalf("marshal bundle: %v", err)
	}
	return map[string][]byte{
		"result.json":      raw,
		"patch.diff":       []byte(patch),
		"transcript.jsonl": []byte(`{"role":"user","content":"` + resultCanary + `"}` + "\n"),
	}
}

func TestValidateResultAccepts(t *testing.T) {
	failing := goodBundle()
	failing.Status = belay.StatusFailed
	failing.ExitCode = 1
	failing.Reason = "checks failed"
	failing.Checks[0].ExitCode = 1

	unfinished := goodBundle()
	unfinished.Status = belay.StatusFailed
	unfinished.ExitCode = 1
	unfinished.Reason = "max_steps"

	renamed := goodBundle()
	renamed.ChangedFiles = []string{"pkg/a.py", "pkg/b.py"}

	quoted := goodBundle()
	quoted.ChangedFiles = []string{"pkg/café.py", "pkg/my file.py"}

	unchanged := goodBundle()
	unchanged.ChangedFiles = nil

	sha256 := goodBundle()
	sha256.BaseCommit = strings.Repeat("ab", 32)
	sha256.HeadCommit = strings.Repeat("cd", 32)

	tests := []struct {
		name   string
		bundle belay.ResultBundle
		patch  string
	}{
		{"completed", goodBundle(), goodPatch},
		{"failed with a failing check", failing, goodPatch},
		{"failed by an unfinished agent with passing checks", unfinished, goodPatch},
		{"no change and no patch", unchanged, ""},
		{"rename inside allowed paths", renamed, "diff --git a/pkg/a.py b/pkg/b.py\nsimilarity index 100%\nrename from pkg/a.py\nrename to pkg/b.py\n"},
		{"quoted and spaced names", quoted, "diff --git \"a/pkg/caf\\303\\251.py\" \"b/pkg/caf\\303\\251.py\"\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ \"b/pkg/caf\\303\\251.py\"\n@@ -0,0 +1 @@\n+x\ndiff --git a/pkg/my file.py b/pkg/my file.py\nnew file mode 100755\nindex 0000000..1111111\n--- /dev/null\n+++ b/pkg/my file.py\t\n@@ -0,0 +1 @@\n+y\n"},
		{"sha-256 commits", sha256, goodPatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := belay.ValidateResult(resultRunID, resultRequest(), resultFiles(t, tt.bundle, tt.patch))
			if err != nil {
				t.Fatalf("ValidateResult: %v", err)
			}
			if got.Status != tt.bundle.Status || !slices.Equal(got.ChangedFiles, tt.bundle.ChangedFiles) || len(got.Checks) != len(tt.bundle.Checks) {
				t.Errorf("ValidateResult = %+v, want the bundle %+v", got, tt.bundle)
			}
		})
	}
}

func TestValidateResultRefuses(t *testing.T) {
	with := func(edit func(b *belay.ResultBundle)) belay.ResultBundle {
		b := goodBundle()
		edit(&b)
		return b
	}
	// files builds the sandbox output from a bundle and a patch, then lets
	// edit change the raw files.
	type filesFunc func(tb testing.TB) map[string][]byte
	files := func(b belay.ResultBundle, patch string, edit ...func(map[string][]byte)) filesFunc {
		return func(tb testing.TB) map[string][]byte {
			f := resultFiles(tb, b, patch)
			for _, e := range edit {
				e(f)
			}
			return f
		}
	}
	rawResult := func(s string) func(map[string][]byte) {
		return func(f map[string][]byte) { f["result.json"] = []byte(s) }
	}
	// goodJSON is the good bundle's result.json with its closing brace cut,
	// so a case can append members.
	goodJSON := func(tb testing.TB) string {
		tb.Helper()
		raw, err := json.Marshal(goodBundle())
		if err != nil {
			tb.Fatalf("marshal: %v", err)
		}
		return strings.TrimSuffix(string(raw), "}")
	}
	replaceInResult := func(old, new string) func(map[string][]byte) {
		return func(f map[string][]byte) {
			f["result.json"] = bytes.Replace(f["result.json"], []byte(old), []byte(new), 1)
		}
	}
	onlyCalc := with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"calc.py"} })
	const calcSection = "diff --git a/calc.py b/calc.py\nindex 1111111..2222222 100644\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a\n+b\n"

	tests := []struct {
		name  string
		files filesFunc
		want  string // a phrase the message must hold
		field string
	}{
		{"result.json missing", files(goodBundle(), goodPatch, func(f map[string][]byte) { delete(f, "result.json") }),
			"is missing", "result.json"},
		{"result.json over 1 MiB", files(goodBundle(), goodPatch, rawResult(`{"summary":"`+strings.Repeat("x", belay.MaxResultJSONBytes)+`"}`)),
			"at most 1048576 bytes", "result.json"},
		{"not JSON", files(goodBundle(), goodPatch, rawResult(`{"version":1,`+resultCanary)),
			"not valid JSON", "result.json"},
		{"not an object", files(goodBundle(), goodPatch, rawResult(`["`+resultCanary+`"]`)),
			"not a result bundle object", "result.json"},
		{"trailing data", files(goodBundle(), goodPatch, func(f map[string][]byte) { f["result.json"] = append(f["result.json"], " {}"...) }),
			"data after the JSON object", "result.json"},
		{"unknown field", files(goodBundle(), goodPatch, func(f map[string][]byte) {}, func(f map[string][]byte) {
			f["result.json"] = []byte(goodJSON(t) + `,"trusted":true}`)
		}), `unknown member name "trusted"`, "result.json"},
		{"name in another case", files(goodBundle(), goodPatch, replaceInResult(`"runId"`, `"RunID"`)),
			`unknown member name "RunID"`, "result.json"},
		{"repeated name", files(goodBundle(), goodPatch, func(f map[string][]byte) {
			f["result.json"] = []byte(goodJSON(t) + `,"status":"completed"}`)
		}), `"status" more than once`, "result.json"},
		{"known name at the wrong level", files(goodBundle(), goodPatch, func(f map[string][]byte) {
			f["result.json"] = []byte(goodJSON(t) + `,"argv":["x"]}`)
		}), "does not belong", "result.json"},
		{"wrong type", files(goodBundle(), goodPatch, replaceInResult(`"exitCode":0,`, `"exitCode":"0",`)),
			"exitCode must be int", "result.json"},
		{"fractional number", files(goodBundle(), goodPatch, replaceInResult(`"exitCode":0,`, `"exitCode":0.5,`)),
			"exitCode must be int", "result.json"},
		{"invalid UTF-8", files(goodBundle(), goodPatch, replaceInResult(`Fixed add.`, "Fixed \xff.")),
			"not valid UTF-8", "result.json"},
		{"wrong version", files(with(func(b *belay.ResultBundle) { b.Version = 2 }), goodPatch),
			"version is 2", "result.json"},
		{"wrong run id", files(with(func(b *belay.ResultBundle) { b.RunID = "run-other" }), goodPatch),
			"runId is not this run's id", "result.json"},
		{"status running", files(with(func(b *belay.ResultBundle) { b.Status = belay.StatusRunning }), goodPatch),
			`status is "running"`, "result.json"},
		{"status cancelled", files(with(func(b *belay.ResultBundle) { b.Status = belay.StatusCancelled }), goodPatch),
			`status is "cancelled"`, "result.json"},
		{"completed with a failing check", files(with(func(b *belay.ResultBundle) { b.Checks[1].ExitCode = 1 }), goodPatch),
			"completed but checks[1] exited with code 1", "result.json"},
		{"completed with a non-zero exit code", files(with(func(b *belay.ResultBundle) { b.ExitCode = 2 }), goodPatch),
			"completed but exitCode is 2", "result.json"},
		{"failed with exit code 0", files(with(func(b *belay.ResultBundle) { b.Status = belay.StatusFailed; b.Checks[0].ExitCode = 1 }), goodPatch),
			"failed but exitCode is 0", "result.json"},
		{"failed with every check passing and no reason", files(with(func(b *belay.ResultBundle) { b.Status = belay.StatusFailed; b.ExitCode = 1; b.Reason = "" }), goodPatch),
			"failed with every check passing but gives no reason", "result.json"},
		{"missing check", files(with(func(b *belay.ResultBundle) { b.Checks = b.Checks[:1] }), goodPatch),
			"checks has 1 entries; the run asked for 2", "result.json"},
		{"extra check", files(with(func(b *belay.ResultBundle) {
			b.Checks = append(b.Checks, belay.CheckResult{Argv: []string{"python3", "-m", "compileall", "-q", "."}})
		}), goodPatch), "checks has 3 entries", "result.json"},
		{"different check", files(with(func(b *belay.ResultBundle) { b.Checks[0].Argv = []string{"python3", "-m", "pytest"} }), goodPatch),
			"checks[0].argv is", "result.json"},
		{"check with an extra argument", files(with(func(b *belay.ResultBundle) { b.Checks[1].Argv = append(b.Checks[1].Argv, "--", "calc.py") }), goodPatch),
			"checks[1].argv is", "result.json"},
		{"checks out of order", files(with(func(b *belay.ResultBundle) { b.Checks[0], b.Checks[1] = b.Checks[1], b.Checks[0] }), goodPatch),
			"checks[0].argv is", "result.json"},
		{"negative duration", files(with(func(b *belay.ResultBundle) { b.Checks[0].DurationMs = -1 }), goodPatch),
			"durationMs is negative", "result.json"},
		{"output tail over 16 KiB", files(with(func(b *belay.ResultBundle) {
			b.Checks[0].OutputTail = strings.Repeat(resultCanary, belay.MaxOutputTailBytes/len(resultCanary)+1)
		}), goodPatch), "outputTail is", "result.json"},
		{"summary over 8 KiB", files(with(func(b *belay.ResultBundle) {
			b.Summary = strings.Repeat(resultCanary, belay.MaxSummaryBytes/len(resultCanary)+1)
		}), goodPatch), "summary is", "result.json"},
		{"reason with a terminal escape", files(with(func(b *belay.ResultBundle) {
			b.Status, b.ExitCode, b.Checks[0].ExitCode, b.Reason = belay.StatusFailed, 1, 1, "\x1b[2Jdone"
		}), goodPatch), "reason contains a control character", "result.json"},
		{"negative usage", files(with(func(b *belay.ResultBundle) { b.Usage.PromptTokens = -5 }), goodPatch),
			"usage has a negative count", "result.json"},
		{"base commit not a hash", files(with(func(b *belay.ResultBundle) { b.BaseCommit = "HEAD" }), goodPatch),
			"baseCommit is not a hex commit id", "result.json"},
		{"head commit upper case", files(with(func(b *belay.ResultBundle) { b.HeadCommit = strings.ToUpper(sha1Head) }), goodPatch),
			"headCommit is not a hex commit id", "result.json"},
		{"claims a file outside allowedPaths", files(with(func(b *belay.ResultBundle) {
			b.ChangedFiles = []string{"calc.py", "tests/test_calc.py"}
		}), calcSection+"diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-a\n+b\n"),
			`changedFiles[1]: path "tests/test_calc.py" is outside allowedPaths`, "result.json"},
		{"claims .git/config", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{".git/config"} }), ""),
			"changedFiles[0]: path \".git/config\" has a .git segment", "result.json"},
		{"claims an escaping path", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"pkg/../../etc/passwd"} }), ""),
			`".." segment`, "result.json"},
		{"claims a file twice", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"calc.py", "calc.py"} }), calcSection),
			"changedFiles[1] repeats changedFiles[0]", "result.json"},
		{"claims a file the patch does not change", files(goodBundle(), calcSection),
			`changedFiles lists "pkg/new.py", which patch.diff does not change`, "result.json"},
		{"patch touches a file not in the list", files(onlyCalc, goodPatch),
			`changes "pkg/new.py", which changedFiles does not list`, "patch.diff"},
		{"patch touches a file outside allowedPaths", files(onlyCalc, calcSection+"diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-a\n+b\n"),
			`"tests/test_calc.py" is outside allowedPaths`, "patch.diff"},
		{".git/config in the patch", files(onlyCalc, calcSection+"diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1,2 @@\n [core]\n+\tfsmonitor = "+resultCanary+"\n"),
			`".git/config" has a .git segment`, "patch.diff"},
		{".GIT in another case in the patch", files(onlyCalc, calcSection+"diff --git a/pkg/.GIT/hooks/post-checkout.py b/pkg/.GIT/hooks/post-checkout.py\nnew file mode 100755\n--- /dev/null\n+++ b/pkg/.GIT/hooks/post-checkout.py\n@@ -0,0 +1 @@\n+x\n"),
			"has a .git segment", "patch.diff"},
		{"rename out of allowedPaths", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"calc.py"} }),
			"diff --git a/calc.py b/tests/calc.py\nsimilarity index 100%\nrename from calc.py\nrename to tests/calc.py\n"),
			`"tests/calc.py" is outside allowedPaths`, "patch.diff"},
		{"rename into allowedPaths from outside", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"pkg/t.py"} }),
			"diff --git a/tests/test_calc.py b/pkg/t.py\nsimilarity index 100%\nrename from tests/test_calc.py\nrename to pkg/t.py\n"),
			`"tests/test_calc.py" is outside allowedPaths`, "patch.diff"},
		{"---/+++ names that differ from the header", files(onlyCalc,
			"diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/tests/test_calc.py\n@@ -1 +1 @@\n-a\n+b\n"),
			`"tests/test_calc.py" is outside allowedPaths`, "patch.diff"},
		{"a header smuggled after a hunk", files(onlyCalc, calcSection+"+++ b/tests/test_calc.py\n"),
			"line 8: is neither a hunk", "patch.diff"},
		{"a hunk shorter than its header", files(onlyCalc, "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n-a\n+b\n"),
			"ends inside a hunk", "patch.diff"},
		{"a hunk cut by another file", files(onlyCalc, "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n-a\n"+calcSection),
			"a hunk ends before its line counts say", "patch.diff"},
		{"a symlink", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"pkg/link.py"} }),
			"diff --git a/pkg/link.py b/pkg/link.py\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/pkg/link.py\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"),
			"symbolic link", "patch.diff"},
		{"a file turned into a symlink", files(onlyCalc, "diff --git a/calc.py b/calc.py\nindex 1111111..2222222 120000\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a\n+/etc/passwd\n"),
			"symbolic link", "patch.diff"},
		{"a submodule", files(with(func(b *belay.ResultBundle) { b.ChangedFiles = []string{"pkg/sub"} }),
			"diff --git a/pkg/sub b/pkg/sub\nnew file mode 160000\nindex 0000000..1111111\n--- /dev/null\n+++ b/pkg/sub\n@@ -0,0 +1 @@\n+Subproject commit "+sha1Head+"\n"),
			"submodule", "patch.diff"},
		{"not a git diff", files(onlyCalc, resultCanary+"\n"),
			`line 1: expected a "diff --git" line`, "patch.diff"},
		{"a foreign line in a header", files(onlyCalc, "diff --git a/calc.py b/calc.py\n"+resultCanary+"\n"),
			"line 2: is not a line of git diff output", "patch.diff"},
		{"a header without sides", files(onlyCalc, "diff --git calc.py calc.py\n"),
			"does not name a/ and b/ paths", "patch.diff"},
		{"a bad quoted name", files(onlyCalc, "diff --git \"a/calc.py\\q\" \"b/calc.py\"\n"),
			"quoted path is not valid", "patch.diff"},
		{"a control character in a name", files(onlyCalc, "diff --git \"a/pkg/x\\033.py\" \"b/pkg/x\\033.py\"\n"),
			"control character", "patch.diff"},
		{"patch over the artifact cap", files(onlyCalc, calcSection, func(f map[string][]byte) {
			f["patch.diff"] = append(f["patch.diff"], bytes.Repeat([]byte("+"), belay.MaxArtifactBytes)...)
		}), "at most 8388608 bytes", "patch.diff"},
		{"transcript over the artifact cap", files(goodBundle(), goodPatch, func(f map[string][]byte) {
			f["transcript.jsonl"] = bytes.Repeat([]byte(resultCanary), belay.MaxArtifactBytes/len(resultCanary)+1)
		}), "at most 8388608 bytes", "transcript.jsonl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := belay.ValidateResult(resultRunID, resultRequest(), tt.files(t))
			if err == nil {
				t.Fatal("ValidateResult accepted the result")
			}
			if code := belay.ErrorCode(err); code != belay.CodeInvalid {
				t.Errorf("code = %q, want invalid (err %v)", code, err)
			}
			var e *belay.Error
			if !errors.As(err, &e) || e.Field != tt.field {
				t.Errorf("error %v: want an *belay.Error about %q", err, tt.field)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("message %q does not say %q", msg, tt.want)
			}
			if strings.Contains(msg, resultCanary) {
				t.Errorf("message %q repeats file content", msg)
			}
		})
	}
}

// TestValidateResultRealGit holds the patch parser to what git itself
// writes: edits, a new file, a deletion, a rename, and names with a space
// and with non-ASCII letters, which git quotes.
func TestValidateResultRealGit(t *testing.T) {
	gitPath, err := exec.LookPath("git")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("git is not installed: %v", err)
		}
		t.Skip("git is not installed; install it (apt-get install git) to run this test")
	}
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(gitPath, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_SYSTEM=/dev/null",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	req := resultRequest()
	req.Files = append(req.Files,
		belay.File{Path: "pkg/old name.py", Content: strings.Repeat("line\n", 20)},
		belay.File{Path: "pkg/gone.py", Content: "bye\n"},
		belay.File{Path: "pkg/sub/deep.py", Content: "-- a line that starts with two dashes\nkeep\n"},
	)
	git("init", "-q")
	for _, f := range req.Files {
		write(f.Path, f.Content)
	}
	git("add", "-A")
	git("commit", "-q", "-m", "base")
	base := strings.TrimSpace(git("rev-parse", "HEAD"))

	write("calc.py", "def add(a, b):\n    return a + b\n")
	write("pkg/sub/deep.py", "keep\n")
	write("pkg/naïve.py", "x = 1\n")
	if err := os.Remove(filepath.Join(dir, "pkg", "gone.py")); err != nil {
		t.Fatal(err)
	}
	git("mv", "pkg/old name.py", "pkg/new name.py")
	if err := os.Chmod(filepath.Join(dir, "pkg", "a.py"), 0o755); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("commit", "-q", "-m", "agent")
	head := strings.TrimSpace(git("rev-parse", "HEAD"))
	patch := git("-c", "diff.renames=true", "diff", base)

	b := goodBundle()
	b.BaseCommit, b.HeadCommit = base, head
	b.ChangedFiles = []string{"calc.py", "pkg/a.py", "pkg/gone.py", "pkg/naïve.py", "pkg/new name.py", "pkg/old name.py", "pkg/sub/deep.py"}
	files := resultFiles(t, b, patch)
	if _, err := belay.ValidateResult(resultRunID, req, files); err != nil {
		t.Fatalf("ValidateResult of git's own patch: %v\npatch:\n%s", err, patch)
	}

	// Leaving the rename's source out of changedFiles is caught.
	b.ChangedFiles = slices.DeleteFunc(slices.Clone(b.ChangedFiles), func(p string) bool { return p == "pkg/old name.py" })
	_, err = belay.ValidateResult(resultRunID, req, resultFiles(t, b, patch))
	if want := fmt.Sprintf("changes %q", "pkg/old name.py"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ValidateResult without the rename source = %v, want a message with %s", err, want)
	}
}

// FuzzValidateResult feeds hostile patches and bundles to the validator:
// it must never panic, and whatever it accepts must keep every changed
// file clean and inside allowedPaths.
func FuzzValidateResult(f *testing.F) {
	raw, err := json.Marshal(goodBundle())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw, []byte(goodPatch))
	f.Add(raw, []byte("diff --git \"a/pkg/caf\\303\\251.py\" b/pkg/x.py\nrename from pkg/a.py\nrename to pkg/b.py\n"))
	f.Add(raw, []byte("diff --git a/calc.py b/calc.py\nGIT binary patch\nliteral 3\nKcmV+b0000001\n\n"))
	f.Add([]byte(`{"version":1,"runId":"x","checks":[{"argv":["a"]}],"usage":{}}`), []byte("@@ -1 +1 @@\n"))
	req := resultRequest()
	f.Fuzz(func(t *testing.T, result, patch []byte) {
		b, err := belay.ValidateResult(resultRunID, req, map[string][]byte{"result.json": result, "patch.diff": patch})
		if err != nil {
			if belay.ErrorCode(err) != belay.CodeInvalid {
				t.Fatalf("code %q, want invalid: %v", belay.ErrorCode(err), err)
			}
			return
		}
		for _, p := range b.ChangedFiles {
			if belay.CheckPath(p) != nil || !belay.PathAllowed(req.AllowedPaths, p) {
				t.Fatalf("accepted changed file %q", p)
			}
		}
	})
}
