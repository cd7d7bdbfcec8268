package sandbox_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// toolCall is one scripted step calling tool with args.
func toolCall(tb testing.TB, tool string, args map[string]string) scriptedmodel.Step {
	tb.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		tb.Fatal(err)
	}
	return scriptedmodel.Step{ToolCalls: []scriptedmodel.ToolCall{{Name: tool, Arguments: b}}}
}

func finishStep() scriptedmodel.Step {
	return scriptedmodel.Step{ToolCalls: []scriptedmodel.ToolCall{{Name: "finish", Arguments: []byte(`{"summary":"Done."}`)}}}
}

// runEntry runs the entry to its end on script under req and returns the
// bundle the control plane accepts.
func runEntry(t *testing.T, script scriptedmodel.Script, req map[string]any, prepare func(sr *sandboxRun)) (*sandboxRun, belay.ResultBundle, map[string][]byte) {
	t.Helper()
	sr := prepareSandbox(t, script, req)
	if prepare != nil {
		prepare(sr)
	}
	if err := sr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := sr.wait(t); code != 0 {
		t.Fatalf("entry exited %d\nstderr:\n%s", code, sr.stderr.String())
	}
	files := sr.outputs(t)
	bundle, err := belay.ValidateResult(sr.runID, sr.req, files)
	if err != nil {
		t.Fatalf("the control plane would refuse the bundle: %v\n%s", err, files["result.json"])
	}
	sr.assertNoSecrets(t)
	return sr, bundle, files
}

// markerDir is a folder outside the workspace that the sandbox user can
// write: a filter or hook that ran leaves its marker there.
func markerDir(t *testing.T) string {
	t.Helper()
	dir := worldReadableDir(t)
	mustDo(t, os.Chmod(dir, 0o777))
	return dir
}

func TestEntryFilterFromTheShellDoesNotReachThePatch(t *testing.T) {
	// The attack as it was found: a shell command adds a clean filter that
	// turns SAFE into EVIL, then an edit adds "# SAFE"; the entry's own
	// `git add` used to run the filter and commit EVIL while the checks
	// passed on SAFE.
	marker := filepath.Join(markerDir(t), "marker")
	attack := `printf '[filter "x"]\n\tclean = "touch ` + marker + `; sed s/SAFE/EVIL/"\n' >> .git/config && echo 'calc.py filter=x' > .git/info/attributes`
	script := scriptedmodel.Script{Name: "filter", Steps: []scriptedmodel.Step{
		toolCall(t, "shell", map[string]string{"command": attack}),
		toolCall(t, "edit_file", map[string]string{"path": "calc.py", "old": "a - b", "new": "a + b  # SAFE"}),
		finishStep(),
	}}
	sr, bundle, files := runEntry(t, script, runRequest(belay.PolicyAllowAll, 0), nil)
	if bundle.Status != belay.StatusCompleted {
		t.Errorf("bundle status %s, reason %q; want completed", bundle.Status, bundle.Reason)
	}
	patch := files["patch.diff"]
	if bytes.Contains(patch, []byte("EVIL")) || !bytes.Contains(patch, []byte("+    return a + b  # SAFE\n")) {
		t.Errorf("the patch is not the agent's edit:\n%s", patch)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the filter ran")
	}
	for _, c := range bundle.Checks {
		if c.ExitCode != 0 {
			t.Errorf("check %q exited %d: %s", c.Argv, c.ExitCode, c.OutputTail)
		}
	}
	assertCheckedTreeIsThePatch(t, filepath.Join(sr.ws, "repo"), testFiles, patch)
}

func TestEntryFinalChecksSeeOnlyTheHeadTree(t *testing.T) {
	// Each shell command leaves something outside the patch that would make
	// the run's check pass on calc.py as uploaded (add subtracts). The
	// final checks must run without it, and fail.
	pytest := []string{"python3", "-m", "pytest", "-q"}
	importCheck := []string{"python3", "-c", "import calc; assert calc.add(2, 3) == 5"}
	gitCheck := []string{"git", "diff", "--check"}
	tests := []struct {
		name  string
		check []string
		steps []scriptedmodel.Step
		// changed is the patch's changedFiles.
		changed []string
	}{
		{"conftest.py outside allowedPaths marks failures passed", pytest, []scriptedmodel.Step{
			toolCall(t, "shell", map[string]string{"command": `printf 'import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    outcome = yield\n    outcome.get_result().outcome = "passed"\n' > conftest.py`}),
		}, nil},
		{"pytest.ini in the workspace adds --collect-only", pytest, []scriptedmodel.Step{
			toolCall(t, "shell", map[string]string{"command": `printf '[pytest]\naddopts = --collect-only\n' > ../pytest.ini`}),
		}, nil},
		{"usercustomize in home fakes calc", importCheck, []scriptedmodel.Step{
			toolCall(t, "shell", map[string]string{"command": `d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p "$d" && printf 'import sys, types\nm = types.ModuleType("calc")\nm.add = lambda a, b: a + b\nsys.modules["calc"] = m\n' > "$d/usercustomize.py"`}),
		}, nil},
		{"stale bytecode of a fixed calc.py", importCheck, []scriptedmodel.Step{
			toolCall(t, "shell", map[string]string{"command": `cp -p calc.py ../calc.orig && sed -i 's/a - b/a + b/' calc.py && touch -r ../calc.orig calc.py && python3 -c 'import py_compile; py_compile.compile("calc.py")' && cp -p ../calc.orig calc.py`}),
		}, nil},
		{"~/.gitconfig switches whitespace errors off", gitCheck, []scriptedmodel.Step{
			toolCall(t, "edit_file", map[string]string{"path": "calc.py", "old": "a - b", "new": "a - b  "}),
			toolCall(t, "shell", map[string]string{"command": `printf '[core]\n\twhitespace = -trailing-space,-space-before-tab,-indent-with-non-tab\n' > ~/.gitconfig`}),
		}, []string{"calc.py"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := scriptedmodel.Script{Name: "cheat", Steps: append(slices.Clone(tt.steps), finishStep())}
			req := runRequest(belay.PolicyAllowAll, 0)
			req["checks"] = [][]string{tt.check}
			sr, bundle, _ := runEntry(t, script, req, nil)
			if bundle.Status != belay.StatusFailed || bundle.Reason != sandbox.ReasonChecksFailed {
				t.Errorf("bundle status %s, reason %q; want failed, %s", bundle.Status, bundle.Reason, sandbox.ReasonChecksFailed)
			}
			if c := bundle.Checks[0]; c.ExitCode == 0 || c.ExitCode == -1 {
				t.Errorf("the check %q exited %d; it should have run and failed:\n%s", c.Argv, c.ExitCode, c.OutputTail)
			}
			if !slices.Equal(bundle.ChangedFiles, append([]string{}, tt.changed...)) {
				t.Errorf("changedFiles %q, want %q", bundle.ChangedFiles, tt.changed)
			}
			// The shell command itself ran: the cheat was there to be left
			// out, not refused.
			if !toolResultSaysExit0(t, sr) {
				t.Error("the shell command did not run, or failed")
			}
		})
	}
}

// toolResultSaysExit0 reports whether a shell tool result in the run's
// transcript says the command exited 0.
func toolResultSaysExit0(t *testing.T, sr *sandboxRun) bool {
	t.Helper()
	b := sr.outputs(t)["transcript.jsonl"]
	return regexp.MustCompile(`"tool":"shell"[^\n]*"exitCode":0`).Match(b)
}

func TestEntryReportsATamperedRepository(t *testing.T) {
	// The shell rewrites the base commit's object so that "base" names an
	// empty tree: a patch from it would add every file.
	rewrite := `python3 - <<'PY'
import os, subprocess, zlib
base = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
empty = subprocess.check_output(["git", "mktree"], input="", text=True).strip()
raw = subprocess.check_output(["git", "cat-file", "commit", base], text=True)
evil = ("tree " + empty + raw[raw.index("\n"):]).encode()
p = os.path.join(".git", "objects", base[:2], base[2:])
os.chmod(p, 0o644)
with open(p, "wb") as f:
    f.write(zlib.compress(b"commit %d\0" % len(evil) + evil))
PY`
	script := scriptedmodel.Script{Name: "tamper", Steps: []scriptedmodel.Step{
		toolCall(t, "edit_file", map[string]string{"path": "calc.py", "old": "a - b", "new": "a + b"}),
		toolCall(t, "shell", map[string]string{"command": rewrite}),
		finishStep(),
	}}
	sr, bundle, files := runEntry(t, script, runRequest(belay.PolicyAllowAll, 0), nil)
	if !toolResultSaysExit0(t, sr) {
		t.Fatalf("the shell command failed; see the transcript in %s", sr.ws)
	}
	if bundle.Status != belay.StatusFailed || bundle.ExitCode != 1 || bundle.Reason != sandbox.ReasonRepositoryTampered {
		t.Errorf("bundle status %s, exit %d, reason %q; want failed, 1, %s", bundle.Status, bundle.ExitCode, bundle.Reason, sandbox.ReasonRepositoryTampered)
	}
	if len(files["patch.diff"]) != 0 || len(bundle.ChangedFiles) != 0 || bundle.HeadCommit != bundle.BaseCommit {
		t.Errorf("a tampered run gave a patch (%d bytes), changedFiles %q, head %s (base %s)",
			len(files["patch.diff"]), bundle.ChangedFiles, bundle.HeadCommit, bundle.BaseCommit)
	}
	for i, c := range bundle.Checks {
		if c.ExitCode != -1 || !strings.Contains(c.OutputTail, "tampered") {
			t.Errorf("checks[%d]: exit %d, output %q; want not run", i, c.ExitCode, c.OutputTail)
		}
	}
}

func TestEntryKillsWhatCommandsLeftRunning(t *testing.T) {
	requireRoot(t, "to start the entry in a PID namespace of its own")
	// A process that left the shell command's process group keeps changing
	// an allowed file. Started as the init of its own PID namespace, as the
	// local launcher and Fargate start it, the entry kills it before it
	// takes the head commit, so the checked tree stays the patch's.
	stray := `setsid sh -c 'i=0; while :; do i=$((i+1)); echo "# $i" >> tests/stray.py; sleep 0.01; done' </dev/null >/dev/null 2>&1 &
sleep 0.1`
	script := scriptedmodel.Script{Name: "stray", Steps: []scriptedmodel.Step{
		toolCall(t, "shell", map[string]string{"command": stray}),
		toolCall(t, "edit_file", map[string]string{"path": "calc.py", "old": "a - b", "new": "a + b"}),
		finishStep(),
	}}
	sr, bundle, files := runEntry(t, script, runRequest(belay.PolicyAllowAll, 0), func(sr *sandboxRun) {
		sr.cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID
	})
	if !strings.Contains(sr.stderr.String(), "killed processes left behind by commands") {
		t.Errorf("the entry did not say it killed the stray process; stderr:\n%s", sr.stderr.String())
	}
	if !slices.Contains(bundle.ChangedFiles, "tests/stray.py") {
		t.Errorf("changedFiles %q; the stray's file should be in the patch", bundle.ChangedFiles)
	}
	assertCheckedTreeIsThePatch(t, filepath.Join(sr.ws, "repo"), testFiles, files["patch.diff"])
}

func TestEntryResetsTheTreeBetweenChecks(t *testing.T) {
	// The first check runs a test the agent wrote (in the patch), and the
	// test changes what the second check would see. Each check must run on
	// the head tree all the same.
	tests := []struct {
		name     string
		test     string
		tampered bool
	}{
		{"a test fixes calc.py for the next check", "import pathlib\n\npathlib.Path('calc.py').write_text('def add(a, b):\\n    return a + b\\n')\n\n\ndef test_ok():\n    pass\n", false},
		{"a test removes .git", "import shutil\n\nshutil.rmtree('.git')\n\n\ndef test_ok():\n    pass\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := scriptedmodel.Script{Name: "between", Steps: []scriptedmodel.Step{
				toolCall(t, "write_file", map[string]string{"path": "tests/test_cheat.py", "content": tt.test}),
				finishStep(),
			}}
			req := runRequest(belay.PolicyDenyAll, 0)
			req["checks"] = [][]string{{"python3", "-m", "pytest", "-q"}, {"python3", "-c", "import calc; assert calc.add(2, 3) == 5"}}
			_, bundle, files := runEntry(t, script, req, nil)
			second := bundle.Checks[1]
			switch {
			case tt.tampered:
				if bundle.Reason != sandbox.ReasonRepositoryTampered || second.ExitCode != -1 || len(files["patch.diff"]) != 0 {
					t.Errorf("reason %q, second check exit %d, patch %d bytes; want %s, not run, no patch",
						bundle.Reason, second.ExitCode, len(files["patch.diff"]), sandbox.ReasonRepositoryTampered)
				}
			default:
				if bundle.Reason != sandbox.ReasonChecksFailed || second.ExitCode == 0 || second.ExitCode == -1 {
					t.Errorf("reason %q, second check exit %d: %s; want %s, the second check run and failed",
						bundle.Reason, second.ExitCode, second.OutputTail, sandbox.ReasonChecksFailed)
				}
				if !slices.Equal(bundle.ChangedFiles, []string{"tests/test_cheat.py"}) {
					t.Errorf("changedFiles %q", bundle.ChangedFiles)
				}
			}
		})
	}
}
