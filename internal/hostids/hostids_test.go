package hostids_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/hostids"
)

// The launchers' tests (internal/localsandbox, internal/ocisandbox) lease
// through real sandboxes, across processes; these hold the lease rules
// themselves, in a lease folder of the test's own.

func TestBlocksAreLeasedOnce(t *testing.T) {
	dir := t.TempDir()
	r := hostids.Range{FirstUID: 500000, FirstGID: 600000, Slots: 2, Width: 2}
	a, err := hostids.Acquire(dir, r, "/nonexistent/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := hostids.Acquire(dir, r, "/nonexistent/b")
	if err != nil {
		t.Fatal(err)
	}
	// A lease holds its locks through open files: one no longer reachable
	// is closed by the garbage collector, and its ids free again.
	defer b.Release()
	if a.UID != 500000 || a.GID != 600000 || b.UID != 500002 || b.GID != 600002 || a.Width != 2 {
		t.Errorf("leases %+v and %+v; want blocks of two from 500000:600000 and 500002:600002", a, b)
	}
	if _, err := hostids.Acquire(dir, r, "/nonexistent/c"); err == nil || !strings.Contains(err.Error(), "in use: 2 leased by running sandboxes") {
		t.Errorf("a third lease of two slots: err = %v; want both leased", err)
	}
	for _, name := range []string{"uid-500000", "uid-500001", "gid-600000", "gid-600001"} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != "/nonexistent/a\n" {
			t.Errorf("%s holds %q (%v); want the first lease's workspace", name, got, err)
		}
	}
	a.Release()
	a.Release() // idempotent
	if got, _ := os.ReadFile(filepath.Join(dir, "uid-500001")); len(got) != 0 {
		t.Errorf("after Release uid-500001 holds %q; want it empty", got)
	}
	c, err := hostids.Acquire(dir, r, "/nonexistent/c")
	if err != nil || c.UID != 500000 {
		t.Errorf("after Release: lease %+v, %v; want the freed block from 500000", c, err)
	}
}

// TestAnIDHeldAloneBlocksItsBlock: a lease of width 1 over an id of a
// wider block (another launcher's range overlapping) keeps that block out.
func TestAnIDHeldAloneBlocksItsBlock(t *testing.T) {
	dir := t.TempDir()
	single, err := hostids.Acquire(dir, hostids.Range{FirstUID: 700001, FirstGID: 700001, Slots: 1}, "/nonexistent/s")
	if err != nil {
		t.Fatal(err)
	}
	defer single.Release()
	le, err := hostids.Acquire(dir, hostids.Range{FirstUID: 700000, FirstGID: 700000, Slots: 2, Width: 2}, "/nonexistent/w")
	if err != nil || le.UID != 700002 {
		t.Errorf("lease %+v, %v; want the block from 700002: 700001 is held", le, err)
	}
}

func TestWorkspaceLeftBehindKeepsItsIDs(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	r := hostids.Range{FirstUID: 800000, FirstGID: 800000, Slots: 1, Width: 2}
	le, err := hostids.Acquire(dir, r, ws)
	if err != nil {
		t.Fatal(err)
	}
	// A holder that dies drops its locks but keeps its record: release,
	// then write the record back.
	b, _ := os.ReadFile(filepath.Join(dir, "uid-800001"))
	le.Release()
	if err := os.WriteFile(filepath.Join(dir, "uid-800001"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := hostids.Acquire(dir, r, "/nonexistent/next"); err == nil ||
		!strings.Contains(err.Error(), "1 owning a workspace left behind") || !strings.Contains(err.Error(), ws) {
		t.Errorf("err = %v; want the workspace left behind named", err)
	}
	if err := os.Remove(ws); err != nil {
		t.Fatal(err)
	}
	if le, err := hostids.Acquire(dir, r, "/nonexistent/next"); err != nil || le.UID != 800000 {
		t.Errorf("once the workspace is gone: lease %+v, %v; want 800000", le, err)
	}
}

func TestIDsOwningAProcessAreSkipped(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("starting a process as another uid needs root (CI runs the tests as root)")
		}
		t.Skip("starting a process as another uid needs root; run the test as root")
	}
	dir := t.TempDir()
	left := exec.Command("/bin/sleep", "3600")
	left.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 900001, Groups: []uint32{}}}
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = left.Process.Kill(); _ = left.Wait() }()
	r := hostids.Range{FirstUID: 900000, FirstGID: 900000, Slots: 2, Width: 2}
	le, err := hostids.Acquire(dir, r, "/nonexistent/a")
	if err != nil || le.UID != 900002 {
		t.Errorf("with a process of gid 900001: lease %+v, %v; want the block from 900002", le, err)
	}
	if _, err := hostids.Acquire(dir, hostids.Range{FirstUID: 900000, FirstGID: 900000, Slots: 1, Width: 2}, "/nonexistent/b"); err == nil ||
		!strings.Contains(err.Error(), "1 owning a process") {
		t.Errorf("the only block owning a process: err = %v; want it said", err)
	}
}

func TestRangeCheck(t *testing.T) {
	for _, r := range []hostids.Range{
		{},
		{FirstUID: 0, FirstGID: 1, Slots: 1},
		{FirstUID: 1, FirstGID: 1, Slots: 0},
		{FirstUID: 1, FirstGID: 1, Slots: 1, Width: -1},
		{FirstUID: 1<<31 - 2, FirstGID: 1, Slots: 2, Width: 2},
	} {
		if _, err := hostids.Acquire(t.TempDir(), r, "/x"); err == nil {
			t.Errorf("Acquire accepted %+v", r)
		}
	}
}
