package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// Output caps of a command: the result a model reads keeps the last
// ResultTailBytes of the combined output, the transcript the last
// TranscriptTailBytes. The tail is kept because that is where test runners
// print their verdict.
const (
	ResultTailBytes     = 8 << 10
	TranscriptTailBytes = 64 << 10
)

// CleanEnv is the whole environment of a check or shell command: a fixed
// PATH (workspace.CleanPath), HOME in the workspace, a UTF-8 locale and no bytecode files in the
// repository. Nothing else is passed on, so no token or key can reach a
// command the model chose.
func CleanEnv(home string) []string {
	return []string{
		"PATH=" + workspace.CleanPath,
		"HOME=" + home,
		"LANG=C.UTF-8",
		"PYTHONDONTWRITEBYTECODE=1",
	}
}

// Command is one process to run: by argv, never through a shell unless argv
// names one (the shell tool does, after approval).
type Command struct {
	// Argv is the program and its arguments. A program name without a slash
	// is looked up in the PATH of Env, not in the sandbox's own PATH.
	Argv []string
	// Dir is the working directory.
	Dir string
	// Env is the complete environment; nil means an empty one.
	Env []string
	// Timeout bounds the run; zero means only ctx does. On timeout the
	// whole process group is killed.
	Timeout time.Duration
	// MaxOutput is how many bytes of combined output to keep, from the end;
	// zero means TranscriptTailBytes.
	MaxOutput int
	// Stdout, when set, receives standard output in full; the result's
	// Output then holds only standard error. Git's output is data, not a
	// log, so the entry takes it this way.
	Stdout io.Writer
	// Stdin, when set, is the command's standard input (the entry feeds
	// object names to git this way); nil means none.
	Stdin io.Reader
}

// CommandResult is how a command ended.
type CommandResult struct {
	// ExitCode is the process's exit status; 128+n when signal n killed it
	// (as shells report it), 127 when it could not be started.
	ExitCode int
	Duration time.Duration
	// Output is the tail of stdout and stderr, interleaved as written.
	Output []byte
	// OutputBytes counts everything the command wrote, kept or not.
	OutputBytes int64
	// TimedOut is true when Timeout ended the command; Interrupted when
	// ctx did (the run is stopping).
	TimedOut    bool
	Interrupted bool
}

// Tail returns at most n bytes from the end of the output, marked when
// something was cut, as a string a model or a person can read.
func (r CommandResult) Tail(n int) string {
	out := r.Output
	cut := r.OutputBytes > int64(len(out))
	if len(out) > n {
		out = out[len(out)-n:]
		cut = true
	}
	s := string(out)
	if cut {
		s = fmt.Sprintf("[output truncated: %d bytes written, last %d shown]\n", r.OutputBytes, len(out)) + s
	}
	return s
}

// waitDelay bounds how long Wait waits for the output pipe after the
// process group was killed, in case a process escaped the group and still
// holds it.
const waitDelay = 2 * time.Second

// RunCommand runs c and waits for it. The command gets its own process
// group, which is killed as a whole on timeout, when ctx ends, and after the
// command exits (so nothing it left in the background outlives it). It runs
// with no_new_privs set, whatever the rest of the process has. An error
// means c itself was unusable; a command that fails to start comes back as
// exit code 127 with the reason in Output.
func RunCommand(ctx context.Context, c Command) (CommandResult, error) {
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return CommandResult{}, errors.New("run command: empty argv")
	}
	maxOut := c.MaxOutput
	if maxOut <= 0 {
		maxOut = TranscriptTailBytes
	}
	out := &tailBuffer{max: maxOut}

	path, err := lookPathIn(c.Argv[0], envValue(c.Env, "PATH"), c.Dir)
	if err != nil {
		fmt.Fprintf(out, "cannot start %s: %v\n", c.Argv[0], err)
		return CommandResult{ExitCode: 127, Output: out.Bytes(), OutputBytes: out.Total()}, nil
	}

	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if c.Timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, c.Timeout)
	}
	defer cancel()

	cmd := exec.CommandContext(runCtx, path)
	cmd.Args = append([]string(nil), c.Argv...)
	cmd.Dir = c.Dir
	cmd.Env = append([]string{}, c.Env...)
	cmd.Stdin = c.Stdin
	cmd.Stdout = out
	if c.Stdout != nil {
		cmd.Stdout = c.Stdout
	}
	cmd.Stderr = out
	cmd.SysProcAttr = childSysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = waitDelay

	start := time.Now()
	runErr := runHardened(cmd)
	res := CommandResult{Duration: time.Since(start)}

	switch {
	case cmd.ProcessState != nil:
		res.ExitCode = exitCode(cmd.ProcessState)
	case runErr != nil:
		// Start failed: nothing ran.
		fmt.Fprintf(out, "cannot start %s: %v\n", c.Argv[0], runErr)
		res.ExitCode = 127
	}
	if cmd.ProcessState != nil || runErr == nil {
		switch {
		case ctx.Err() != nil:
			res.Interrupted = true
			fmt.Fprintf(out, "\n[belay: interrupted: the run is stopping; process group killed]\n")
		case runCtx.Err() != nil:
			res.TimedOut = true
			fmt.Fprintf(out, "\n[belay: timed out after %s; process group killed]\n", c.Timeout)
		}
	}
	res.Output = out.Bytes()
	res.OutputBytes = out.Total()
	return res, nil
}

// runHardened starts cmd and waits for it on one locked OS thread that has
// no_new_privs set, and leaves the entry room under the uid's process limit
// (reserveThreadsForEntry). The flag is per thread and inherited at fork, and a
// cgo-linked binary cannot set it on every thread at once, so setting it on
// the forking thread is what guarantees the child has it. The thread is
// retired afterwards (the goroutine exits locked); it is also the thread the
// child's parent-death signal is tied to, which is why it lives until Wait
// returns.
func runHardened(cmd *exec.Cmd) error {
	keepSpareThreads(spareThreads)
	errc := make(chan error, 1)
	go func() {
		lockThreadForChild()
		if err := setThreadNoNewPrivs(); err != nil {
			errc <- fmt.Errorf("set no_new_privs: %w", err)
			return
		}
		if err := cmd.Start(); err != nil {
			errc <- err
			return
		}
		if err := reserveThreadsForEntry(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			errc <- fmt.Errorf("limit the command's processes: %w", err)
			return
		}
		err := cmd.Wait()
		// Whatever the command left running in its group goes with it.
		_ = killGroup(cmd)
		errc <- err
	}()
	return <-errc
}

// spareThreads is how many idle OS threads the entry keeps before it starts
// a command.
const spareThreads = 16

// keepSpareThreads makes sure the Go runtime holds at least n OS threads
// besides those busy now, idle for it to reuse. A command may fill the
// sandbox's process limit (a fork bomb in a check under runc's pids cgroup,
// which the entry's own threads count against too), and the runtime exits
// the whole entry when it needs a new thread and cannot have one; with
// spare ones it takes an idle thread instead, and the entry still reports
// and uploads the run's result. n goroutines each lock a thread at once,
// so the runtime starts the threads it lacks (reusing the idle ones it
// has), then unlock and end, leaving the threads idle; the runtime never
// ends an idle thread.
func keepSpareThreads(n int) {
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			locked.Done()
			release.Wait()
		}()
	}
	locked.Wait()
	release.Done()
}

// killGroup kills the command's whole process group.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// envValue returns the value of key in env, or "".
func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPathIn finds an executable the way a shell would with the given PATH.
// exec.LookPath would consult the sandbox's own PATH instead, which is not
// what the command runs with. A name with a slash is taken as given
// (relative to dir).
func lookPathIn(file, pathList, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathList) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, file)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable file not found in PATH %s", pathList)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it and counts them all.
// It is safe for concurrent writes (stdout and stderr share it).
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	// Compact only when twice the cap is reached, so writes stay amortised O(n).
	if len(b.buf) > 2*b.max {
		n := copy(b.buf, b.buf[len(b.buf)-b.max:])
		b.buf = b.buf[:n]
	}
	return len(p), nil
}

// Bytes returns a copy of the kept tail.
func (b *tailBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf
	if len(s) > b.max {
		s = s[len(s)-b.max:]
	}
	return append([]byte(nil), s...)
}

// Total returns how many bytes were written in all.
func (b *tailBuffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
