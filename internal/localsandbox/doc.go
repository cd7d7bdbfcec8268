// Package localsandbox runs a run's sandbox as a local subprocess: the
// embedded twin of the Fargate launcher. It implements belay.Launcher and
// belay.Sandbox.
//
// Each sandbox gets a fresh workspace under Config.WorkRoot laid out as the
// sandbox entry expects (spec.json, tokens/, out/, home/, api.sock: the
// names in package workspace, shared with the entry), an HTTP server for the
// control plane's internal routes on a Unix socket inside that workspace,
// and the entry binary started with an empty environment, in a session and
// process group of its own (no controlling terminal), and killed by the
// kernel if belay dies. Running as root it also drops to an unprivileged uid
// of its own (one per running sandbox, from a configured range, so sandboxes
// cannot reach each other's files) with no supplementary groups, and puts
// the entry in new PID, mount, network, IPC and UTS namespaces: a new
// network namespace has only a loopback interface that is down, so the
// sandbox has no network at all and reaches the control plane only through
// the socket. The sandbox still sees the machine's /proc and file system
// (read-only to it where permissions say so): a plain exec cannot mount a
// fresh /proc or pivot the root before the entry starts. Without root it
// tries an unprivileged user namespace for the same effect and, when the
// kernel refuses, runs the entry as the current user and says so plainly in
// a log line and in Launcher.Isolation.
//
// Because the Internal handler is usually built after the orchestrator,
// which needs the launcher, callers typically pass a handler that forwards
// to the API server once it exists (see the real-entry test).
//
// Nothing the sandbox leaves behind is read: the entry uploads its outputs
// (result.json, patch.diff, transcript.jsonl) through the internal API,
// where a command that runs as the sandbox user cannot swap them.
package localsandbox
