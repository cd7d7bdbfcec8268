// Package localsandbox runs a run's sandbox as a local subprocess: the
// embedded twin of the Fargate launcher, and the fallback of the OCI
// launcher, for an operator who accepts weaker isolation. It implements
// belay.Launcher and belay.Sandbox.
//
// Each sandbox gets a fresh workspace under Config.WorkRoot laid out as the
// sandbox entry expects (spec.json, api.sock, tokens/, repo/, out/, home/:
// the names and ownership in package workspace, shared with the entry), an
// HTTP server for the control plane's internal routes on a Unix socket
// inside that workspace, and the entry binary started with an empty
// environment, in a session and process group of its own (no controlling
// terminal), with resource limits from package hardening (through
// prlimit(1)), and killed by the kernel if belay dies.
//
// Running as root it also drops to an unprivileged uid and gid of its own
// with no supplementary groups, and puts the entry in new PID, mount,
// network, IPC and UTS namespaces: a new network namespace has only a
// loopback interface that is down, so the sandbox has no network at all and
// reaches the control plane only through the socket. The uid and gid are
// leased host-wide (DefaultLeaseDir), so no two sandboxes on the machine run
// as one uid at the same time, whichever belay started them. The workspace
// folder, spec.json and api.sock stay root's: the sandbox cannot rename or
// replace the socket the entry dials. New refuses a WorkRoot with a folder
// above it that a sandbox user could write (such as /tmp), where one run
// could plant configuration that later runs' checks read.
//
// What a local process cannot get is said plainly (WeakIsolation): the
// sandbox sees the machine's /proc, /tmp, /dev/shm and file system (read-only
// to it where permissions say so), has no seccomp filter and can reach the
// host's Unix sockets that permissions allow; a plain exec cannot mount a
// fresh /proc or pivot the root before the entry starts. Without root it
// tries an unprivileged user namespace for the same effect and, when the
// kernel refuses, runs the entry as the current user and says so plainly in
// a log line and in Launcher.NotApplied.
//
// Because the Internal handler is usually built after the orchestrator,
// which needs the launcher, callers typically pass a handler that forwards
// to the API server once it exists (see the real-entry test).
//
// Nothing the sandbox leaves behind is read: the entry uploads its outputs
// (result.json, patch.diff, transcript.jsonl) through the internal API,
// where a command that runs as the sandbox user cannot swap them.
package localsandbox
