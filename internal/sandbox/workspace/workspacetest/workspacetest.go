// Package workspacetest gives tests a folder for sandbox workspaces that the
// local launcher and the sandbox entry accept. Both refuse a workspace with
// a folder above it that a sandbox user can write, and the system's
// temporary directory (/tmp, world-writable) is exactly that, so tests
// cannot use os.MkdirTemp("", ...) or t.TempDir for workspaces.
package workspacetest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// RootBase is where tests running as root make their folders: root's own,
// mode 0711 (the sandbox uids pass through, nobody else lists or writes
// it), under /var/lib, whose parents are root's and writable by nobody
// else on any ordinary system. Each test's folder inside it is removed when
// the test ends; RootBase itself stays, empty.
const RootBase = "/var/lib/belay-tests"

// Dir makes a fresh folder whose name starts with prefix, mode 0711, for
// sandbox workspaces (or anything a sandbox user must reach), and removes
// it when the test ends. Its path is short, as a Unix socket path inside a
// workspace must stay under 108 bytes. As root it is inside RootBase; as
// another user, inside $XDG_RUNTIME_DIR or the user's cache directory (the
// folders above are the user's own or root's), falling back to the
// temporary directory, which the sandbox entry then refuses.
func Dir(tb testing.TB, prefix string) string {
	tb.Helper()
	base := userBase()
	if os.Geteuid() == 0 {
		base = RootBase
	}
	if err := os.MkdirAll(base, 0o711); err != nil {
		tb.Fatalf("workspacetest: create %s: %v", base, err)
	}
	if os.Geteuid() == 0 {
		fi, err := os.Lstat(base)
		if err != nil {
			tb.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			tb.Fatalf("workspacetest: %s must be a directory of root's that only root can write (it is %v, uid %d); remove it", base, fi.Mode(), st.Uid)
		}
		if fi.Mode().Perm() != 0o711 {
			if err := os.Chmod(base, 0o711); err != nil {
				tb.Fatal(err)
			}
		}
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// userBase is the base folder of a user other than root.
func userBase() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return filepath.Join(d, "belay-tests")
		}
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "belay-tests")
	}
	return filepath.Join(os.TempDir(), "belay-tests")
}
