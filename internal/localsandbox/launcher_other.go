//go:build !linux

package localsandbox

import (
	"context"
	"errors"

	"github.com/belay-dev/belay/internal/belay"
)

// Launcher starts local sandboxes; outside Linux it cannot.
type Launcher struct{}

// New reports that local sandboxes need Linux: the isolation they rely on
// (namespaces, parent-death signal, uid drop) is Linux's.
func New(cfg Config) (*Launcher, error) {
	return nil, errors.New("localsandbox: local sandboxes need Linux")
}

// Isolation lists nothing: nothing is applied.
func (l *Launcher) Isolation() []string { return nil }

// Launch always fails outside Linux.
func (l *Launcher) Launch(ctx context.Context, spec belay.SandboxSpec) (belay.Sandbox, error) {
	return nil, errors.New("localsandbox: local sandboxes need Linux")
}
