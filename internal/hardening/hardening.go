// Package hardening holds the sandbox's hardening numbers and switches, once.
// The Fargate task definition (infra/) and the local runc configuration
// (the OCI launcher, internal/ocisandbox) are both made from Sandbox, and a
// test on each side fails when what it builds disagrees with this value, so
// what runs on one machine is what runs on Fargate. The sandbox image
// (scripts/image.sh) takes its user, entrypoint and writable folders from
// it too (sandbox-task/imagespec).
package hardening

// Profile is how a sandbox is confined and what it may use.
type Profile struct {
	// UID and GID are the non-root user the entry runs as, the image's
	// USER.
	UID, GID int
	// Entrypoint starts the sandbox entry, the image's ENTRYPOINT; the
	// task definition and the runc config start it exactly so, with no
	// arguments (claim mode: the run comes from BELAY_CLAIM).
	Entrypoint []string
	// WorkspaceDir and TmpDir are the only writable paths: scratch volumes
	// on Fargate (which has no tmpfs), private mounts under runc.
	WorkspaceDir string
	TmpDir       string
	// PrivateTmpDirs are the other world-writable scratch folders a
	// program may use. Under runc each is a private tmpfs of TmpSizeMiB,
	// like TmpDir, so no run sees another's files there; on Fargate the
	// task is a machine of its own and they are the image's (read-only
	// with the root file system).
	PrivateTmpDirs []string
	// Hostname is the sandbox's host name (its own UTS namespace).
	Hostname string
	// ReadOnlyRootFS mounts the image's root filesystem read-only.
	ReadOnlyRootFS bool
	// DropAllCapabilities leaves every capability set empty.
	DropAllCapabilities bool
	// NoNewPrivileges sets no_new_privs on the entry (the kernel keeps it
	// for everything it starts).
	NoNewPrivileges bool
	// InitProcess runs a separate minimal init as PID 1 (Fargate's
	// initProcessEnabled). belay's entry is its PID namespace's init
	// itself: as PID 1 it kills and reaps whatever the agent's commands
	// left behind before it vouches for the tree (and before each final
	// check), which it cannot do as PID 2 under another init. So it is
	// off, on Fargate and under runc alike.
	InitProcess bool
	// CPUUnits is Fargate's CPU in 1/1024 vCPU; runc gets the same share
	// as a CFS quota.
	CPUUnits int
	// MemoryMiB is the hard memory limit: past it the kernel kills the
	// sandbox (OOM).
	MemoryMiB int
	// Processes caps the sandbox's processes and threads: the nproc
	// ulimit on Fargate (a task is a machine of its own there) and under
	// runc, where it holds as well as the pids cgroup (one per sandbox):
	// the nproc rlimit counts a uid's processes across the machine, and
	// each sandbox's user namespace maps its user to a host uid of its
	// own, so it counts that sandbox's alone. The entry keeps a reserve of
	// it that the commands it runs cannot take, so a fork bomb stops
	// before the entry can no longer start a thread.
	Processes int
	// OpenFiles caps open file descriptors per process (nofile).
	OpenFiles int
	// FileSizeMiB caps the size of one file a process writes (fsize).
	FileSizeMiB int
	// TmpSizeMiB caps the private /tmp (and each of PrivateTmpDirs) under
	// runc. tmpfs pages count against MemoryMiB as well.
	TmpSizeMiB int
	// EphemeralStorageGiB is Fargate's task storage (21 is its minimum).
	EphemeralStorageGiB int
	// Architecture is the CPU architecture of the image Fargate runs, as
	// OCI names it ("arm64" or "amd64"): `make image-fargate` builds the
	// image for it and the task definition's runtime platform follows it.
	// Local runs use an image built for the machine's own architecture
	// (`make image`).
	Architecture string
}

// Sandbox is belay's sandbox profile.
var Sandbox = Profile{
	UID:                 10001,
	GID:                 10001,
	Entrypoint:          []string{"/usr/local/bin/belay-sandbox"},
	WorkspaceDir:        "/workspace",
	TmpDir:              "/tmp",
	PrivateTmpDirs:      []string{"/var/tmp", "/dev/shm"},
	Hostname:            "sandbox",
	ReadOnlyRootFS:      true,
	DropAllCapabilities: true,
	NoNewPrivileges:     true,
	InitProcess:         false,
	CPUUnits:            1024,
	MemoryMiB:           2048,
	Processes:           512,
	OpenFiles:           4096,
	FileSizeMiB:         1024,
	TmpSizeMiB:          512,
	EphemeralStorageGiB: 21,
	Architecture:        "arm64",
}
