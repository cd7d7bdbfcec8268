package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
)

func TestRunFollowUploadsTheTreeAndReportsTheOutcome(t *testing.T) {
	s := startServer(t, nil) // the inert sandbox: every run fails at once
	dir := project(t)
	r := s.belay(t, "run", dir, "--instruction", "Fix the failing test", "--allow", "calc.py",
		"--check", "python3 -m pytest -q", "--max-steps", "3", "--follow")

	lines := strings.Split(r.stdout, "\n")
	id := lines[0]
	if r.code != 1 || !strings.HasPrefix(id, "run_") {
		t.Fatalf("belay run = %d; want 1 (the run failed) and the run id first\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"#1 ", "run.queued", "#2 ", "run.started", "run.failed", "run " + id + ": failed",
		"reason:        sandbox exited with code 64", "python3 -m pytest -q (no results)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	for _, want := range []string{
		"skipping big.txt: 65 KiB is over the 64 KiB",
		"skipping passwd.txt: a symbolic link",
		"skipping logo.png: the server does not accept this extension",
		"skipping latin1.py: not UTF-8 text",
		"skipping .git/: hidden folders",
		"skipping .pytest_cache/: hidden folders",
		"skipping __pycache__/: hidden folders",
		"uploading 2 file(s)",
		"belay: run " + id + " failed: sandbox exited with code 64",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}

	view, err := s.client(t).GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(view.Request.Files, ","); got != "calc.py,tests/test_calc.py" {
		t.Errorf("uploaded %s; want only calc.py and tests/test_calc.py", got)
	}
	if !slices.Equal(view.Request.Checks[0], []string{"python3", "-m", "pytest", "-q"}) || view.Request.MaxSteps != 3 {
		t.Errorf("the run asked for checks %q, maxSteps %d", view.Request.Checks, view.Request.MaxSteps)
	}
}

func TestRunRefusesBadInvocations(t *testing.T) {
	s := startServer(t, nil)
	dir := project(t)
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "image.png"), []byte("png"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--instruction", "Fix it", "--allow", "calc.py", "--check", "python3 -m pytest -q"}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no directory", base, 2, "takes DIR (got 0"},
		{"two directories", append([]string{dir, empty}, base...), 2, "takes DIR (got 2"},
		{"no instruction", []string{dir, "--allow", "calc.py", "--check", "git diff --check"}, 2, "--instruction is required"},
		{"no allowed path", []string{dir, "--instruction", "x", "--check", "git diff --check"}, 2, "--allow is required"},
		{"no check", []string{dir, "--instruction", "x", "--allow", "calc.py"}, 2, "--check is required"},
		{"blank check", append([]string{dir, "--check", "  "}, base...), 2, `--check "  " is empty`},
		{"nothing to upload", append([]string{empty}, base...), 1, "no files to upload under " + empty},
		{"not a directory", append([]string{filepath.Join(dir, "calc.py")}, base...), 1, "is not a directory"},
		{"check not on the allowlist", []string{dir, "--instruction", "x", "--allow", "calc.py", "--check", "rm -rf /"}, 1,
			"(invalid, request id req_"},
		{"allowed path not uploaded", []string{dir, "--instruction", "x", "--allow", "nope.py", "--check", "git diff --check"}, 1,
			"allowedPaths[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.belay(t, append([]string{"run"}, tt.args...)...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("belay run %v = %d\nstderr: %s\nwant %d and %q", tt.args, r.code, r.stderr, tt.code, tt.stderr)
			}
			if tt.code == 2 && r.stdout != "" {
				t.Errorf("a refused command line printed %q", r.stdout)
			}
		})
	}
	if list := s.belay(t, "runs"); !strings.Contains(list.stdout, "no runs") {
		t.Errorf("refused invocations created runs:\n%s", list.stdout)
	}
}

// TestRunFixesCalcEndToEnd is the main job: the real sandbox entry, the
// example project and the scripted model session that fixes it.
func TestRunFixesCalcEndToEnd(t *testing.T) {
	entry := embeddedtest.RealSandbox(t)
	s := startServer(t, func(c *embedded.Config) { c.SandboxBin = entry })
	calc := filepath.Join(embeddedtest.ModuleRoot(t), "examples", "calc")
	r := s.belay(t, "run", calc, "--instruction", "Fix the failing test in calc.py", "--allow", "calc.py",
		"--check", "python3 -m pytest -q", "--follow")
	if r.code != 0 {
		t.Fatalf("belay run = %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"step 4: edit_file", "python3 -m pytest -q: passed in", "run.completed", ": completed",
		"python3 -m pytest -q: passed", "changed files: calc.py", "+    return a + b"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestRunFollowInterrupted stops `belay run --follow` (as Ctrl-C or
// SIGTERM does) while the run goes on: it must not exit 0, which says the
// run completed, and it says how to pick the run up again.
func TestRunFollowInterrupted(t *testing.T) {
	s := startServer(t, func(c *embedded.Config) { c.SandboxBin = embeddedtest.IdleSandbox(t) })
	dir := project(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", dir, "--instruction", "Fix it", "--allow", "calc.py",
			"--check", "python3 -m pytest -q", "--follow"},
			&env{stdout: &stdout, stderr: &stderr, lookup: func(k string) (string, bool) { v, ok := s.env[k]; return v, ok }})
	}()
	deadline := time.After(time.Minute)
	for !strings.Contains(stdout.String(), "run.started") {
		select {
		case code := <-done:
			t.Fatalf("belay run exited %d before the run started\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
		case <-deadline:
			t.Fatalf("the run never started\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	code := <-done
	id, _, _ := strings.Cut(stdout.String(), "\n")
	if code != 1 {
		t.Errorf("belay run --follow interrupted = %d; want 1: the run has not completed", code)
	}
	for _, want := range []string{"Resume with: belay events " + id + " --follow --after ", "interrupted before run " + id + " ended"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	view, err := s.client(t).GetRun(context.Background(), id)
	if err != nil || view.Status != belay.StatusRunning {
		t.Errorf("the run after the interrupt: %s, %v; want it still running", view.Status, err)
	}
}
