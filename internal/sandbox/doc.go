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
package sandbox
