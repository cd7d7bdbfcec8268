//go:build !linux

package sandbox

import (
	"errors"
	"net"
)

// pinSocket is Linux-only: elsewhere the entry refuses to use a socket it
// cannot check.
func pinSocket(path string) (string, error) {
	return "", errors.New("api socket " + path + ": checking the listener needs Linux")
}

func peerUID(net.Conn) (int, error) {
	return 0, errors.New("checking a socket's peer needs Linux")
}
