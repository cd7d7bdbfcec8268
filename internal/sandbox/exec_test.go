package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/sandbox"
)

// envCanary is set in the test process's environment; no command the
// sandbox runs may see it.
const envCanary = "ENV-CANARY-TOKEN-7f3a9c"

func TestRunCommandEnvironmentIsExactlyTheCleanSet(t *testing.T) {
	t.Setenv("BELAY_TEST_SECRET", envCanary)
	home := t.TempDir()
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"env"}, Dir: t.TempDir(), Env: sandbox.CleanEnv(home),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("env exited %d: %s", res.ExitCode, res.Output)
	}
	got := strings.Split(strings.TrimSpace(string(res.Output)), "\n")
	slices.Sort(got)
	want := []string{
		"HOME=" + home,
		"LANG=C.UTF-8",
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"PYTHONDONTWRITEBYTECODE=1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("environment of a command:\n got %q\nwant %q", got, want)
	}
	if strings.Contains(string(res.Output), envCanary) {
		t.Error("the command saw the test process's secret")
	}
}

func TestRunCommandLooksUpProgramsInTheCleanPath(t *testing.T) {
	// A program on the sandbox's own PATH but not on the clean one must not
	// be found: checks run what the clean PATH names.
	dir := t.TempDir()
	prog := filepath.Join(dir, "belay-test-only-program")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\necho found\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"belay-test-only-program"}, Dir: dir, Env: sandbox.CleanEnv(dir),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 127 || !strings.Contains(string(res.Output), "not found") {
		t.Errorf("got exit %d, output %q; want 127 and a not-found message", res.ExitCode, res.Output)
	}
}

func TestRunCommandExitCodes(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want int
	}{
		{"success", []string{"true"}, 0},
		{"failure", []string{"false"}, 1},
		{"exit status", []string{"/bin/sh", "-c", "exit 3"}, 3},
		{"killed by a signal", []string{"/bin/sh", "-c", "kill -TERM $$"}, 128 + 15},
		{"missing program", []string{"no-such-program-belay"}, 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			res, err := sandbox.RunCommand(context.Background(), sandbox.Command{Argv: tt.argv, Dir: dir, Env: sandbox.CleanEnv(dir)})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.want {
				t.Errorf("exit code %d, want %d (output %q)", res.ExitCode, tt.want, res.Output)
			}
		})
	}
}

func TestRunCommandKeepsTheTailOfLongOutput(t *testing.T) {
	dir := t.TempDir()
	// 200 KiB between a first and a last marker, on stdout and stderr.
	script := `echo FIRST-LINE; i=0; while [ $i -lt 2000 ]; do printf '%0100d\n' $i; i=$((i+1)); done; echo LAST-LINE >&2`
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"/bin/sh", "-c", script}, Dir: dir, Env: sandbox.CleanEnv(dir), MaxOutput: 8 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output) > 8<<10 {
		t.Errorf("kept %d bytes of output, cap is %d", len(res.Output), 8<<10)
	}
	if res.OutputBytes < 200_000 {
		t.Errorf("OutputBytes = %d, want the full count (over 200000)", res.OutputBytes)
	}
	out := string(res.Output)
	if !strings.Contains(out, "LAST-LINE") || strings.Contains(out, "FIRST-LINE") {
		t.Errorf("want the tail (LAST-LINE) without the head (FIRST-LINE); got %d bytes ending %q", len(out), out[max(0, len(out)-200):])
	}
	tail := res.Tail(1024)
	if !strings.HasPrefix(tail, "[output truncated:") || !strings.HasSuffix(tail, "LAST-LINE\n") {
		t.Errorf("Tail(1024) = %q; want a truncation note, then the last bytes", tail)
	}
}

func TestRunCommandTimeoutKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "bg.pid")
	// The shell starts a background sleeper, records its pid, and waits.
	script := `sleep 300 & echo $! > bg.pid; wait`
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"/bin/sh", "-c", script}, Dir: dir, Env: sandbox.CleanEnv(dir), Timeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut {
		t.Fatalf("TimedOut = false; result %+v", res)
	}
	if res.ExitCode != 128+9 {
		t.Errorf("exit code %d, want %d (SIGKILL)", res.ExitCode, 128+9)
	}
	if !strings.Contains(string(res.Output), "timed out") {
		t.Errorf("output %q does not say the command timed out", res.Output)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the background process never started: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

func TestRunCommandKillsWhatACommandLeftBehind(t *testing.T) {
	dir := t.TempDir()
	// The command exits at once but leaves a process in the background.
	res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
		Argv: []string{"/bin/sh", "-c", `sleep 300 >/dev/null 2>&1 & echo $! > bg.pid`}, Dir: dir, Env: sandbox.CleanEnv(dir),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bg.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("bg.pid holds %q, not a process id", b)
	}
	waitGone(t, pid)
}

func TestRunCommandContextCancelInterrupts(t *testing.T) {
	t.Run("while it runs", func(t *testing.T) {
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The command says it started, then sleeps; the run stops meanwhile.
		go func() {
			defer cancel()
			for ctx.Err() == nil {
				if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		res, err := sandbox.RunCommand(ctx, sandbox.Command{
			Argv: []string{"/bin/sh", "-c", "touch started; exec sleep 300"}, Dir: dir, Env: sandbox.CleanEnv(dir),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Interrupted || res.TimedOut || res.ExitCode != 128+9 || !strings.Contains(string(res.Output), "interrupted") {
			t.Errorf("result %+v (output %q); want interrupted, killed by SIGKILL (exit 137)", res, res.Output)
		}
	})
	t.Run("before it starts", func(t *testing.T) {
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := sandbox.RunCommand(ctx, sandbox.Command{Argv: []string{"sleep", "300"}, Dir: dir, Env: sandbox.CleanEnv(dir)})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("a cancelled command reported success: %+v", res)
		}
	})
}

// waitGone waits until pid has exited (gone, or a zombie waiting to be
// reaped). A SIGKILLed process may take a moment to be scheduled and die;
// the bound is only there so a failure reports instead of hanging.
func waitGone(tb testing.TB, pid int) {
	tb.Helper()
	for start := time.Now(); time.Since(start) < 30*time.Second; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// The state is the field after the parenthesised command name.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
			if st := s[i+2]; st == 'Z' || st == 'X' {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("process %d is still running: the process group was not killed", pid)
}
