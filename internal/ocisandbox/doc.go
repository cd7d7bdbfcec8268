// Package ocisandbox runs a run's sandbox as the sandbox image (an OCI
// archive built by `make image`) under runc, with the hardening the
// Fargate task definition has (internal/hardening): the embedded twin of
// the Fargate launcher, and `belay serve`'s default launcher. It implements
// belay.Launcher and belay.Sandbox.
//
// The image is read and its layers unpacked once per image digest into a
// root-owned cache (Config.ImageCache); every sandbox mounts that tree
// read-only as its root. Each sandbox has a user namespace of its own
// that maps two ids only, its root (0, which only runc's own setup runs
// as) and its user (the profile's, 10001), to a block of two host ids
// leased host-wide (internal/hostids, from DefaultFirstHostID) exactly as
// the process launcher leases its uids: no two sandboxes on the machine,
// of one belay or of two, share a host id, and an id that owns a process
// or files in a workspace left behind is skipped. The lease is held until
// the sandbox's folder is gone. Each sandbox gets, on the host, a
// root-owned folder under Config.WorkRoot holding:
//
//	config.json   runc's configuration (RuntimeSpec), removed once runc has read it
//	workspace/    mounted at /workspace, owned by the sandbox user's host ids
//	api/api.sock  the control plane's internal routes, served by this process;
//	              api/ is root's and mounted read-only at /run/belay, so the
//	              sandbox user can connect to the socket but not rename or
//	              replace it
//
// The entry starts exactly as the Fargate task starts it: the image's
// entrypoint with no arguments, as the image's user, with the image's
// environment plus HOME (from the image's /etc/passwd, as container
// runtimes do) and the claim-mode variables (BELAY_CLAIM, BELAY_API_URL,
// BELAY_API_SOCKET, BELAY_API_PEER_UID, the overflow uid: belay's root as
// the user namespace shows it): the run's spec and tokens come through
// the single-use claim, never through files. runc gives it new user,
// PID, mount, network (loopback only), IPC, UTS and cgroup namespaces, a
// /proc of its own, private size-capped tmpfs on /tmp, /var/tmp and
// /dev/shm, no capability, no_new_privs, Docker's default seccomp profile,
// and the memory, CPU and process limits of the task definition in a
// cgroup of its own (the process limit also as RLIMIT_NPROC, which counts
// the sandbox's own host uid only). When it ends, the cgroup's OOM-kill counter says
// whether the kernel killed something in it for memory
// (belay.SandboxExit.OOMKilled).
//
// The launcher needs root (runc makes namespaces, mounts and cgroups) and
// runc 1.1 or later (crun 1.8 refuses hybrid cgroup v1+v2 hierarchies).
// runc's setup runs as the sandbox's unprivileged root, which must reach
// the image: every folder above the cache must be searchable by others.
// It holds an exclusive lock on its state folder, so two launchers never
// share one; at start it removes the containers and sandbox folders a
// launcher that died left behind.
package ocisandbox
