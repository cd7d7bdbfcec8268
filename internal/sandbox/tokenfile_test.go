package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/sandbox"
)

// tokenCanary is the content of every token file in these tests; no error
// message may repeat it.
const tokenCanary = "bt1.TOKEN-CANARY-e4d1b7"

func TestReadTokenFileReadsOnceAndRemoves(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.token")
	if err := os.WriteFile(path, []byte(tokenCanary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := sandbox.ReadTokenFile(dir, "model.token")
	if err != nil {
		t.Fatalf("ReadTokenFile: %v", err)
	}
	if got != tokenCanary {
		t.Errorf("token = %q, want %q (trimmed)", got, tokenCanary)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the token file is still there after reading (Lstat: %v)", err)
	}
	if _, err := sandbox.ReadTokenFile(dir, "model.token"); err == nil {
		t.Error("a second read of the same token file succeeded")
	}
}

func TestReadTokenFileRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(tb testing.TB, dir string) // creates dir/model.token
		want  string                          // in the error
		root  bool                            // needs root to set up
	}{
		{"symbolic link", func(tb testing.TB, dir string) {
			target := filepath.Join(dir, "real")
			writeToken(tb, target, 0o600)
			mustDo(tb, os.Symlink(target, filepath.Join(dir, "model.token")))
		}, "symbolic link", false},
		{"mode 0644", func(tb testing.TB, dir string) {
			writeToken(tb, filepath.Join(dir, "model.token"), 0o644)
		}, "mode 0644, want 0600", false},
		{"mode 0400", func(tb testing.TB, dir string) {
			writeToken(tb, filepath.Join(dir, "model.token"), 0o400)
		}, "mode 0400, want 0600", false},
		{"setuid bit", func(tb testing.TB, dir string) {
			writeToken(tb, filepath.Join(dir, "model.token"), 0o600)
			mustDo(tb, os.Chmod(filepath.Join(dir, "model.token"), 0o600|os.ModeSetuid))
		}, "mode 4600, want 0600", false},
		{"wrong owner", func(tb testing.TB, dir string) {
			p := filepath.Join(dir, "model.token")
			writeToken(tb, p, 0o600)
			mustDo(tb, os.Chown(p, 12345, 12345))
		}, "owned by uid 12345", true},
		{"FIFO", func(tb testing.TB, dir string) {
			mustDo(tb, syscall.Mkfifo(filepath.Join(dir, "model.token"), 0o600))
		}, "not a regular file (a FIFO)", false},
		{"directory", func(tb testing.TB, dir string) {
			mustDo(tb, os.Mkdir(filepath.Join(dir, "model.token"), 0o700))
		}, "not a regular file (a directory)", false},
		{"empty", func(tb testing.TB, dir string) {
			mustDo(tb, os.WriteFile(filepath.Join(dir, "model.token"), []byte("\n"), 0o600))
		}, "empty", false},
		{"too large", func(tb testing.TB, dir string) {
			mustDo(tb, os.WriteFile(filepath.Join(dir, "model.token"), []byte(strings.Repeat(tokenCanary, 1000)), 0o600))
		}, "larger than 4096 bytes", false},
		{"not a token", func(tb testing.TB, dir string) {
			mustDo(tb, os.WriteFile(filepath.Join(dir, "model.token"), []byte(tokenCanary+"\nsecond line"), 0o600))
		}, "not printable ASCII", false},
		{"missing", func(tb testing.TB, dir string) {}, "no such file", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root {
				requireRoot(t, "to give the file another owner")
			}
			dir := t.TempDir()
			tt.setup(t, dir)
			tok, err := sandbox.ReadTokenFile(dir, "model.token")
			if err == nil {
				t.Fatalf("ReadTokenFile accepted it (token %d bytes)", len(tok))
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not say %q", msg, tt.want)
			}
			if !strings.Contains(msg, "model.token") {
				t.Errorf("error %q does not name the file", msg)
			}
			if strings.Contains(msg, "CANARY") {
				t.Errorf("error %q repeats the file's content", msg)
			}
		})
	}
}

func TestReadTokenFileRefusesAPathAsName(t *testing.T) {
	dir := t.TempDir()
	writeToken(t, filepath.Join(dir, "model.token"), 0o600)
	for _, name := range []string{"", ".", "..", "../model.token", "sub/model.token"} {
		if _, err := sandbox.ReadTokenFile(dir, name); err == nil {
			t.Errorf("ReadTokenFile(dir, %q) succeeded", name)
		}
	}
}

func writeToken(tb testing.TB, path string, mode os.FileMode) {
	tb.Helper()
	mustDo(tb, os.WriteFile(path, []byte(tokenCanary), 0o600))
	mustDo(tb, os.Chmod(path, mode))
}

func mustDo(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
