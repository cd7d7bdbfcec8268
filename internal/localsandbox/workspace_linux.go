package localsandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// workspaceSuffixBytes is the entropy in a workspace's name after the run
// id, so a retried launch of the same run never meets an old workspace.
const workspaceSuffixBytes = 6

// maxRunIDBytes bounds a run id used in a workspace name.
const maxRunIDBytes = 64

// checkRunID accepts run ids that are safe as one path component (the
// artifact stores' rule, belay.CheckArtifactRunID) and short enough to leave
// room for the socket path.
func checkRunID(id string) error {
	if err := belay.CheckArtifactRunID(id); err != nil {
		return fmt.Errorf("workspace name: %w", err)
	}
	if len(id) > maxRunIDBytes {
		return fmt.Errorf("workspace name: run id must be 1 to %d bytes, not %d", maxRunIDBytes, len(id))
	}
	return nil
}

// layoutWorkspace fills the fresh workspace ws (already holding api.sock)
// as package workspace describes: spec.json without tokens, and the
// folders tokens/ (with the three token files, 0600, created exclusively
// and never through a symbolic link), repo/, out/ and home/. Until it
// returns the workspace is belay's alone (0700), so nothing here races with
// the sandbox. With uid >= 0 (the sandbox runs as a uid of its own) the
// folders inside and the token files become uid:gid's, while ws, spec.json
// and api.sock stay belay's with group gid (0750, 0640, 0660): the sandbox
// can read the spec and connect to the socket but cannot rename, remove or
// replace anything beside its own folders, nor move ws (WorkRoot is
// belay's).
func layoutWorkspace(ws string, spec belay.SandboxSpec, tokens map[string]string, uid, gid int) error {
	dirs := []string{workspace.TokensDir, workspace.RepoDir, workspace.OutDir, workspace.HomeDir}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(ws, d), 0o700); err != nil {
			return fmt.Errorf("create workspace folder: %w", err)
		}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode spec.json: %w", err)
	}
	shared := -1 // the group of what stays belay's
	if uid >= 0 {
		shared = gid
	} else {
		gid = -1
	}
	if err := writeNewFile(filepath.Join(ws, workspace.SpecFile), b, 0o640, -1, shared); err != nil {
		return fmt.Errorf("write spec.json: %w", err)
	}
	for name, tok := range tokens {
		// The error names the file only: a token never reaches a message.
		if err := writeNewFile(filepath.Join(ws, workspace.TokensDir, name), []byte(tok), 0o600, uid, gid); err != nil {
			return fmt.Errorf("write token file %s: %w", name, err)
		}
	}
	if uid < 0 {
		return nil
	}
	for _, d := range dirs {
		if err := os.Lchown(filepath.Join(ws, d), uid, gid); err != nil {
			return fmt.Errorf("hand workspace folder %s to uid %d: %w", d, uid, err)
		}
	}
	for _, p := range []struct {
		name string
		mode os.FileMode
	}{{workspace.Socket, 0o660}, {".", 0o750}} {
		path := filepath.Join(ws, p.name)
		if err := os.Lchown(path, -1, gid); err != nil {
			return fmt.Errorf("open %s to gid %d: %w", p.name, gid, err)
		}
		if err := os.Chmod(path, p.mode); err != nil {
			return fmt.Errorf("open %s to gid %d: %w", p.name, gid, err)
		}
	}
	return nil
}

// writeNewFile creates path exclusively (never through a symbolic link)
// with mode perm, owned by uid and group gid where they are >= 0, and
// syncs it.
func writeNewFile(path string, data []byte, perm os.FileMode, uid, gid int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	err = f.Chmod(perm) // the umask applied at creation
	if err == nil && (uid >= 0 || gid >= 0) {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeTree removes dir and everything in it. Running as root that always
// works; running as the sandbox's own user, a folder the sandbox made
// unsearchable (mode 0000) first has its owner's permissions restored.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	restoreOwnerAccess(dir)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove workspace %s: %w", dir, err)
	}
	return nil
}

// restoreOwnerAccess gives the owner rwx on dir and every folder under it,
// never following a symbolic link: each folder is opened with O_PATH and
// O_NOFOLLOW and changed through its /proc/self/fd link.
func restoreOwnerAccess(dir string) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = os.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o700)
	unix.Close(fd)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			restoreOwnerAccess(filepath.Join(dir, e.Name()))
		}
	}
}
