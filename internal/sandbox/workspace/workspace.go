// Package workspace names the files and folders of a sandbox workspace: the
// contract between the launcher that lays a workspace out (the local
// launcher, internal/localsandbox; the Fargate task on AWS) and the sandbox
// entry that reads it (internal/sandbox). The names live here, once, so the
// two sides cannot drift apart, and so the launcher can share them without
// importing the entry and its agent.
//
// A workspace folder holds:
//
//	spec.json     the run's belay.SandboxSpec, never a token (file mode)
//	api.sock      the control plane's internal routes, when served on a Unix socket
//	tokens/       one owner-only file per audience token, unlinked once read (file mode)
//	repo/         the repository the entry builds from the spec's files
//	home/         HOME of the entry and of every command it runs
//
// The entry leaves no result files for anyone to read: it uploads
// result.json, patch.diff and transcript.jsonl through the internal API.
// In claim mode only repo/ and home/ are there; the rest comes from the
// claim exchange (see EnvClaim).
//
// Who owns what is part of the contract. When the local launcher runs as
// root, the workspace folder itself, spec.json and api.sock are root's,
// with the sandbox's own group (mode 0750, 0640 and 0660): the sandbox can
// enter the folder, read the spec and connect to the socket, but it cannot
// add, remove, rename or replace anything in the folder, so api.sock stays
// the control plane's for the whole run and the folder cannot be moved.
// tokens/, repo/ and home/ (and an empty out/, which the entry no longer
// uses) are the sandbox user's own (0700) and already exist, empty, when
// the entry starts: it writes inside them, never beside them. No folder
// between repo/ and / is writable by the sandbox user, so a tool that
// looks for its configuration upwards from the repository (pytest reads
// pytest.ini, tox.ini, setup.cfg, pyproject.toml and conftest.py in every
// parent) finds nothing a command planted there.
//
// Elsewhere (a launcher that runs the sandbox as its own user, a Fargate
// task's or an OCI container's volume) the whole folder may belong to the
// sandbox user; the entry then removes whatever appeared beside these
// names before the final checks. Either way the entry refuses to start when
// a folder above the workspace is writable by it (see internal/sandbox).
package workspace

// The names in a workspace folder.
const (
	SpecFile  = "spec.json"
	TokensDir = "tokens"
	RepoDir   = "repo"
	// OutDir is no longer read or written by the entry; launchers may
	// stop creating it.
	OutDir  = "out"
	HomeDir = "home"
	Socket  = "api.sock"
)

// The token files in TokensDir, one per audience, so that one leaked token
// cannot buy all three authorities.
const (
	ModelTokenFile     = "model.token"
	EventsTokenFile    = "events.token"
	ApprovalsTokenFile = "approvals.token"
)

// CleanPath is the PATH of the entry and of every process it starts. It is
// fixed, not inherited: a PATH from the launcher could point at a pyenv shim
// or a folder the agent can write.
const CleanPath = "/usr/local/bin:/usr/bin:/bin"

// The environment of the entry in claim mode (`belay-sandbox` with no
// arguments), as the Fargate task definition and the OCI launcher start
// it. The claim code is the only per-run input; everything else about the
// run comes from the claim exchange.
const (
	// EnvClaim is the single-use claim code.
	EnvClaim = "BELAY_CLAIM"
	// EnvAPIURL is the base URL of the internal routes:
	// https://<private api>/<stage> on AWS, http://belay over a socket.
	EnvAPIURL = "BELAY_API_URL"
	// EnvAPISocket, when set, is the Unix socket the internal routes are
	// served on (the OCI launcher bind-mounts it).
	EnvAPISocket = "BELAY_API_SOCKET"
	// EnvAPIPeerUID is the uid the listener of EnvAPISocket must run as,
	// as the entry sees it (in a user namespace that does not map the
	// listener's uid, the overflow uid); required with it.
	EnvAPIPeerUID = "BELAY_API_PEER_UID"
	// EnvWorkspace is where the entry builds repo/ and home/; default
	// DefaultClaimWorkspace.
	EnvWorkspace = "BELAY_WORKSPACE"
)

// DefaultClaimWorkspace is the workspace in claim mode when EnvWorkspace
// is unset: the image's writable workspace volume
// (hardening.Sandbox.WorkspaceDir).
const DefaultClaimWorkspace = "/workspace"
