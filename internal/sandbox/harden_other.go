//go:build !linux

package sandbox

import (
	"fmt"
	"runtime"
)

// Harden refuses to run off Linux: the sandbox relies on no_new_privs and
// the dumpable flag, which only Linux has.
func Harden() error {
	return fmt.Errorf("harden: the sandbox entry runs only on Linux, not %s", runtime.GOOS)
}
