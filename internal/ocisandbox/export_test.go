package ocisandbox

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StartCommand runs args instead of the entry in a new sandbox, with the
// launcher's every other setting: the probes' way in.
func (l *Launcher) StartCommand(ctx context.Context, runID string, args, env []string) (*Sandbox, error) {
	return l.start(ctx, runID, args, append(append([]string(nil), l.env...), env...), "")
}

// PID is the sandbox's entry (its PID namespace's init) as the host sees
// it, from runc's pid file.
func (s *Sandbox) PID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, pidFile))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// HostIDs are the host ids the sandbox's user namespace maps to.
func (s *Sandbox) HostIDs() HostIDs { return s.ids }
