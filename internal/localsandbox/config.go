package localsandbox

import (
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/hostids"
)

// Isolation modes for Config.Isolation.
const (
	// IsolationAuto applies everything the machine allows: uid drop and
	// namespaces as root, an unprivileged user namespace otherwise.
	IsolationAuto = "auto"
	// IsolationNone runs the entry as the current user with no
	// namespaces; it exists to test the behaviour of a machine where
	// nothing else is available.
	IsolationNone = "none"
)

// DefaultLeaseDir is where every launcher on the host leases sandbox uids
// and gids (hostids.DefaultDir): one lock file per id, held with flock for
// as long as a sandbox runs under that id and its files exist, so two
// belay processes (or two launchers in one) never hand the same id to two
// sandboxes at once.
const DefaultLeaseDir = hostids.DefaultDir

// DefaultSandboxID is the first uid and gid sandboxes run as when belay
// runs as root. It needs no passwd entry: nothing in the sandbox looks it
// up.
const DefaultSandboxID = 10001

// DefaultSandboxIDs is how many uids (and gids) from DefaultSandboxID
// sandboxes may use: as many sandboxes can run at once.
const DefaultSandboxIDs = 256

// Config is what a Launcher needs.
type Config struct {
	// EntryPath is the sandbox entry binary (built from ./sandbox-task).
	// As root it is copied once into WorkRoot/bin as a root-owned 0555
	// file, so the sandbox user can run it but nobody but root can
	// change it.
	EntryPath string
	// WorkRoot holds one workspace per sandbox, for example
	// <data dir>/sandboxes. As root, it and every directory above it must
	// be searchable by the sandbox uids and writable by none of them nor
	// by every user (so not under /tmp): a sandbox that could leave a
	// pytest.ini or conftest.py above the workspaces would run its code in
	// later runs' checks. WorkRoot must be owned by belay's user and
	// writable only by it; New creates it (mode 0711 as root) when absent.
	WorkRoot string
	// Internal serves the control plane's internal routes; each sandbox
	// reaches it only through the api.sock in its workspace.
	Internal http.Handler
	// UID and GID are the first unprivileged uid and gid sandboxes run as
	// when belay runs as root; zero means DefaultSandboxID. Each running
	// sandbox gets the lowest free uid (and the gid at the same offset)
	// of its own, so one sandbox cannot read or change another's
	// workspace or processes. The ids are leased host-wide (see
	// DefaultLeaseDir), so every launcher on the machine, in this process
	// or another belay, agrees on who holds which; an id that owns a
	// process on the host, or files in a workspace left behind, is
	// skipped. An id is given out again only after its sandbox was reaped
	// and its workspace removed.
	UID, GID int
	// UIDs is how many consecutive uids and gids sandboxes may use, which
	// bounds how many run at once; zero means DefaultSandboxIDs.
	UIDs int
	// Isolation is IsolationAuto (the default when empty) or
	// IsolationNone.
	Isolation string
	// Limits holds the resource limits every sandbox process gets
	// (Processes, FileSizeMiB, MemoryMiB, OpenFiles); nil means
	// hardening.Sandbox, the numbers the Fargate task and the OCI
	// launcher use too. Tests lower them to reach a limit cheaply.
	Limits *hardening.Profile
	// Logger receives the isolation report and one line per sandbox
	// lifecycle step, with run_id; never a token or file content.
	Logger *slog.Logger
	// Now is the clock for SandboxExit.Duration; nil means time.Now.
	Now func() time.Time
	// Rand is the entropy for workspace names; nil means crypto/rand.
	Rand io.Reader
}
