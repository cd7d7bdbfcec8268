//go:build unix

package sandbox

import (
	"path/filepath"

	"golang.org/x/sys/unix"
)

// writableAncestors returns the folders above ws that the entry's user can
// write. The entry resets what it can reach inside the workspace before the
// final checks, but a tool that looks for its configuration upwards from
// the repository (pytest reads pytest.ini, tox.ini, setup.cfg and
// pyproject.toml in every parent) would also read what a shell command
// planted there, so the launcher must keep them out of the sandbox user's
// reach.
func writableAncestors(ws string) []string {
	abs, err := filepath.Abs(ws)
	if err != nil {
		return nil
	}
	var dirs []string
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		if unix.Access(d, unix.W_OK) == nil {
			dirs = append(dirs, d)
		}
		if d == filepath.Dir(d) {
			return dirs
		}
	}
}
