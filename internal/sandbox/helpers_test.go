package sandbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
)

// testUID is the unprivileged user helper processes run as when the tests
// run as root.
const testUID = 10001

// isRoot reports whether the tests run as root.
func isRoot() bool { return os.Geteuid() == 0 }

// requireRoot skips a test that needs root when run by hand as another
// user, saying why; in CI (CI set), where the tests always run as root, it
// fails instead, so nothing is skipped there.
func requireRoot(tb testing.TB, why string) {
	tb.Helper()
	if isRoot() {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("needs root %s; CI runs the tests as root", why)
	}
	tb.Skipf("needs root %s: run the tests as root (sudo go test ./internal/sandbox/)", why)
}

// helperBinary copies the test binary where testUID can run it (go test
// keeps it in an owner-only directory) and returns its path.
func helperBinary(tb testing.TB) string {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	dir := worldReadableDir(tb)
	dst := filepath.Join(dir, "sandbox.test")
	in, err := os.Open(self)
	if err != nil {
		tb.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		tb.Fatal(err)
	}
	if err := out.Close(); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// worldReadableDir returns a fresh directory that testUID can enter, where
// no folder above is writable by testUID (the entry refuses a workspace
// below /tmp, where t.TempDir is).
func worldReadableDir(tb testing.TB) string {
	tb.Helper()
	dir := workspacetest.Dir(tb, "sbx")
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// helperCommand returns a command that runs the test binary in helper mode,
// as testUID when the tests run as root.
func helperCommand(tb testing.TB, bin, mode string, env ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{helperEnv + "=" + mode, "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/", "LANG=C.UTF-8"}, env...)
	if isRoot() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: testUID, Gid: testUID}}
	}
	return cmd
}

// treeHash hashes everything under dir without following symbolic links:
// each entry's path, type, permission bits, and content or link target. Two
// equal hashes mean nothing under dir changed.
func treeHash(tb testing.TB, dir string) string {
	tb.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			line += " " + hex.EncodeToString(sum[:])
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])
}
