package belay

import (
	"io"
	"time"
)

// Workspaces builds sessions' workspaces (internal/gitsource implements it
// with go-git, in memory): a base from the uploaded files or a source
// bundle, each completed turn's patch committed on top, and from the head
// what the next turn starts from and the session's whole change.
type Workspaces interface {
	// FromFiles starts a workspace whose base commit holds files.
	FromFiles(files []File, when time.Time) (Workspace, error)
	// FromBundle starts a workspace whose base is a source bundle's commit.
	FromBundle(r io.Reader) (Workspace, error)
}

// Workspace is one session's workspace.
type Workspace interface {
	// Apply commits patch, a validated git diff from the head, on the
	// head. It fails, changing nothing, for a patch that does not apply.
	Apply(patch []byte, message string, when time.Time) error
	// Changed reports whether the head moved from the base.
	Changed() bool
	// Files returns the head's regular files.
	Files() ([]File, error)
	// Bundle returns the head as a source a run can start from without a
	// fetch: its bundle (with history, at most maxBytes: too_large past
	// it), commit, tree and paths.
	Bundle(maxBytes int64) (data []byte, commit string, tree SourceTree, bundle SourceBundle, paths []string, err error)
	// Diff returns the diff from the base to the head (empty when equal).
	Diff() ([]byte, error)
}
