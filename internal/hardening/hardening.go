// Package hardening holds the sandbox's hardening numbers and switches, once.
// The Fargate task definition (infra/) and the local runc configuration
// (the OCI launcher) are both made from Sandbox, and a test on each side
// fails when what it builds disagrees with this value, so what runs on one
// machine is what runs on Fargate.
package hardening

// Profile is how a sandbox is confined and what it may use.
type Profile struct {
	// UID and GID are the non-root user the entry runs as, the image's
	// USER.
	UID, GID int
	// Entrypoint starts the sandbox entry, the image's ENTRYPOINT; the
	// task definition and the runc config start it exactly so.
	Entrypoint []string
	// WorkspaceDir and TmpDir are the only writable paths: scratch volumes
	// on Fargate (which has no tmpfs), private mounts under runc.
	WorkspaceDir string
	TmpDir       string
	// ReadOnlyRootFS mounts the image's root filesystem read-only.
	ReadOnlyRootFS bool
	// DropAllCapabilities leaves every capability set empty.
	DropAllCapabilities bool
	// NoNewPrivileges sets no_new_privs on the entry (the kernel keeps it
	// for everything it starts).
	NoNewPrivileges bool
	// InitProcess runs a minimal init as PID 1 that reaps orphans and
	// forwards signals (Fargate's initProcessEnabled).
	InitProcess bool
	// CPUUnits is Fargate's CPU in 1/1024 vCPU; runc gets the same share
	// as a CFS quota.
	CPUUnits int
	// MemoryMiB is the hard memory limit: past it the kernel kills the
	// sandbox (OOM).
	MemoryMiB int
	// Processes caps the processes and threads of the sandbox user: the
	// nproc ulimit on Fargate, the nproc rlimit and the pids cgroup under
	// runc.
	Processes int
	// OpenFiles caps open file descriptors per process (nofile).
	OpenFiles int
	// FileSizeMiB caps the size of one file a process writes (fsize).
	FileSizeMiB int
	// TmpSizeMiB caps the private /tmp (and /var/tmp, /dev/shm) under runc.
	TmpSizeMiB int
	// EphemeralStorageGiB is Fargate's task storage (21 is its minimum).
	EphemeralStorageGiB int
}

// Sandbox is belay's sandbox profile.
var Sandbox = Profile{
	UID:                 10001,
	GID:                 10001,
	Entrypoint:          []string{"/usr/local/bin/belay-sandbox"},
	WorkspaceDir:        "/workspace",
	TmpDir:              "/tmp",
	ReadOnlyRootFS:      true,
	DropAllCapabilities: true,
	NoNewPrivileges:     true,
	InitProcess:         true,
	CPUUnits:            1024,
	MemoryMiB:           2048,
	Processes:           512,
	OpenFiles:           4096,
	FileSizeMiB:         1024,
	TmpSizeMiB:          512,
	EphemeralStorageGiB: 21,
}
