package ocisandbox_test

import (
	"encoding/json"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/ocisandbox"
)

func testBundle() ocisandbox.Bundle {
	return ocisandbox.Bundle{
		Rootfs:      "/cache/abc/rootfs",
		Workspace:   "/work/run-1/workspace",
		SocketDir:   "/work/run-1/api",
		Args:        hardening.Sandbox.Entrypoint,
		Env:         []string{"PATH=/usr/bin:/bin", "BELAY_CLAIM=x"},
		CgroupsPath: "/belay/run-1",
		HostIDs:     ocisandbox.HostIDs{RootUID: 1879048192, RootGID: 1879048192, UID: 1879048193, GID: 1879048193},
	}
}

// specJSON is the configuration as runc reads it: config.json decoded
// back, so the test sees what runc sees and not only the Go value.
func specJSON(t *testing.T, p hardening.Profile) specs.Spec {
	t.Helper()
	s, err := ocisandbox.RuntimeSpec(p, testBundle())
	if err != nil {
		t.Fatalf("RuntimeSpec: %v", err)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestRuntimeSpecFollowsHardening holds runc's configuration to
// hardening.Sandbox, the value the Fargate task definition is made from:
// every number and switch there must be what runc gets, so a change on one
// side that the other does not follow fails here.
func TestRuntimeSpecFollowsHardening(t *testing.T) {
	p := hardening.Sandbox
	s := specJSON(t, p)

	if s.Process.User.UID != uint32(p.UID) || s.Process.User.GID != uint32(p.GID) || len(s.Process.User.AdditionalGids) != 0 {
		t.Errorf("user = %+v, want %d:%d with no other group", s.Process.User, p.UID, p.GID)
	}
	if !slices.Equal(s.Process.Args, p.Entrypoint) {
		t.Errorf("args = %q, want the entrypoint %q and no argument", s.Process.Args, p.Entrypoint)
	}
	if s.Process.Cwd != p.WorkspaceDir {
		t.Errorf("cwd = %q, want %q", s.Process.Cwd, p.WorkspaceDir)
	}
	if s.Process.NoNewPrivileges != p.NoNewPrivileges || !s.Process.NoNewPrivileges {
		t.Errorf("noNewPrivileges = %v, want true", s.Process.NoNewPrivileges)
	}
	c := s.Process.Capabilities
	if c == nil {
		t.Fatal("capabilities absent: runc would keep its default set")
	}
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted, "inheritable": c.Inheritable, "ambient": c.Ambient} {
		if len(set) != 0 {
			t.Errorf("%s capabilities = %v, want none", name, set)
		}
	}
	if s.Root == nil || s.Root.Readonly != p.ReadOnlyRootFS || !s.Root.Readonly {
		t.Errorf("root = %+v, want read-only", s.Root)
	}
	if s.Hostname != p.Hostname {
		t.Errorf("hostname = %q, want %q", s.Hostname, p.Hostname)
	}

	r := s.Linux.Resources
	if r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != int64(p.MemoryMiB)<<20 {
		t.Errorf("memory limit = %v, want %d MiB", r.Memory, p.MemoryMiB)
	}
	if r.Memory.Swap == nil || *r.Memory.Swap != *r.Memory.Limit {
		t.Errorf("memory+swap = %v, want the memory limit (no swap)", r.Memory.Swap)
	}
	if r.Pids == nil || r.Pids.Limit != int64(p.Processes) {
		t.Errorf("pids = %+v, want %d", r.Pids, p.Processes)
	}
	if r.CPU == nil || r.CPU.Quota == nil || r.CPU.Period == nil || r.CPU.Shares == nil {
		t.Fatalf("cpu = %+v, want a quota, a period and shares", r.CPU)
	}
	// Fargate's units: 1024 per vCPU.
	if got := float64(*r.CPU.Quota) / float64(*r.CPU.Period) * 1024; int(got) != p.CPUUnits {
		t.Errorf("cpu quota/period = %d/%d = %.0f units, want %d", *r.CPU.Quota, *r.CPU.Period, got, p.CPUUnits)
	}
	if *r.CPU.Shares != uint64(p.CPUUnits) {
		t.Errorf("cpu shares = %d, want %d", *r.CPU.Shares, p.CPUUnits)
	}
	rl := map[string]specs.POSIXRlimit{}
	for _, l := range s.Process.Rlimits {
		rl[l.Type] = l
	}
	for typ, want := range map[string]uint64{
		"RLIMIT_NOFILE": uint64(p.OpenFiles),
		"RLIMIT_FSIZE":  uint64(p.FileSizeMiB) << 20,
		"RLIMIT_CORE":   0,
		// The user's host uid is the sandbox's own, so the rlimit counts
		// its processes only; the entry keeps a reserve of it.
		"RLIMIT_NPROC": uint64(p.Processes),
	} {
		if l, ok := rl[typ]; !ok || l.Soft != want || l.Hard != want {
			t.Errorf("%s = %+v, want %d soft and hard", typ, l, want)
		}
	}

	// The user namespace maps exactly two ids each way: root to the
	// bundle's root ids, the profile's user to the bundle's user ids.
	h := testBundle().HostIDs
	wantUIDs := []specs.LinuxIDMapping{{ContainerID: 0, HostID: uint32(h.RootUID), Size: 1}, {ContainerID: uint32(p.UID), HostID: uint32(h.UID), Size: 1}}
	wantGIDs := []specs.LinuxIDMapping{{ContainerID: 0, HostID: uint32(h.RootGID), Size: 1}, {ContainerID: uint32(p.GID), HostID: uint32(h.GID), Size: 1}}
	if !slices.Equal(s.Linux.UIDMappings, wantUIDs) || !slices.Equal(s.Linux.GIDMappings, wantGIDs) {
		t.Errorf("id mappings uid %+v gid %+v, want %+v and %+v", s.Linux.UIDMappings, s.Linux.GIDMappings, wantUIDs, wantGIDs)
	}

	mounts := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		if _, dup := mounts[m.Destination]; dup {
			t.Errorf("two mounts on %s", m.Destination)
		}
		mounts[m.Destination] = m
	}
	for _, d := range append([]string{p.TmpDir}, p.PrivateTmpDirs...) {
		m, ok := mounts[d]
		if !ok || m.Type != "tmpfs" {
			t.Errorf("%s: mount %+v, want a private tmpfs", d, m)
			continue
		}
		if !slices.Contains(m.Options, "size="+itoa(p.TmpSizeMiB)+"m") || !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") {
			t.Errorf("%s: options %v, want size=%dm, nosuid, nodev", d, m.Options, p.TmpSizeMiB)
		}
	}
	if m := mounts[p.WorkspaceDir]; m.Type != "bind" || m.Source != testBundle().Workspace || !slices.Contains(m.Options, "rw") || !slices.Contains(m.Options, "nosuid") {
		t.Errorf("workspace mount = %+v, want the sandbox's workspace, read-write, nosuid", m)
	}
	if m := mounts[ocisandbox.APISocketDir]; m.Type != "bind" || m.Source != testBundle().SocketDir || !slices.Contains(m.Options, "ro") {
		t.Errorf("socket mount = %+v, want the api folder, read-only", m)
	}
	if m := mounts["/proc"]; m.Type != "proc" {
		t.Errorf("/proc mount = %+v, want a proc of its own", m)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" && m.Source != testBundle().Workspace && m.Source != testBundle().SocketDir {
			t.Errorf("bind mount of host path %s: nothing of the host but the workspace and the socket folder may be visible", m.Source)
		}
	}

	var ns []string
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s; every namespace must be new", n.Type, n.Path)
		}
		ns = append(ns, string(n.Type))
	}
	slices.Sort(ns)
	if want := []string{"cgroup", "ipc", "mount", "network", "pid", "user", "uts"}; !slices.Equal(ns, want) {
		t.Errorf("namespaces = %v, want %v", ns, want)
	}
	for _, path := range []string{"/proc/kcore", "/proc/keys", "/sys/firmware"} {
		if !slices.Contains(s.Linux.MaskedPaths, path) {
			t.Errorf("%s is not masked", path)
		}
	}
	for _, path := range []string{"/proc/sys", "/proc/sysrq-trigger"} {
		if !slices.Contains(s.Linux.ReadonlyPaths, path) {
			t.Errorf("%s is not read-only", path)
		}
	}
}

// TestRuntimeSpecSeccomp checks that the filter is Docker's default for a
// process without capabilities: it refuses by default and allows neither
// unshare nor mount (Debian's containers-common profile allows both).
func TestRuntimeSpecSeccomp(t *testing.T) {
	s := specJSON(t, hardening.Sandbox)
	sc := s.Linux.Seccomp
	if sc == nil {
		t.Fatal("no seccomp filter")
	}
	native := map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}[runtime.GOARCH]
	if len(sc.Architectures) != 1 || sc.Architectures[0] != native {
		t.Errorf("architectures %v, want only the native %s (a call through another ABI is refused)", sc.Architectures, native)
	}
	if sc.DefaultAction != specs.ActErrno {
		t.Errorf("default action = %s, want %s", sc.DefaultAction, specs.ActErrno)
	}
	allowed := map[string]bool{}
	for _, rule := range sc.Syscalls {
		if rule.Action != specs.ActAllow || len(rule.Args) > 0 {
			continue
		}
		for _, n := range rule.Names {
			allowed[n] = true
		}
	}
	if len(allowed) < 250 {
		t.Errorf("%d system calls allowed; Docker's default allows over 300: is this its profile?", len(allowed))
	}
	for _, n := range []string{"read", "write", "execve", "wait4", "openat"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed; the sandbox could not run", n)
		}
	}
	for _, n := range []string{"unshare", "mount", "umount2", "setns", "keyctl", "add_key", "bpf", "pivot_root", "open_by_handle_at", "init_module", "kexec_load", "reboot", "swapon"} {
		if allowed[n] {
			t.Errorf("%s is allowed without a capability", n)
		}
	}
}

func TestRuntimeSpecRefusesWeakProfiles(t *testing.T) {
	for name, change := range map[string]func(*hardening.Profile){
		"root user":         func(p *hardening.Profile) { p.UID = 0 },
		"capabilities kept": func(p *hardening.Profile) { p.DropAllCapabilities = false },
		"new privileges":    func(p *hardening.Profile) { p.NoNewPrivileges = false },
		"writable root":     func(p *hardening.Profile) { p.ReadOnlyRootFS = false },
		"no memory limit":   func(p *hardening.Profile) { p.MemoryMiB = 0 },
		"no process limit":  func(p *hardening.Profile) { p.Processes = 0 },
		"relative tmp":      func(p *hardening.Profile) { p.PrivateTmpDirs = []string{"var/tmp"} },
	} {
		t.Run(name, func(t *testing.T) {
			p := hardening.Sandbox
			p.PrivateTmpDirs = slices.Clone(p.PrivateTmpDirs)
			change(&p)
			if _, err := ocisandbox.RuntimeSpec(p, testBundle()); err == nil {
				t.Error("RuntimeSpec accepted it")
			}
		})
	}
	for name, change := range map[string]func(*ocisandbox.HostIDs){
		"no host ids":          func(h *ocisandbox.HostIDs) { *h = ocisandbox.HostIDs{} },
		"root mapped to root":  func(h *ocisandbox.HostIDs) { h.RootUID = 0 },
		"user mapped to root":  func(h *ocisandbox.HostIDs) { h.GID = 0 },
		"root and user shared": func(h *ocisandbox.HostIDs) { h.UID = h.RootUID },
	} {
		t.Run(name, func(t *testing.T) {
			b := testBundle()
			change(&b.HostIDs)
			if _, err := ocisandbox.RuntimeSpec(hardening.Sandbox, b); err == nil {
				t.Errorf("RuntimeSpec accepted host ids %+v", b.HostIDs)
			}
		})
	}
}

// TestRuntimeSpecTracksProfile changes each number and checks that the
// configuration follows: no value is hard-coded beside the profile.
func TestRuntimeSpecTracksProfile(t *testing.T) {
	p := hardening.Sandbox
	p.MemoryMiB, p.Processes, p.CPUUnits, p.OpenFiles, p.FileSizeMiB, p.TmpSizeMiB = 512, 64, 256, 100, 8, 16
	p.UID, p.GID, p.Hostname = 20002, 20003, "other"
	s := specJSON(t, p)
	r := s.Linux.Resources
	text, _ := json.Marshal(s)
	switch {
	case *r.Memory.Limit != 512<<20, r.Pids.Limit != 64, *r.CPU.Quota*1024/int64(*r.CPU.Period) != 256,
		!strings.Contains(string(text), `{"type":"RLIMIT_NPROC","hard":64,"soft":64}`):
		t.Errorf("resources = %s", text)
	case s.Process.User.UID != 20002 || s.Process.User.GID != 20003 || s.Hostname != "other",
		s.Linux.UIDMappings[1].ContainerID != 20002 || s.Linux.GIDMappings[1].ContainerID != 20003:
		t.Errorf("user/hostname = %+v %q", s.Process.User, s.Hostname)
	case !strings.Contains(string(text), `"size=16m"`):
		t.Errorf("tmpfs size not 16m: %s", text)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
