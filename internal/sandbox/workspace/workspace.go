// Package workspace names the files and folders of a sandbox workspace: the
// contract between the launcher that lays a workspace out (the local
// launcher, internal/localsandbox; the Fargate task on AWS) and the sandbox
// entry that reads it (internal/sandbox). The names live here, once, so the
// two sides cannot drift apart, and so the launcher can share them without
// importing the entry and its agent.
//
// A workspace folder holds:
//
//	spec.json     the run's belay.SandboxSpec, never a token
//	tokens/       one owner-only file per audience token, unlinked once read
//	repo/         the repository the entry builds from the spec's files
//	out/          result.json, patch.diff and transcript.jsonl, for the control plane
//	home/         HOME of the entry and of every command it runs
//	api.sock      the control plane's internal routes, when served on a Unix socket
package workspace

// The names in a workspace folder.
const (
	SpecFile  = "spec.json"
	TokensDir = "tokens"
	RepoDir   = "repo"
	OutDir    = "out"
	HomeDir   = "home"
	Socket    = "api.sock"
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
