package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinSocket opens the socket at path once, O_PATH, and returns the name
// that reaches that very inode from now on, /proc/self/fd/N: connecting
// there goes to the socket that was at path when the entry started, even
// after the name is renamed or replaced. The descriptor stays open for the
// process's life and is not inherited (O_CLOEXEC). Without /proc, the name
// itself is returned, and only the peer check guards it.
func pinSocket(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("api socket %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return "", fmt.Errorf("api socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return "", fmt.Errorf("api socket %s: not a socket", path)
	}
	pinned := "/proc/self/fd/" + strconv.Itoa(fd)
	if fi, err := os.Stat(pinned); err != nil || fi.Mode().Type() != os.ModeSocket {
		unix.Close(fd)
		return path, nil
	}
	return pinned, nil
}

// peerUID returns the uid of the process that listens at the other end of
// a Unix socket connection, as the kernel recorded it when it connected.
func peerUID(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, errors.New("not a Unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		cred *unix.Ucred
		gerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if gerr != nil {
		return 0, fmt.Errorf("read the listener's credentials (SO_PEERCRED): %w", gerr)
	}
	return int(cred.Uid), nil
}
