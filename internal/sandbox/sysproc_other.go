//go:build !linux

package sandbox

import (
	"syscall"
	"time"
)

// childSysProcAttr puts a child in its own process group, so a timeout can
// kill everything it started.
func childSysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// lockThreadForChild does nothing off Linux: there is no per-thread
// attribute to protect.
func lockThreadForChild() {}

// setThreadNoNewPrivs does nothing off Linux, which has no such flag; Harden
// refuses to run there.
func setThreadNoNewPrivs() error { return nil }

// killStrays does nothing off Linux (see the Linux version).
func killStrays(time.Duration) (int, error) { return 0, nil }

// reserveThreadsForEntry does nothing off Linux (see the Linux version).
func reserveThreadsForEntry(int) error { return nil }
