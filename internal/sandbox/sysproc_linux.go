package sandbox

import (
	"runtime"
	"syscall"

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
