package localsandbox

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// idRange is the sandbox uids (or gids) [first, first+count).
type idRange struct{ first, count int }

func (r idRange) has(id uint32) bool {
	return int64(id) >= int64(r.first) && int64(id) < int64(r.first)+int64(r.count)
}

// sandboxWritable says why a sandbox user could write dir, or "" when none
// can: the directory is writable by every user (sticky or not), belongs to
// a sandbox uid (an owner may always chmod), is group-writable by a
// sandbox gid, or its access ACL grants a sandbox uid or gid write.
func sandboxWritable(dir string, fi os.FileInfo, uids, gids idRange) string {
	st := fi.Sys().(*syscall.Stat_t)
	perm := fi.Mode().Perm()
	switch {
	case perm&0o002 != 0 && fi.Mode()&os.ModeSticky != 0:
		return "is writable by every user (the sticky bit only keeps them from removing each other's files)"
	case perm&0o002 != 0:
		return "is writable by every user"
	case uids.has(st.Uid):
		return fmt.Sprintf("belongs to uid %d, a sandbox uid", st.Uid)
	case perm&0o020 != 0 && gids.has(st.Gid):
		return fmt.Sprintf("is writable by its group %d, a sandbox gid", st.Gid)
	}
	return aclWritable(dir, uids, gids)
}

// The tags and the write bit of a POSIX access ACL entry (acl(5)), as Linux
// stores them in the system.posix_acl_access attribute.
const (
	aclVersion  = 2
	aclUser     = 0x02
	aclGroup    = 0x08
	aclMask     = 0x10
	aclPermW    = 0x02
	aclEntrySz  = 8
	aclHeaderSz = 4
)

// aclWritable says whether dir's access ACL grants write to a sandbox uid
// or gid through a named entry (the owner, group and other entries are the
// mode bits checked before).
func aclWritable(dir string, uids, gids idRange) string {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(dir, "system.posix_acl_access", buf)
	if err != nil || n < aclHeaderSz || binary.LittleEndian.Uint32(buf) != aclVersion {
		// No ACL (ENODATA), no ACL support, or a format this does not
		// know; the mode bits then tell the whole story.
		return ""
	}
	maskW := true
	type entry struct {
		tag, perm uint16
		id        uint32
	}
	var named []entry
	for off := aclHeaderSz; off+aclEntrySz <= n; off += aclEntrySz {
		e := entry{binary.LittleEndian.Uint16(buf[off:]), binary.LittleEndian.Uint16(buf[off+2:]), binary.LittleEndian.Uint32(buf[off+4:])}
		switch e.tag {
		case aclMask:
			maskW = e.perm&aclPermW != 0
		case aclUser, aclGroup:
			named = append(named, e)
		}
	}
	for _, e := range named {
		switch {
		case !maskW || e.perm&aclPermW == 0:
		case e.tag == aclUser && uids.has(e.id):
			return fmt.Sprintf("grants write to uid %d, a sandbox uid, in its ACL", e.id)
		case e.tag == aclGroup && gids.has(e.id):
			return fmt.Sprintf("grants write to gid %d, a sandbox gid, in its ACL", e.id)
		}
	}
	return ""
}

// checkAncestors refuses a WorkRoot that the sandbox uids cannot reach, or
// with a folder above it (or WorkRoot itself) that a sandbox user could
// write. pytest, like other tools, reads its configuration and conftest.py
// from every folder above the repository it runs in: one sandbox that
// could write such a folder would run its code in the checks of every
// later run, under that run's uid.
//
// Without root the sandboxes run as belay's own user, which can write its
// own folders anyway; only folders every user can write are refused (the
// sandbox entry refuses them too).
func (l *Launcher) checkAncestors(root string) error {
	uids, gids := idRange{l.uid, l.ids}, idRange{l.gid, l.ids}
	if !l.asRoot {
		uids, gids = idRange{}, idRange{}
	}
	for d := root; ; d = parentDir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("localsandbox: WorkRoot: %w", err)
		}
		if l.asRoot && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("localsandbox: the sandbox uids cannot reach WorkRoot %s: directory %s (mode %04o) is not searchable by others; allow search (chmod o+x %s) or choose a WorkRoot outside it",
				root, d, fi.Mode().Perm(), d)
		}
		if why := sandboxWritable(d, fi, uids, gids); why != "" {
			where := "its parent " + d
			if d == root {
				where = "it"
			}
			suggest := "whose every parent only root can write, such as " + DefaultRootWorkRoot
			if !l.asRoot {
				suggest = "in your own directories, outside " + os.TempDir()
			}
			return fmt.Errorf("localsandbox: refusing WorkRoot %s: %s %s, so a sandbox could leave files there (pytest.ini, conftest.py) that pytest reads in the checks of later runs; choose a WorkRoot (BELAY_SANDBOX_DIR, --sandbox-dir) %s",
				root, where, why, suggest)
		}
		if d == "/" {
			return nil
		}
	}
}

// DefaultRootWorkRoot is a WorkRoot that passes checkAncestors on an
// ordinary system: /var/lib and its parents are root's alone. belay serve
// uses it as root when no sandbox directory is configured.
const DefaultRootWorkRoot = "/var/lib/belay-sandboxes"

// parentDir is filepath.Dir for the absolute, clean paths used here.
func parentDir(d string) string {
	for i := len(d) - 1; i > 0; i-- {
		if d[i] == '/' {
			return d[:i]
		}
	}
	return "/"
}
