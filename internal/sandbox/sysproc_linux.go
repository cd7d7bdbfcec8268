package sandbox

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childSysProcAttr puts a child in its own process group (so a timeout can
// kill everything it started) and has the kernel kill it if the thread that
// started it dies (so a crashed entry leaves no command running).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// lockThreadForChild pins the calling goroutine to its OS thread for good:
// the goroutine never unlocks, so the runtime retires the thread when the
// goroutine exits instead of reusing a thread whose attributes were changed.
func lockThreadForChild() { runtime.LockOSThread() }

// setThreadNoNewPrivs sets no_new_privs on the calling thread.
func setThreadNoNewPrivs() error {
	return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
}

// entryThreadReserve is how many of the uid's processes and threads a
// command leaves to the entry: RLIMIT_NPROC counts every task of the uid,
// the commands' and the entry's alike, and the Go runtime cannot live
// without a new thread when it needs one (it exits).
const entryThreadReserve = 64

// reserveThreadsForEntry lowers the process limit of the command pid (a
// child of the entry, of the entry's uid, which may lower it without
// privilege) to entryThreadReserve below the entry's own, so a fork bomb in
// a check stops while the entry can still start threads, report and
// upload. It does nothing when the entry's limit is unlimited or too small
// to share. The command runs for a moment before the limit lands (Go
// cannot set a child's limits before exec): a program that forks at once
// may briefly go past it, and the entry then fails as before, its run
// failed, never completed.
func reserveThreadsForEntry(pid int) error {
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &own); err != nil {
		return err
	}
	if own.Max == unix.RLIM_INFINITY || own.Max < 4*entryThreadReserve {
		return nil
	}
	child := unix.Rlimit{Max: own.Max - entryThreadReserve}
	child.Cur = min(own.Cur, child.Max)
	return unix.Prlimit(pid, unix.RLIMIT_NPROC, &child, nil)
}

// killStrays kills every other process in the entry's PID namespace when
// the entry is that namespace's init (pid 1), as the local launcher starts
// it with namespaces and as a Fargate task runs it, and reaps them, waiting
// at most wait. A command the agent ran can leave a process behind that
// left its process group (setsid), which the per-command kill misses; it
// must not change the tree after the entry has vouched for it. Outside a
// namespace of its own the entry cannot tell such a process from the rest
// of the machine's, and does nothing. It must not be called while a
// command runs: it reaps any child.
func killStrays(wait time.Duration) (int, error) {
	if os.Getpid() != 1 {
		return 0, nil
	}
	// From a namespace's init, -1 means every process in the namespace but
	// the caller. EPERM: none of them is the entry's to signal.
	if err := syscall.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, syscall.EPERM) {
		return 0, fmt.Errorf("kill: %w", err)
	}
	// The killed are, or become, the init's children: reap them all. No
	// wait blocks, so nothing is left waiting to steal a later command's
	// exit status.
	n := 0
	deadline := time.Now().Add(wait)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.ECHILD):
			return n, nil
		case err != nil:
			return n, fmt.Errorf("wait: %w", err)
		case pid > 0:
			n++
		case time.Now().After(deadline):
			return n, fmt.Errorf("processes left behind were still running %s after SIGKILL", wait)
		default:
			time.Sleep(5 * time.Millisecond)
		}
	}
}
