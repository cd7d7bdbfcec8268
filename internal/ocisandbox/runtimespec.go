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
}

// RuntimeSpec makes a sandbox's OCI runtime configuration (runc's
// config.json) from the hardening profile p and bundle b. Every number
// and switch comes from p: the user, the read-only root, no capabilities,
// no_new_privs, the scratch folders and their sizes, memory, CPU,
// processes, open files and file size. Besides, the sandbox gets new PID,
// mount, network (loopback only), IPC, UTS and cgroup namespaces, a /proc
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
	case p.MemoryMiB <= 0 || p.Processes <= 0 || p.CPUUnits <= 0 || p.OpenFiles <= 0 || p.FileSizeMiB <= 0 || p.TmpSizeMiB <= 0:
		return nil, errors.New("runtime spec: every limit of the profile must be positive")
	}
	memory := int64(p.MemoryMiB) << 20
	// No swap: the memory limit is the whole of it.
	swap := memory
	pids := int64(p.Processes)
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
