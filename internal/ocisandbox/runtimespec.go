package ocisandbox

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strconv"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/belay-dev/belay/internal/hardening"
)

// Where the control plane's socket is inside a sandbox: a read-only bind
// mount of a root-owned host folder that holds only the socket, so the
// sandbox user can connect to it but cannot rename or replace it.
const (
	APISocketDir  = "/run/belay"
	APISocketPath = APISocketDir + "/api.sock"
)

// cpuPeriod is the CFS period the CPU quota is a share of (100 ms, the
// kernel's default).
const cpuPeriod = 100_000

// fargateCPUUnitsPerVCPU is how many of Fargate's CPU units make one vCPU.
const fargateCPUUnitsPerVCPU = 1024

// The kernel paths a sandbox must not read or change, as runc's and
// Docker's defaults have them: masked (an empty file or folder over them)
// and read-only.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// Bundle is what one sandbox's runtime configuration is made from besides
// the hardening profile: where its files are on the host, and how its
// entry starts.
type Bundle struct {
	// Rootfs is the unpacked image (shared, mounted read-only).
	Rootfs string
	// Workspace is the host folder mounted at the profile's
	// WorkspaceDir, owned by the sandbox user.
	Workspace string
	// SocketDir is the root-owned host folder holding api.sock, mounted
	// read-only at APISocketDir.
	SocketDir string
	// Args and Env start the entry: the image's entrypoint, with no
	// arguments, and the claim-mode environment.
	Args []string
	Env  []string
	// CgroupsPath is the sandbox's cgroup, unique on the machine.
	CgroupsPath string
	// HostIDs are the host ids the sandbox's user namespace maps to.
	HostIDs HostIDs
}

// HostIDs are the ids on the host that a sandbox's user namespace maps
// its two ids to: its root (0, which only runc's own setup runs as) and
// its user (the profile's UID and GID, which the entry runs as). Each
// sandbox has ids of its own, leased host-wide (internal/hostids), so no
// process of another sandbox, of this belay or another, has them. No
// other id is mapped: files of any other host id, root's included, show
// as the overflow id (nobody) inside, and no process inside can take
// them.
type HostIDs struct {
	RootUID, RootGID int
	UID, GID         int
}

// check says what is wrong with h for profile p.
func (h HostIDs) check() error {
	if h.RootUID <= 0 || h.RootGID <= 0 || h.UID <= 0 || h.GID <= 0 || h.RootUID == h.UID || h.RootGID == h.GID {
		return fmt.Errorf("runtime spec: host ids root %d:%d and user %d:%d must be two distinct non-root ids", h.RootUID, h.RootGID, h.UID, h.GID)
	}
	return nil
}

// RuntimeSpec makes a sandbox's OCI runtime configuration (runc's
// config.json) from the hardening profile p and bundle b. Every number
// and switch comes from p: the user, the read-only root, no capabilities,
// no_new_privs, the scratch folders and their sizes, memory, CPU,
// processes (the pids cgroup and RLIMIT_NPROC: the user's host uid is the
// sandbox's own, so the rlimit counts this sandbox's processes only, and
// the entry keeps a reserve of it that a command cannot take), open files
// and file size. Besides, the sandbox gets a user namespace that maps its
// root and its user to b.HostIDs, new PID, mount, network (loopback only),
// IPC, UTS and cgroup namespaces, a /proc
// of its own, the kernel paths Docker masks masked or read-only, and
// Docker's default seccomp profile (github.com/moby/profiles/seccomp),
// which, with no capability, refuses unshare, mount, keyctl, ptrace of
// other processes, bpf and the like.
func RuntimeSpec(p hardening.Profile, b Bundle) (*specs.Spec, error) {
	switch {
	case p.UID <= 0 || p.GID <= 0:
		return nil, fmt.Errorf("runtime spec: uid:gid %d:%d must be a non-root user", p.UID, p.GID)
	case len(b.Args) == 0:
		return nil, errors.New("runtime spec: no entry to start")
	case !p.DropAllCapabilities || !p.NoNewPrivileges || !p.ReadOnlyRootFS:
		return nil, errors.New("runtime spec: the profile must drop all capabilities, set no_new_privs and mount the root read-only")
	case b.HostIDs.check() != nil:
		return nil, b.HostIDs.check()
	case p.MemoryMiB <= 0 || p.Processes <= 0 || p.CPUUnits <= 0 || p.OpenFiles <= 0 || p.FileSizeMiB <= 0 || p.TmpSizeMiB <= 0:
		return nil, errors.New("runtime spec: every limit of the profile must be positive")
	}
	memory := int64(p.MemoryMiB) << 20
	// No swap: the memory limit is the whole of it.
	swap := memory
	pids := int64(p.Processes)
	nproc := uint64(p.Processes)
	shares := uint64(p.CPUUnits)
	quota := int64(p.CPUUnits) * cpuPeriod / fargateCPUUnitsPerVCPU
	period := uint64(cpuPeriod)
	fsize := uint64(p.FileSizeMiB) << 20
	nofile := uint64(p.OpenFiles)
	tmpSize := "size=" + strconv.Itoa(p.TmpSizeMiB) + "m"

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	for _, d := range append([]string{p.TmpDir}, p.PrivateTmpDirs...) {
		if !path.IsAbs(d) {
			return nil, fmt.Errorf("runtime spec: scratch folder %q is not absolute", d)
		}
		mounts = append(mounts, specs.Mount{Destination: d, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", tmpSize}})
	}
	mounts = append(mounts,
		specs.Mount{Destination: p.WorkspaceDir, Type: "bind", Source: b.Workspace,
			Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		specs.Mount{Destination: APISocketDir, Type: "bind", Source: b.SocketDir,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
	)

	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:            specs.User{UID: uint32(p.UID), GID: uint32(p.GID)},
			Args:            b.Args,
			Env:             b.Env,
			Cwd:             p.WorkspaceDir,
			NoNewPrivileges: p.NoNewPrivileges,
			// Every set empty; non-nil, so seccomp.GetDefaultProfile sees
			// no capability.
			Capabilities: &specs.LinuxCapabilities{
				Bounding: []string{}, Effective: []string{}, Inheritable: []string{},
				Permitted: []string{}, Ambient: []string{},
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
				{Type: "RLIMIT_FSIZE", Hard: fsize, Soft: fsize},
				{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
				{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc},
			},
		},
		Root:     &specs.Root{Path: b.Rootfs, Readonly: p.ReadOnlyRootFS},
		Hostname: p.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: b.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
				{Type: specs.UserNamespace},
			},
			UIDMappings: []specs.LinuxIDMapping{
				{ContainerID: 0, HostID: uint32(b.HostIDs.RootUID), Size: 1},
				{ContainerID: uint32(p.UID), HostID: uint32(b.HostIDs.UID), Size: 1},
			},
			GIDMappings: []specs.LinuxIDMapping{
				{ContainerID: 0, HostID: uint32(b.HostIDs.RootGID), Size: 1},
				{ContainerID: uint32(p.GID), HostID: uint32(b.HostIDs.GID), Size: 1},
			},
			Resources: &specs.LinuxResources{
				// No device but the runtime's defaults (null, zero,
				// full, random, urandom, tty, ptmx).
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memory, Swap: &swap},
				CPU:     &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: pids},
			},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	profile, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("runtime spec: seccomp profile: %w", err)
	}
	if len(profile.Architectures) == 0 {
		return nil, fmt.Errorf("runtime spec: Docker's seccomp profile has no architecture for %s", runtime.GOARCH)
	}
	// The native architecture only (the profile's first; Docker adds the
	// 32-bit ones, x86 and x32 beside x86_64): nothing in the image uses
	// another system call ABI, a call through one is refused outright
	// instead of filtered, and libseccomp compiles a third of the filter
	// at each start (about 25 ms of runc's CPU here).
	profile.Architectures = profile.Architectures[:1]
	s.Linux.Seccomp = profile
	return s, nil
}
