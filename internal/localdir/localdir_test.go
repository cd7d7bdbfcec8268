package localdir_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/artifacttest"
	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localdir"
)

func open(tb testing.TB, dir string) *localdir.Store {
	tb.Helper()
	s, err := localdir.New(dir)
	if err != nil {
		tb.Fatalf("localdir.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	artifacttest.Run(t, func(tb testing.TB) belay.ArtifactStore {
		return open(tb, filepath.Join(tb.TempDir(), "artifacts"))
	})
}

func TestModes(t *testing.T) {
	// A permissive umask must not loosen what the store creates.
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })

	dir := filepath.Join(t.TempDir(), "data", "artifacts")
	s := open(t, dir)
	artifacttest.MustPut(t, s, "run_modes", "result.json", []byte("{}"))
	artifacttest.MustPut(t, s, "run_modes", "result.json", []byte(`{"replaced":true}`))

	tests := []struct {
		path string
		want fs.FileMode
	}{
		{dir, fs.ModeDir | 0o700},
		{filepath.Join(dir, "run_modes"), fs.ModeDir | 0o700},
		{filepath.Join(dir, "run_modes", "result.json"), 0o600},
	}
	for _, tt := range tests {
		fi, err := os.Lstat(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != tt.want {
			t.Errorf("%s has mode %v, want %v", tt.path, fi.Mode(), tt.want)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, "run_modes"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("run folder holds %d entries after two puts, want 1 (no temporary file left)", len(entries))
	}
}

func TestNewTightensExistingFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	open(t, dir)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("artifacts folder mode %v after New, want 0700", fi.Mode().Perm())
	}
}

func TestNewRefusesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "artifacts")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := localdir.New(path); err == nil {
		t.Fatal("New on a regular file succeeded, want an error")
	}
	if _, err := localdir.New(""); err == nil {
		t.Fatal("New with an empty folder succeeded, want an error")
	}
}

// A crash between writing the temporary file and renaming it leaves a
// dot-file behind; it must never surface as an artifact.
func TestLeftoverTemporaryFileIgnored(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts")
	s := open(t, dir)
	artifacttest.MustPut(t, s, "run_crash", "result.json", []byte("{}"))
	leftover := filepath.Join(dir, "run_crash", ".tmp-patch.diff-999-1")
	if err := os.WriteFile(leftover, []byte("half a pa"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := artifacttest.MustList(t, s, "run_crash")
	if len(got) != 1 || got[0].Name != "result.json" {
		t.Fatalf("ListArtifacts = %v, want only result.json", got)
	}
	if _, err := s.GetArtifact(t.Context(), "run_crash", "patch.diff"); belay.ErrorCode(err) != belay.CodeNotFound {
		t.Fatalf("GetArtifact of a half-written artifact: %v, want not_found", err)
	}
}

// A symlink planted in the folder must not lead outside it.
func TestSymlinkOutsideRefused(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "artifacts")
	s := open(t, dir)
	secret := filepath.Join(base, "outside.txt")
	if err := os.WriteFile(secret, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "run_link"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "run_link", "result.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base, filepath.Join(dir, "run_dirlink")); err != nil {
		t.Fatal(err)
	}

	if got, err := s.GetArtifact(t.Context(), "run_link", "result.json"); err == nil {
		t.Fatalf("GetArtifact through a symlink out of the folder returned %q", got)
	}
	if got, err := s.GetArtifact(t.Context(), "run_dirlink", "outside.txt"); err == nil {
		t.Fatalf("GetArtifact through a linked run folder returned %q", got)
	}
	if err := s.PutArtifact(t.Context(), "run_dirlink", "planted", []byte("x")); err == nil {
		t.Fatal("PutArtifact through a linked run folder succeeded")
	}
	if _, err := os.Stat(filepath.Join(base, "planted")); err == nil {
		t.Fatal("PutArtifact wrote outside the artifacts folder")
	}
	if list, err := s.ListArtifacts(t.Context(), "run_link"); err != nil || len(list) != 0 {
		t.Fatalf("ListArtifacts of a folder holding only a symlink = %v, %v; want empty", list, err)
	}
}

func TestSourceConformance(t *testing.T) {
	artifacttest.RunSource(t, func(tb testing.TB) belay.SourceStore {
		return open(tb, filepath.Join(tb.TempDir(), "artifacts"))
	})
}
