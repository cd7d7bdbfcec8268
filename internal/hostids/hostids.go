// Package hostids leases host user and group ids to sandboxes, host-wide:
// no two sandboxes on one machine, of one belay or of two, run as the same
// host id at the same time, and an id that still owns a process, or files
// in a workspace left behind, is never handed out. Both launchers lease
// here: the process launcher (internal/localsandbox) the uid and gid a
// sandbox runs as; the OCI launcher (internal/ocisandbox) the host ids its
// user namespace maps the container's root and user to.
//
// A lease is one flock'd file per id under Dir (uid-N, gid-N). A lock is
// the kernel's: it goes when its holder closes it or dies, so a belay that
// crashed frees its ids without anyone cleaning up. Each file records the
// workspace the id was leased for until the workspace is gone, so a
// launcher that died with a workspace still on disk keeps its ids out of
// use even after the kernel dropped its lock.
package hostids

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

// DefaultDir is where every launcher on the host leases sandbox ids. The
// folder is root's alone (0700); only root drops sandboxes to other ids,
// so only root leases.
const DefaultDir = "/run/belay/uids"

// maxRecord bounds what a lease file holds: a workspace path.
const maxRecord = 4 << 10

// Range is the ids a launcher hands out: Slots leases, each of Width
// consecutive uids from FirstUID + slot*Width and as many gids from
// FirstGID + slot*Width.
type Range struct {
	FirstUID, FirstGID int
	// Slots is how many sandboxes can hold a lease at once.
	Slots int
	// Width is how many ids one lease holds; 0 means 1.
	Width int
}

func (r Range) width() int { return max(r.Width, 1) }

// Check says what is wrong with r, if anything.
func (r Range) Check() error {
	switch {
	case r.FirstUID <= 0 || r.FirstGID <= 0 || r.Slots <= 0 || r.Width < 0:
		return fmt.Errorf("host ids: uids from %d, gids from %d, %d leases of %d: every number must be positive", r.FirstUID, r.FirstGID, r.Slots, r.width())
	case uint64(r.FirstUID)+uint64(r.Slots*r.width()) > 1<<31 || uint64(r.FirstGID)+uint64(r.Slots*r.width()) > 1<<31:
		return fmt.Errorf("host ids: uids from %d and gids from %d plus %d run past the largest id", r.FirstUID, r.FirstGID, r.Slots*r.width())
	}
	return nil
}

// Lease is the host-wide hold on one sandbox's ids: Width uids from UID
// and Width gids from GID.
type Lease struct {
	UID, GID int
	Width    int
	files    []*os.File
	// recorded says the files name this lease's workspace; until then
	// they keep what the previous holder recorded.
	recorded bool
}

// Release drops the locks, emptying the files' record first if it is
// this lease's. Call it only once the sandbox's processes are reaped and
// its workspace removed. It is idempotent.
func (le *Lease) Release() {
	for _, f := range le.files {
		if le.recorded {
			_ = f.Truncate(0)
		}
		_ = f.Close() // closing the only descriptor drops the flock
	}
	le.files = nil
}

// PrepareDir creates dir (and its parents) when absent and checks that it
// and every folder above it is a directory of root's that nobody else can
// write: a lease file that someone could remove and recreate would let
// two holders lock "the same" id.
func PrepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the id lease folder %s: %w", dir, err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("id lease folder: %w", err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("the id lease folder %s is unsafe: %s (%v, owner uid %d) must be a directory of root's that only root can write",
				dir, d, fi.Mode(), st.Uid)
		}
		if d == dir && fi.Mode().Perm() != 0o700 {
			if err := os.Chmod(d, 0o700); err != nil {
				return fmt.Errorf("restrict the id lease folder %s: %w", dir, err)
			}
		}
		if d == "/" {
			return nil
		}
	}
}

// Acquire leases, in dir, the first slot of r whose ids no sandbox on the
// host holds, own no process on the host, and whose last workspace is
// gone, and records ws in its lease files. The error says why every slot
// was refused.
func Acquire(dir string, r Range, ws string) (*Lease, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	busy, err := InUse()
	if err != nil {
		return nil, err
	}
	w := r.width()
	var leased, owning, leftBehind int
	var example string
	for slot := 0; slot < r.Slots; slot++ {
		le := &Lease{UID: r.FirstUID + slot*w, GID: r.FirstGID + slot*w, Width: w}
		why, err := le.lock(dir, ws)
		if err != nil {
			le.Release()
			return nil, err
		}
		switch {
		case why == "leased":
			le.Release()
			leased++
			continue
		case busy.owns(le):
			le.Release()
			owning++
			continue
		case why != "":
			le.Release()
			leftBehind++
			example = why
			continue
		}
		// Look again now that the ids are ours: a process started under
		// them since the first look means someone uses them without a
		// lease.
		if again, err := InUse(); err != nil {
			le.Release()
			return nil, err
		} else if again.owns(le) {
			le.Release()
			owning++
			continue
		}
		if err := le.record(ws); err != nil {
			le.Release()
			return nil, err
		}
		return le, nil
	}
	what := "sandbox uids"
	if w > 1 {
		what = fmt.Sprintf("sandbox id blocks (of %d ids each)", w)
	}
	msg := fmt.Sprintf("all %d %s from %d are in use: %d leased by running sandboxes on this host, %d owning a process, %d owning a workspace left behind",
		r.Slots, what, r.FirstUID, leased, owning, leftBehind)
	if example != "" {
		msg += " (for example " + example + "; a new launcher on that WorkRoot removes it)"
	}
	return nil, errors.New(msg + "; wait for a run to end, or raise the count")
}

// lockNames are the lease's files: one per uid and one per gid.
func (le *Lease) lockNames() []string {
	var names []string
	for i := 0; i < le.Width; i++ {
		names = append(names, "uid-"+strconv.Itoa(le.UID+i))
	}
	for i := 0; i < le.Width; i++ {
		names = append(names, "gid-"+strconv.Itoa(le.GID+i))
	}
	return names
}

// lock takes every lease file of le. It returns "leased" when another
// holder has any, a description when the last holder's workspace is still
// there, "" when all are now this lease's.
func (le *Lease) lock(dir, ws string) (string, error) {
	for _, name := range le.lockNames() {
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return "", fmt.Errorf("open id lease %s: %w", path, err)
		}
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			f.Close()
			return "", fmt.Errorf("id lease %s is not a regular file", path)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return "leased", nil
			}
			return "", fmt.Errorf("lock id lease %s: %w", path, err)
		}
		le.files = append(le.files, f)
		b := make([]byte, maxRecord)
		n, err := f.ReadAt(b, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read id lease %s: %w", path, err)
		}
		if prev := string(bytes.TrimSpace(b[:n])); prev != "" && prev != ws {
			if _, err := os.Lstat(prev); err == nil {
				return strings.Replace(name, "-", " ", 1) + " in " + prev, nil
			}
		}
	}
	return "", nil
}

// record writes ws into every lease file, durably enough for this boot
// (DefaultDir is in /run, which does not outlive one).
func (le *Lease) record(ws string) error {
	for _, f := range le.files {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("record id lease: %w", err)
		}
		le.recorded = true
		if _, err := f.WriteAt([]byte(ws+"\n"), 0); err != nil {
			return fmt.Errorf("record id lease: %w", err)
		}
	}
	return nil
}

// IDs is the uids and gids processes on the host run as.
type IDs struct {
	UIDs, GIDs map[int]bool
}

// owns reports whether any id of le runs a process.
func (s IDs) owns(le *Lease) bool {
	for i := 0; i < le.Width; i++ {
		if s.UIDs[le.UID+i] || s.GIDs[le.GID+i] {
			return true
		}
	}
	return false
}

// InUse reads every process's real, effective, saved and file-system
// uids and gids from /proc/<pid>/status. A process that ends meanwhile is
// simply not counted.
func InUse() (IDs, error) {
	set := IDs{UIDs: map[int]bool{}, GIDs: map[int]bool{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return set, fmt.Errorf("list processes: %w", err)
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
				dst = set.UIDs
			case bytes.HasPrefix(line, []byte("Gid:")):
				dst = set.GIDs
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
