package sandbox

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// keptEnv are the only environment variables the entry keeps. Tokens never
// come from the environment, and nothing else the launcher might have set
// should reach a command the model chose.
var keptEnv = []string{"PATH", "HOME", "LANG"}

// Harden locks the entry's own process down before it reads any secret:
// it refuses to run as root (the launcher drops privileges before exec),
// sets no_new_privs (no setuid or file-capability binary can raise the
// privileges of anything it runs) and clears the dumpable flag (no process
// of the same user, such as a command the agent ran, can ptrace it or read
// its memory and environment through /proc), then clears its environment
// of all but PATH, HOME and LANG.
func Harden() error {
	if os.Getuid() == 0 || os.Geteuid() == 0 {
		return errors.New("harden: refusing to run as root (uid 0): the launcher must drop privileges before starting the sandbox entry")
	}
	if err := setNoNewPrivs(); err != nil {
		return fmt.Errorf("harden: set no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("harden: clear the dumpable flag: %w", err)
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(keptEnv, k) {
			if err := os.Unsetenv(k); err != nil {
				return fmt.Errorf("harden: clear environment variable %s: %w", k, err)
			}
		}
	}
	return nil
}

// setNoNewPrivs sets no_new_privs on every thread of the process. The flag
// is per thread; the Go runtime can apply a system call to all its threads
// only in a binary without cgo (the image is built with CGO_ENABLED=0). A
// cgo-linked build gets the flag on the calling thread, and RunCommand sets
// it on the thread that forks each child, so no child ever runs without it.
func setNoNewPrivs() error {
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
	if errno == 0 {
		return nil
	}
	if errno != syscall.ENOTSUP {
		return errno
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
}
