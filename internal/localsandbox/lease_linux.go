package localsandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultLeaseDir is where every launcher on the host leases sandbox uids
// and gids: one lock file per id (uid-N, gid-N), held with flock for as long
// as a sandbox runs under that id and its files exist. A lock is the
// kernel's: it goes when its holder closes it or dies, so a belay that
// crashed frees its ids without anyone cleaning up, and two belay
// processes (or two launchers in one) never hand the same id to two
// sandboxes at once. The folder is root's alone (0700); only root drops
// sandboxes to other uids, so only root leases.
const DefaultLeaseDir = "/run/belay/uids"

// maxLeaseRecord bounds what a lease file holds: a workspace path.
const maxLeaseRecord = 4 << 10

// idLease is the host-wide hold on one sandbox's uid and gid. Each lease
// file records the workspace the id was leased for until the workspace is
// gone, so a launcher that died with a workspace still on disk keeps its
// id out of use even after the kernel dropped its lock.
type idLease struct {
	uid, gid int
	files    []*os.File
	// recorded says the files name this lease's workspace; until then
	// they keep what the previous holder recorded.
	recorded bool
}

// release drops the locks, emptying the files' record first if it is this
// lease's. Call it only once the sandbox's processes are reaped and its
// workspace removed.
func (le *idLease) release() {
	for _, f := range le.files {
		if le.recorded {
			_ = f.Truncate(0)
		}
		_ = f.Close() // closing the only descriptor drops the flock
	}
	le.files = nil
}

// prepareLeaseDir creates dir (and its parent) when absent and checks that
// it is a directory of root's that nobody else can write: a lease file that
// someone could remove and recreate would let two holders lock "the same"
// id.
func prepareLeaseDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("localsandbox: create the uid lease folder %s: %w", dir, err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("localsandbox: uid lease folder: %w", err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("localsandbox: the uid lease folder %s is unsafe: %s (%v, owner uid %d) must be a directory of root's that only root can write",
				dir, d, fi.Mode(), st.Uid)
		}
		if d == dir && fi.Mode().Perm() != 0o700 {
			if err := os.Chmod(d, 0o700); err != nil {
				return fmt.Errorf("localsandbox: restrict the uid lease folder %s: %w", dir, err)
			}
		}
		if d == "/" {
			return nil
		}
	}
}

// acquireIDs leases the first uid (and the gid at the same offset) of the
// launcher's range that no sandbox on the host holds, that owns no process
// on the host, and whose last workspace is gone, and records ws in its
// lease files. The error says why every id was refused.
func (l *Launcher) acquireIDs(ws string) (*idLease, error) {
	busy, err := idsInUse()
	if err != nil {
		return nil, err
	}
	var leased, owning, leftBehind int
	var example string
	for off := 0; off < l.ids; off++ {
		uid, gid := l.uid+off, l.gid+off
		le := &idLease{uid: uid, gid: gid}
		why, err := le.lock(l.leaseDir, ws)
		if err != nil {
			le.release()
			return nil, err
		}
		switch {
		case why == "leased":
			le.release()
			leased++
			continue
		case busy.uids[uid] || busy.gids[gid]:
			le.release()
			owning++
			continue
		case why != "":
			le.release()
			leftBehind++
			example = why
			continue
		}
		// Look again now that the ids are ours: a process started under
		// them since the first look means someone uses them without a
		// lease.
		if again, err := idsInUse(); err != nil {
			le.release()
			return nil, err
		} else if again.uids[uid] || again.gids[gid] {
			le.release()
			owning++
			continue
		}
		if err := le.record(ws); err != nil {
			le.release()
			return nil, err
		}
		return le, nil
	}
	msg := fmt.Sprintf("all %d sandbox uids from %d are in use: %d leased by running sandboxes on this host, %d owning a process, %d owning a workspace left behind",
		l.ids, l.uid, leased, owning, leftBehind)
	if example != "" {
		msg += " (for example " + example + "; a new launcher on that WorkRoot removes it)"
	}
	return nil, errors.New(msg + "; wait for a run to end, or raise the count")
}

// lock takes the uid's and the gid's lease files. It returns "leased" when
// another holder has either, a description when the last holder's
// workspace is still there, "" when both are now this lease's.
func (le *idLease) lock(dir, ws string) (string, error) {
	for _, name := range []string{"uid-" + strconv.Itoa(le.uid), "gid-" + strconv.Itoa(le.gid)} {
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return "", fmt.Errorf("localsandbox: open uid lease %s: %w", path, err)
		}
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return "", fmt.Errorf("localsandbox: uid lease %s is not a regular file", path)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return "leased", nil
			}
			return "", fmt.Errorf("localsandbox: lock uid lease %s: %w", path, err)
		}
		le.files = append(le.files, f)
		b := make([]byte, maxLeaseRecord)
		n, err := f.ReadAt(b, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("localsandbox: read uid lease %s: %w", path, err)
		}
		if prev := string(bytes.TrimSpace(b[:n])); prev != "" && prev != ws {
			if _, err := os.Lstat(prev); err == nil {
				return strings.Replace(name, "-", " ", 1) + " in " + prev, nil
			}
		}
	}
	return "", nil
}

// record writes ws into both lease files, durably enough for this boot
// (the folder is in /run, which does not outlive one).
func (le *idLease) record(ws string) error {
	for _, f := range le.files {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("localsandbox: record uid lease: %w", err)
		}
		le.recorded = true
		if _, err := f.WriteAt([]byte(ws+"\n"), 0); err != nil {
			return fmt.Errorf("localsandbox: record uid lease: %w", err)
		}
	}
	return nil
}

// idSet is the uids and gids processes on the host run as.
type idSet struct {
	uids, gids map[int]bool
}

// idsInUse reads every process's real, effective, saved and file-system
// uids and gids from /proc/<pid>/status. A process that ends meanwhile is
// simply not counted.
func idsInUse() (idSet, error) {
	set := idSet{uids: map[int]bool{}, gids: map[int]bool{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return set, fmt.Errorf("localsandbox: list processes: %w", err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for line := range bytes.Lines(b) {
			var dst map[int]bool
			switch {
			case bytes.HasPrefix(line, []byte("Uid:")):
				dst = set.uids
			case bytes.HasPrefix(line, []byte("Gid:")):
				dst = set.gids
			default:
				continue
			}
			for _, f := range strings.Fields(string(line[4:])) {
				if id, err := strconv.Atoi(f); err == nil {
					dst[id] = true
				}
			}
		}
	}
	return set, nil
}
