package ocisandbox_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/hostids"
	"github.com/belay-dev/belay/internal/ocisandbox"
)

// idLines is what a sandbox prints of its own ids, then it waits: the
// uid and gid lines of /proc/self/status, and the owner of a file it
// wrote in its workspace.
const idLines = `grep -E '^(Uid|Gid):' /proc/self/status; echo x > /workspace/mine; stat -c 'owner %u:%g' /workspace/mine; echo ready; exec sleep 60`

// startHolding starts a sandbox that prints its ids and waits, and
// returns once it has printed them.
func startHolding(t *testing.T, l *ocisandbox.Launcher, runID string) (*ocisandbox.Sandbox, string) {
	t.Helper()
	s, err := l.StartCommand(context.Background(), runID, []string{"/bin/sh", "-c", idLines}, nil)
	if err != nil {
		t.Fatalf("start %s: %v", runID, err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(s.OutputTail(), "ready") {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s printed only %q", runID, s.OutputTail())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s, s.OutputTail()
}

// hostStatusIDs reads the four uids and gids of pid as the host sees them.
func hostStatusIDs(t *testing.T, pid int) (uids, gids string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uids = strings.Join(strings.Fields(v), " ")
		}
		if v, ok := strings.CutPrefix(line, "Gid:"); ok {
			gids = strings.Join(strings.Fields(v), " ")
		}
	}
	return uids, gids
}

func four(id int) string { return strings.TrimSpace(strings.Repeat(strconv.Itoa(id)+" ", 4)) }

// TestSandboxesRunAsTheirOwnHostIDs runs two sandboxes at once from two
// launchers (as two belay serve on one host, each with its own state
// folder, on the default range): inside, each entry is the profile's
// user, 10001; on the host each runs as, and writes files as, host ids of
// its own from the OCI launcher's range, never the other's, never 10001.
// Before user namespaces every OCI sandbox ran as host uid 10001.
func TestSandboxesRunAsTheirOwnHostIDs(t *testing.T) {
	one := newLauncher(t, nil)
	two := newLauncher(t, nil)
	p := hardening.Sandbox
	var seen []int
	for i, l := range []*ocisandbox.Launcher{one, two} {
		s, out := startHolding(t, l, fmt.Sprintf("run_ids%d", i))
		if !strings.Contains(out, "Uid:\t"+strings.ReplaceAll(four(p.UID), " ", "\t")) || !strings.Contains(out, "Gid:\t"+strings.ReplaceAll(four(p.GID), " ", "\t")) {
			t.Errorf("sandbox %d sees its ids as %q; want every uid %d and gid %d", i, out, p.UID, p.GID)
		}
		if !strings.Contains(out, fmt.Sprintf("owner %d:%d", p.UID, p.GID)) {
			t.Errorf("sandbox %d sees its own file as %q; want %d:%d", i, out, p.UID, p.GID)
		}
		ids := s.HostIDs()
		last := ocisandbox.DefaultFirstHostID + 2*ocisandbox.DefaultHostIDSlots - 1
		if ids.UID < ocisandbox.DefaultFirstHostID || ids.UID > last || ids.GID < ocisandbox.DefaultFirstHostID || ids.GID > last {
			t.Errorf("sandbox %d has host ids %+v; want ids of the default range %d–%d", i, ids, ocisandbox.DefaultFirstHostID, last)
		}
		pid, err := s.PID()
		if err != nil {
			t.Fatal(err)
		}
		uids, gids := hostStatusIDs(t, pid)
		if uids != four(ids.UID) || gids != four(ids.GID) {
			t.Errorf("the host sees sandbox %d's entry (pid %d) as uids %q gids %q; want %d and %d", i, pid, uids, gids, ids.UID, ids.GID)
		}
		fi, err := os.Stat(filepath.Join(s.Workspace(), "mine"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != ids.UID || int(st.Gid) != ids.GID {
			t.Errorf("sandbox %d's file is %d:%d on the host; want its host ids %d:%d", i, st.Uid, st.Gid, ids.UID, ids.GID)
		}
		seen = append(seen, ids.RootUID, ids.UID, ids.RootGID, ids.GID)
	}
	for i := 0; i < 2; i++ {
		for j := 0; j < 2; j++ {
			if seen[i] == seen[4+j] || seen[2+i] == seen[6+j] {
				t.Errorf("the two sandboxes share a host id: %v", seen)
			}
		}
	}
}

// freeHostRange picks the first of slots blocks of two host ids for a
// test that needs ids no other test uses at the same time: a random range
// well above the default one. Its lease files go with the test.
func freeHostRange(t *testing.T, slots int) int {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	first := 1900000000 + 2*int(binary.LittleEndian.Uint32(b[:])%100000)
	t.Cleanup(func() {
		for id := first; id < first+2*slots; id++ {
			for _, kind := range []string{"uid-", "gid-"} {
				_ = os.Remove(filepath.Join(hostids.DefaultDir, kind+strconv.Itoa(id)))
			}
		}
	})
	return first
}

// TestHostIDsOwningAProcessAreSkipped leaves a process running as a host
// id of the range's first block (as other software, or a sandbox process
// that outlived its launcher, might): the launcher hands out the next
// block while it lives, and the first again once it is gone and the
// sandbox before has ended.
func TestHostIDsOwningAProcessAreSkipped(t *testing.T) {
	for _, tt := range []struct {
		name     string
		uid, gid func(first int) int
	}{
		{"user uid", func(first int) int { return first + 1 }, func(int) int { return 65534 }},
		{"root gid", func(int) int { return 65534 }, func(first int) int { return first }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			first := freeHostRange(t, 2)
			l := newLauncherWith(t, func(c *ocisandbox.Config) { c.FirstHostID, c.HostIDSlots = first, 2 })
			left := exec.Command("/bin/sleep", "3600")
			left.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
				Uid: uint32(tt.uid(first)), Gid: uint32(tt.gid(first)), Groups: []uint32{}}}
			if err := left.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = left.Process.Kill(); _ = left.Wait() }()

			s, _ := startHolding(t, l, "run_skip")
			if ids := s.HostIDs(); ids.RootUID != first+2 || ids.UID != first+3 || ids.RootGID != first+2 || ids.GID != first+3 {
				t.Errorf("with a process of %s %d left, the sandbox got host ids %+v; want the second block from %d", tt.name, tt.uid(first), ids, first+2)
			}
			if err := s.Cleanup(); err != nil {
				t.Fatal(err)
			}
			_ = left.Process.Kill()
			_ = left.Wait()
			again, _ := startHolding(t, l, "run_again")
			if ids := again.HostIDs(); ids.RootUID != first || ids.UID != first+1 {
				t.Errorf("once the process was gone the sandbox got host ids %+v; want the first block from %d", ids, first)
			}
		})
	}
}

// TestHostIDsAreLeasedUntilCleanup holds the only block of a range with
// one launcher's sandbox: a second launcher cannot start one and says
// why; once the first sandbox is cleaned up (its processes gone, its
// folder removed), its lease files are empty and the second launcher gets
// the same ids.
func TestHostIDsAreLeasedUntilCleanup(t *testing.T) {
	first := freeHostRange(t, 1)
	narrow := func(c *ocisandbox.Config) { c.FirstHostID, c.HostIDSlots = first, 1 }
	one, two := newLauncherWith(t, narrow), newLauncherWith(t, narrow)
	s, _ := startHolding(t, one, "run_only")
	if _, err := two.StartCommand(context.Background(), "run_extra", []string{"/bin/true"}, nil); err == nil ||
		!strings.Contains(err.Error(), "in use: 1 leased by running sandboxes") {
		t.Errorf("a second launcher's sandbox with the only block held: err = %v; want it refused as leased", err)
	}
	lease := filepath.Join(hostids.DefaultDir, "uid-"+strconv.Itoa(first+1))
	if b, err := os.ReadFile(lease); err != nil || strings.TrimSpace(string(b)) != s.Workspace() {
		t.Errorf("lease file %s holds %q (%v); want the workspace %s", lease, b, err, s.Workspace())
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{first, first + 1} {
		for _, kind := range []string{"uid-", "gid-"} {
			if b, err := os.ReadFile(filepath.Join(hostids.DefaultDir, kind+strconv.Itoa(id))); err != nil || len(b) != 0 {
				t.Errorf("after Cleanup the lease file %s%d holds %q (%v); want it empty", kind, id, b, err)
			}
		}
	}
	again, _ := startHolding(t, two, "run_extra")
	if ids := again.HostIDs(); ids.RootUID != first || ids.UID != first+1 {
		t.Errorf("after the first sandbox's cleanup the other launcher's got host ids %+v; want the freed block from %d", ids, first)
	}
}
