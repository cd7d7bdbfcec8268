package ocisandbox

import "context"

// StartCommand runs args instead of the entry in a new sandbox, with the
// launcher's every other setting: the probes' way in.
func (l *Launcher) StartCommand(ctx context.Context, runID string, args, env []string) (*Sandbox, error) {
	return l.start(ctx, runID, args, append(append([]string(nil), l.env...), env...), "")
}
