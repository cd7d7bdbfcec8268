// Package sandbox is the sandbox entry: the program that runs inside a
// hardened sandbox (a Fargate task, or a local subprocess) for one run. It
// hardens its own process, takes the run's three audience tokens from
// owner-only files, turns the uploaded tree into a git repository whose one
// commit is the base, runs the agent loop with the tools in this package,
// runs the run's checks, and writes the result bundle, the patch and the
// transcript for the control plane to validate.
//
// Everything the model asks for is untrusted input. The tools confine reads
// and writes to the repository, refuse writes outside the run's allowed
// paths, into .git or through a symbolic link, run checks by argv only when
// they equal one of the run's checks, and run commands with a clean
// environment that holds no token. See DESIGN.md "Sandbox entry" and
// "The agent's tools".
//
// An approved shell command runs as the entry's own user and can change
// anything the entry can: .git, home, the workspace. So when the agent's
// turn is over the entry trusts none of it. It kills what the commands left
// running (when it is its PID namespace's init), puts .git back from what
// it remembers of the base (Base.Finalize), commits only the allowed
// changes, checks every object the patch is made from against its hash,
// makes the work tree exactly the head commit's tree, removes what was
// added to the workspace and empties home, and only then runs the final
// checks: their results are for the files the patch produces. A repository
// it cannot vouch for fails the run with ReasonRepositoryTampered.
package sandbox
