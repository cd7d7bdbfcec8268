//go:build unix

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// repoFS opens files of the repository for the tools. Every open walks the
// path one component at a time with openat and O_NOFOLLOW from a descriptor
// of the repository's root, so a symbolic link anywhere on the path is
// refused, never followed, and nothing a concurrent process does to the tree
// between checks can redirect the open: there is no check-then-use gap.
//
// os.Root would confine opens to the tree as well, but it follows symbolic
// links that stay inside it, and a link from an allowed path to one that is
// not allowed (or into .git) stays inside. Listing and searching, which never
// write, use os.Root (see Tools).
type repoFS struct {
	dir string
	fd  int
}

func openRepoFS(dir string) (*repoFS, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open repository %s: %w", dir, err)
	}
	return &repoFS{dir: dir, fd: fd}, nil
}

func (r *repoFS) Close() error { return unix.Close(r.fd) }

// pathError is a refusal the model reads: it names the path the model gave
// and what was wrong in plain words.
type pathError struct {
	path string
	msg  string
}

func (e *pathError) Error() string { return fmt.Sprintf("%q: %s", e.path, e.msg) }

// openDir walks the directories of rel (all but its last component) and
// returns a descriptor of the last one's parent. With create, missing
// directories are made (mode 0755).
func (r *repoFS) openDir(rel string, create bool) (int, string, error) {
	parts := strings.Split(rel, "/")
	fd, err := unix.Dup(r.fd)
	if err != nil {
		return -1, "", fmt.Errorf("dup repository descriptor: %w", err)
	}
	for i, p := range parts[:len(parts)-1] {
		sofar := strings.Join(parts[:i+1], "/")
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, p, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		if errors.Is(err, unix.ENOTDIR) && isSymlinkAt(fd, p) {
			// With O_DIRECTORY, Linux reports a symbolic link as ENOTDIR.
			err = unix.ELOOP
		}
		if err != nil {
			unix.Close(fd)
			return -1, "", componentError(rel, sofar, err, true)
		}
		unix.Close(fd)
		fd = next
	}
	return fd, parts[len(parts)-1], nil
}

func isSymlinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && uint32(st.Mode)&unix.S_IFMT == unix.S_IFLNK
}

// componentError turns an openat failure on one component into a refusal a
// model can act on.
func componentError(rel, comp string, err error, dir bool) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return &pathError{rel, fmt.Sprintf("refused: %s is a symbolic link, and the tools never follow symbolic links", comp)}
	case errors.Is(err, unix.ENOTDIR) && dir:
		return &pathError{rel, fmt.Sprintf("%s is not a directory", comp)}
	case errors.Is(err, unix.ENOENT):
		return &pathError{rel, "no such file or directory"}
	case errors.Is(err, unix.EISDIR):
		return &pathError{rel, "is a directory"}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return &pathError{rel, "permission denied"}
	}
	return fmt.Errorf("%q: %w", rel, err)
}

// readFile reads up to max bytes of the regular file at rel and reports its
// full size.
func (r *repoFS) readFile(rel string, max int) ([]byte, int64, error) {
	dfd, base, err := r.openDir(rel, false)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, componentError(rel, rel, err, false)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("%q: stat: %w", rel, err)
	}
	if fi.IsDir() {
		return nil, 0, &pathError{rel, "is a directory; use list_files to see what it holds"}
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, &pathError{rel, "refused: not a regular file"}
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)))
	if err != nil {
		return nil, 0, fmt.Errorf("%q: read: %w", rel, err)
	}
	return b, fi.Size(), nil
}

// writeFile replaces (or creates, with mode 0644) the regular file at rel
// with data, making missing parent directories. It refuses a path through a
// symbolic link, a file that is not regular, and a file with more than one
// hard link (a hard link could make the write land in a file elsewhere).
// Those checks are made on the opened descriptor before anything is
// truncated.
func (r *repoFS) writeFile(rel string, data []byte) error {
	dfd, base, err := r.openDir(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0o644)
	if err != nil {
		return componentError(rel, rel, err, false)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%q: fstat: %w", rel, err)
	}
	if uint32(st.Mode)&unix.S_IFMT != unix.S_IFREG {
		return &pathError{rel, "refused: not a regular file"}
	}
	if st.Nlink > 1 {
		return &pathError{rel, fmt.Sprintf("refused: the file has %d hard links, so the write could change a file elsewhere", st.Nlink)}
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("%q: truncate: %w", rel, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("%q: write: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%q: close: %w", rel, err)
	}
	return nil
}

// lstat reports the file at rel without following a final symbolic link,
// walking its directories like every other open.
func (r *repoFS) lstat(rel string) (fs.FileMode, error) {
	dfd, base, err := r.openDir(rel, false)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, componentError(rel, rel, err, false)
	}
	switch uint32(st.Mode) & unix.S_IFMT {
	case unix.S_IFDIR:
		return fs.ModeDir, nil
	case unix.S_IFREG:
		return 0, nil
	case unix.S_IFLNK:
		return fs.ModeSymlink, nil
	}
	return fs.ModeIrregular, nil
}

// remove removes the file (or empty folder) at rel without following a
// symbolic link on its path; one that does not exist is no error.
func (r *repoFS) remove(rel string) error {
	dfd, base, err := r.openDir(rel, false)
	if err != nil {
		var pe *pathError
		if errors.As(err, &pe) && pe.msg == "no such file or directory" {
			return nil
		}
		return err
	}
	defer unix.Close(dfd)
	err = unix.Unlinkat(dfd, base, 0)
	if errors.Is(err, unix.EISDIR) {
		err = unix.Unlinkat(dfd, base, unix.AT_REMOVEDIR)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return componentError(rel, rel, err, false)
	}
	return nil
}

// writeFileMode is writeFile, then the file's permission bits set to perm
// on the same descriptor walk (a restored executable file).
func (r *repoFS) writeFileMode(rel string, data []byte, perm os.FileMode) error {
	if err := r.writeFile(rel, data); err != nil {
		return err
	}
	dfd, base, err := r.openDir(rel, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return componentError(rel, rel, err, false)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, uint32(perm.Perm())); err != nil {
		return fmt.Errorf("%q: chmod: %w", rel, err)
	}
	return nil
}
