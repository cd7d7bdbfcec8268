//go:build unix

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxTokenBytes caps a token file. Run tokens are a few hundred bytes; a
// larger file is not a token.
const MaxTokenBytes = 4 << 10

// ReadTokenFile reads the token in dir/name once and removes it, so the
// secret lives on only in this process's memory. The file must be a regular
// file (not a symbolic link, FIFO or device), mode exactly 0600 and owned by
// the effective user; anything else is refused with an error that names the
// file and what was wrong, never the content. After the unlink the
// directory is fsynced so the removal is durable.
func ReadTokenFile(dir, name string) (string, error) {
	label := filepath.Join(filepath.Base(dir), name)
	if name == "" || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return "", fmt.Errorf("token file %q: not a plain file name", name)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("token file %s: open directory: %w", label, err)
	}
	defer unix.Close(dfd)

	// O_NONBLOCK: opening a FIFO for reading would otherwise block until a
	// writer appears; with it the open returns and fstat refuses the FIFO.
	// It has no effect on a regular file.
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return "", fmt.Errorf("token file %s: refused: it is a symbolic link", label)
		}
		return "", fmt.Errorf("token file %s: open: %w", label, err)
	}
	f := os.NewFile(uintptr(fd), label)
	defer f.Close()

	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("token file %s: fstat: %w", label, err)
	}
	if typ := uint32(st.Mode) & unix.S_IFMT; typ != unix.S_IFREG {
		return "", fmt.Errorf("token file %s: refused: not a regular file (%s)", label, fileTypeName(typ))
	}
	if perm := uint32(st.Mode) & 0o7777; perm != 0o600 {
		return "", fmt.Errorf("token file %s: refused: mode %04o, want 0600", label, perm)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return "", fmt.Errorf("token file %s: refused: owned by uid %d, want uid %d (this process)", label, st.Uid, euid)
	}

	buf, err := io.ReadAll(io.LimitReader(f, MaxTokenBytes+1))
	if err != nil {
		return "", fmt.Errorf("token file %s: read: %w", label, err)
	}
	if len(buf) > MaxTokenBytes {
		return "", fmt.Errorf("token file %s: refused: larger than %d bytes", label, MaxTokenBytes)
	}
	tok := strings.TrimSpace(string(buf))
	clear(buf)
	if tok == "" {
		return "", fmt.Errorf("token file %s: refused: empty", label)
	}
	for i := 0; i < len(tok); i++ {
		// A token goes into an Authorization header: printable ASCII only.
		if tok[i] <= ' ' || tok[i] > '~' {
			return "", fmt.Errorf("token file %s: refused: not a token (byte %d is not printable ASCII)", label, i)
		}
	}

	if err := unix.Unlinkat(dfd, name, 0); err != nil {
		return "", fmt.Errorf("token file %s: unlink: %w", label, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return "", fmt.Errorf("token file %s: fsync directory after unlink: %w", label, err)
	}
	return tok, nil
}

func fileTypeName(typ uint32) string {
	switch typ {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("type %#o", typ)
}
