//go:build unix

package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// checkAncestors refuses a workspace with a folder above it that the
// entry's user can write. The entry resets what it can reach inside the
// workspace before the final checks, but a tool that looks for its
// configuration upwards from the repository (pytest reads pytest.ini,
// tox.ini, setup.cfg, pyproject.toml and conftest.py in every parent)
// would also read what an earlier run planted there, and run it under this
// run's user. The launcher is meant to make this impossible (the local
// launcher refuses such a WorkRoot); this is the check of last resort.
//
// When the workspace folder is the entry's own, the launcher runs the
// sandbox as its own user (or the sandbox has a volume of its own), and
// folders above that belong to the same user are that launcher's: nothing
// separates the sandbox from them anyway. Folders of other owners that the
// user can write (/tmp) are refused all the same.
func checkAncestors(ws string) error {
	abs, err := filepath.Abs(ws)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	euid := uint32(os.Geteuid())
	ownWorkspace := ownedBy(abs, euid)
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		if unix.Access(d, unix.W_OK) == nil && !(ownWorkspace && ownedBy(d, euid)) {
			return fmt.Errorf("refusing to start: %s, above the workspace, is writable by this user (uid %d), so a run could leave files there (pytest.ini, conftest.py) that the checks of later runs read; the launcher must put workspaces where no sandbox can write", d, euid)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// ownedBy reports whether path belongs to uid.
func ownedBy(path string, uid uint32) bool {
	fi, err := os.Lstat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == uid
}
