package ocisandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/hostids"
)

// DefaultRuntime is the OCI runtime the launcher runs, looked up on PATH.
const DefaultRuntime = "runc"

// The host ids the sandboxes' user namespaces map to, by default: each
// sandbox leases a block of two (its root and its user) from
// DefaultFirstHostID, at most DefaultHostIDSlots sandboxes at once. The
// range lies above the subordinate ids useradd hands out by default
// (/etc/subuid, up to 600100000) and systemd's container range (up to
// 1879048191), below 2^31, and far from the process launcher's uids
// (localsandbox.DefaultSandboxID): 1879048192–1879048703.
const (
	DefaultFirstHostID = 1879048192
	DefaultHostIDSlots = 256
)

// hostIDsPerSandbox is how many host ids a sandbox's user namespace maps:
// its root and its user.
const hostIDsPerSandbox = 2

// runtimeTimeout bounds one runc command other than run (kill, delete,
// list, --version).
const runtimeTimeout = 30 * time.Second

// Config is what a Launcher needs.
type Config struct {
	// Image is the sandbox image, an OCI archive (make image writes
	// bin/belay-sandbox.oci.tar).
	Image string
	// ImageCache holds the unpacked images, one folder per image digest;
	// created (0711, root's) when absent. Every sandbox's user namespace
	// root (an unprivileged host id) mounts the image from there, so it
	// and every folder above it must be searchable by others (x, not
	// r): New says which one is not.
	ImageCache string
	// StateDir holds runc's state of this launcher's containers and the
	// lock that keeps a second launcher away; created (0700) when absent.
	StateDir string
	// WorkRoot holds one folder per sandbox (config.json, workspace/,
	// api/); created (0700) when absent. It must be root's and writable
	// only by root.
	WorkRoot string
	// Internal serves the control plane's internal routes; each sandbox
	// reaches it only through its api.sock.
	Internal http.Handler
	// Runtime is the runc binary; DefaultRuntime on PATH when empty.
	Runtime string
	// FirstHostID and HostIDSlots are the host ids the sandboxes' user
	// namespaces map to: HostIDSlots blocks of two uids (and the same
	// gids) from FirstHostID, leased host-wide (hostids.DefaultDir) as
	// the process launcher leases its uids. Zero means DefaultFirstHostID
	// and DefaultHostIDSlots.
	FirstHostID, HostIDSlots int
	// Profile is the hardening profile; hardening.Sandbox when nil.
	Profile *hardening.Profile
	// Logger receives one line per sandbox lifecycle step, with run_id;
	// never a claim code, token or file content.
	Logger *slog.Logger
	// Now is the clock for SandboxExit.Duration; nil means time.Now.
	Now func() time.Time
	// Rand is the entropy for sandbox names; nil means crypto/rand.
	Rand io.Reader
}

// Launcher starts sandboxes from the sandbox image under runc. It is safe
// for concurrent use.
type Launcher struct {
	runtime  string
	runcRoot string
	root     string // WorkRoot
	rootfs   string
	image    *Image
	profile  hardening.Profile
	ids      hostids.Range
	leaseDir string
	peerUID  int      // how belay's uid shows inside a sandbox's user namespace
	env      []string // the image's environment with HOME
	internal http.Handler
	log      *slog.Logger
	now      func() time.Time
	version  string
	lock     *os.File

	randMu sync.Mutex
	rand   io.Reader
}

// New checks cfg and the machine (root, runc, the image), takes the state
// folder's lock, removes what a launcher that died left behind, and
// unpacks the image into the cache unless it is there already.
func New(cfg Config) (*Launcher, error) {
	l := &Launcher{
		internal: cfg.Internal,
		log:      cfg.Logger,
		now:      cfg.Now,
		rand:     cfg.Rand,
		profile:  hardening.Sandbox,
	}
	if cfg.Profile != nil {
		l.profile = *cfg.Profile
	}
	l.ids = hostids.Range{FirstUID: cfg.FirstHostID, FirstGID: cfg.FirstHostID, Slots: cfg.HostIDSlots, Width: hostIDsPerSandbox}
	if l.ids.FirstUID == 0 {
		l.ids.FirstUID, l.ids.FirstGID = DefaultFirstHostID, DefaultFirstHostID
	}
	if l.ids.Slots == 0 {
		l.ids.Slots = DefaultHostIDSlots
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.rand == nil {
		l.rand = rand.Reader
	}
	switch {
	case cfg.Internal == nil:
		return nil, errors.New("ocisandbox: Config.Internal is required")
	case cfg.Image == "":
		return nil, errors.New("ocisandbox: Config.Image is required")
	case cfg.ImageCache == "" || cfg.StateDir == "" || cfg.WorkRoot == "":
		return nil, errors.New("ocisandbox: Config.ImageCache, StateDir and WorkRoot are required")
	case os.Geteuid() != 0:
		return nil, fmt.Errorf("the OCI launcher needs root: runc makes each sandbox's namespaces, mounts and cgroups (this process runs as uid %d)", os.Geteuid())
	}
	if err := l.ids.Check(); err != nil {
		return nil, fmt.Errorf("ocisandbox: %w", err)
	}
	overflow, err := overflowUID()
	if err != nil {
		return nil, err
	}
	l.peerUID = overflow
	l.leaseDir = hostids.DefaultDir
	if err := hostids.PrepareDir(l.leaseDir); err != nil {
		return nil, fmt.Errorf("ocisandbox: %w", err)
	}
	rt, err := FindRuntime(cfg.Runtime)
	if err != nil {
		return nil, err
	}
	l.runtime = rt
	img, err := OpenImage(cfg.Image)
	if err != nil {
		return nil, err
	}
	if err := CheckImage(img, l.profile); err != nil {
		return nil, err
	}
	l.image = img

	if cfg.ImageCache, err = rootOnlyDir(cfg.ImageCache, 0o711); err != nil {
		return nil, err
	}
	if err := searchableAbove(cfg.ImageCache); err != nil {
		return nil, err
	}
	for _, d := range []*string{&cfg.StateDir, &cfg.WorkRoot} {
		if *d, err = rootOnlyDir(*d, 0o700); err != nil {
			return nil, err
		}
	}
	l.root = cfg.WorkRoot
	l.runcRoot = filepath.Join(cfg.StateDir, "runc")
	if err := os.MkdirAll(l.runcRoot, 0o700); err != nil {
		return nil, fmt.Errorf("ocisandbox: %w", err)
	}
	if l.lock, err = lockDir(cfg.StateDir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			l.lock.Close()
		}
	}()
	out, err := l.runc(context.Background(), "--version")
	if err != nil {
		return nil, fmt.Errorf("ocisandbox: %s --version: %w", rt, err)
	}
	l.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	l.sweep()

	start := l.now()
	if l.rootfs, err = img.Unpack(cfg.ImageCache); err != nil {
		return nil, err
	}
	if err := searchableDown(cfg.ImageCache, l.rootfs); err != nil {
		return nil, err
	}
	if err := prepareMountPoints(l.rootfs, l.profile); err != nil {
		return nil, err
	}
	home, err := userHome(l.rootfs, l.profile.UID)
	if err != nil {
		return nil, err
	}
	l.env = imageEnv(img.Config.Config.Env, home)
	l.log.Info("OCI sandbox launcher ready", "image", cfg.Image, "digest", img.Digest,
		"architecture", img.Config.Architecture, "rootfs", l.rootfs, "runtime", rt, "runtime_version", l.version,
		"prepare", l.now().Sub(start).String())
	ok = true
	return l, nil
}

// FindRuntime returns the runc binary to run: path when set, else
// DefaultRuntime on PATH, with an error saying how to get it.
func FindRuntime(path string) (string, error) {
	if path == "" {
		path = DefaultRuntime
	}
	p, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("the OCI launcher needs runc, and %s was not found (Debian: apt-get install runc)", path)
	}
	return filepath.Abs(p)
}

// CheckImage checks that the image is what p describes and what this
// machine can run: its user and entrypoint are p's, it takes no default
// arguments, and it is built for this architecture.
func CheckImage(img *Image, p hardening.Profile) error {
	c := img.Config
	user := strconv.Itoa(p.UID) + ":" + strconv.Itoa(p.GID)
	switch {
	case c.OS != "linux":
		return fmt.Errorf("sandbox image %s is for %q, not linux", img.Archive, c.OS)
	case c.Architecture != runtime.GOARCH:
		return fmt.Errorf("sandbox image %s is built for %s and this machine runs %s: build one for it with make image", img.Archive, c.Architecture, runtime.GOARCH)
	case c.Config.User != user:
		return fmt.Errorf("sandbox image %s runs as user %q, the hardening profile says %q: rebuild it with make image", img.Archive, c.Config.User, user)
	case !slices.Equal(c.Config.Entrypoint, p.Entrypoint) || len(c.Config.Cmd) > 0:
		return fmt.Errorf("sandbox image %s starts %q %q, the hardening profile says %q with no arguments: rebuild it with make image", img.Archive, c.Config.Entrypoint, c.Config.Cmd, p.Entrypoint)
	}
	return nil
}

// Isolation lists the isolation measures applied to every sandbox, for
// `belay serve` to print.
func (l *Launcher) Isolation() []string {
	p := l.profile
	tmps := append([]string{p.TmpDir}, p.PrivateTmpDirs...)
	return []string{
		fmt.Sprintf("the sandbox image %s (%s) under %s", l.image.Digest, l.image.Config.Architecture, l.version),
		fmt.Sprintf("the entry as uid:gid %d:%d with no capabilities and no_new_privs, started as the Fargate task starts it (the image's entrypoint, claim mode)", p.UID, p.GID),
		fmt.Sprintf("a user namespace of its own: its root and its user are host ids of its own, leased host-wide (%s) from %d (%d sandboxes at most), so no other sandbox on this machine, of this belay or another, runs as them; an id that still owns a process, or files in a workspace left behind, is skipped",
			l.leaseDir, l.ids.FirstUID, l.ids.Slots),
		fmt.Sprintf("read-only root file system; writable only %s (the sandbox's own) and private tmpfs %s (%d MiB each), gone with the sandbox",
			p.WorkspaceDir, strings.Join(tmps, ", "), p.TmpSizeMiB),
		"new user, PID, mount, network (loopback only), IPC, UTS and cgroup namespaces; its own /proc; kernel paths masked or read-only",
		"Docker's default seccomp profile (unshare, mount, keyctl, bpf and the like refused)",
		fmt.Sprintf("limits: memory %d MiB (no swap, an OOM kill is reported), %.2g vCPU, %d processes (pids cgroup and nproc), %d open files, files up to %d MiB",
			p.MemoryMiB, float64(p.CPUUnits)/fargateCPUUnitsPerVCPU, p.Processes, p.OpenFiles, p.FileSizeMiB),
		"the control plane only through " + APISocketPath + " (root's, mounted read-only); no host socket or file system is visible",
	}
}

// NotApplied lists the isolation measures this launcher could not apply:
// none; New fails instead.
func (l *Launcher) NotApplied() []string { return nil }

// Image returns the image the launcher runs.
func (l *Launcher) Image() *Image { return l.image }

// Close releases the state folder's lock. Sandboxes still running are the
// caller's to stop first.
func (l *Launcher) Close() error { return l.lock.Close() }

// runc runs one runc command against this launcher's state root.
func (l *Launcher) runc(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, runtimeTimeout)
	defer cancel()
	if len(args) > 0 && args[0] != "--version" {
		args = append([]string{"--root", l.runcRoot}, args...)
	}
	cmd := exec.CommandContext(ctx, l.runtime, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return out, err
		}
		return out, fmt.Errorf("%w: %s", err, lastLine(msg))
	}
	return out, nil
}

// sweep kills and deletes every container in this launcher's state root
// and removes every sandbox folder in WorkRoot: holding the lock, the
// launcher owns them all, so they are what a launcher that died left.
func (l *Launcher) sweep() {
	out, err := l.runc(context.Background(), "list", "--quiet")
	if err != nil {
		l.log.Warn("list containers left behind", "err", err.Error())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		id := strings.TrimSpace(sc.Text())
		if id == "" {
			continue
		}
		if _, err := l.runc(context.Background(), "delete", "--force", id); err != nil {
			l.log.Warn("delete container left behind", "container", id, "err", err.Error())
			continue
		}
		l.log.Info("deleted a container left behind", "container", id)
	}
	ents, err := os.ReadDir(l.root)
	if err != nil {
		l.log.Warn("look for sandbox folders left behind", "err", err.Error())
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !isSandboxName(e.Name()) {
			continue
		}
		dir := filepath.Join(l.root, e.Name())
		if err := os.RemoveAll(dir); err != nil {
			l.log.Warn("remove sandbox folder left behind", "dir", dir, "err", err.Error())
			continue
		}
		l.log.Info("removed a sandbox folder left behind", "dir", dir)
	}
}

// rootOnlyDir makes dir (with mode perm) when absent and checks that it is
// root's and writable by nobody else; it returns its absolute, resolved
// path.
func rootOnlyDir(dir string, perm os.FileMode) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("ocisandbox: %s: %w", dir, err)
	}
	if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return "", fmt.Errorf("ocisandbox: create %s: %w", abs, err)
		}
		if err := os.Chmod(abs, perm); err != nil {
			return "", fmt.Errorf("ocisandbox: %w", err)
		}
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("ocisandbox: %s: %w", abs, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("ocisandbox: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return "", fmt.Errorf("ocisandbox: %s is not a directory", real)
	case st.Uid != 0:
		return "", fmt.Errorf("ocisandbox: %s is owned by uid %d; it must be root's", real, st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("ocisandbox: %s has mode %04o; it must not be writable by group or others", real, fi.Mode().Perm())
	}
	return real, nil
}

// searchableAbove checks that every folder above the image cache lets
// others search it: each sandbox's user namespace root, an unprivileged
// host id that runc's setup runs as, passes through them to mount the
// image. (The workspace and the socket folder need no such path: runc
// opens bind mount sources as root, before it enters the user namespace.)
func searchableAbove(cache string) error {
	for d := filepath.Dir(cache); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("ocisandbox: %w", err)
		}
		if perm := fi.Mode().Perm(); perm&0o001 == 0 {
			return fmt.Errorf("ocisandbox: each sandbox's user namespace root (an unprivileged host id) must reach the sandbox image in %s, and %s (mode %04o) does not let others search it: allow it (chmod o+x %s) or unpack the image below folders that do (belay serve --image-cache, BELAY_IMAGE_CACHE)", cache, d, perm, d)
		}
		if d == "/" {
			return nil
		}
	}
}

// searchableDown makes the launcher's folders from the cache down to the
// image's root searchable (not readable) by others, as searchableAbove
// says why; a cache unpacked before user namespaces has them 0700.
func searchableDown(cache, rootfs string) error {
	for d := filepath.Dir(rootfs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("ocisandbox: %w", err)
		}
		if perm := fi.Mode().Perm(); perm&0o011 != 0o011 {
			if err := os.Chmod(d, perm|0o011); err != nil {
				return fmt.Errorf("ocisandbox: %w", err)
			}
		}
		if d == cache || d == "/" {
			return nil
		}
	}
}

// overflowUID is the uid a process in a user namespace sees for a host uid
// its namespace does not map (nobody): belay's own uid, as the entry sees
// its socket peer.
func overflowUID() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/overflowuid")
	if err != nil {
		return 0, fmt.Errorf("ocisandbox: read the overflow uid: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// lockDir takes an exclusive lock on dir/lock, or says who has it.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ocisandbox: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("ocisandbox: another belay serve uses %s (its OCI sandboxes); give this one another data directory", dir)
		}
		return nil, fmt.Errorf("ocisandbox: lock %s: %w", dir, err)
	}
	return f, nil
}

// prepareMountPoints makes the folders the sandbox's mounts land on, in
// the unpacked root, so runc never has to create one in the shared tree.
func prepareMountPoints(rootfs string, p hardening.Profile) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("ocisandbox: %w", err)
	}
	defer root.Close()
	dirs := append([]string{p.WorkspaceDir, p.TmpDir, APISocketDir, "/proc", "/sys", "/dev"}, p.PrivateTmpDirs...)
	for _, d := range dirs {
		rel := strings.TrimPrefix(filepath.Clean(d), "/")
		if strings.HasPrefix(rel, "dev/") {
			continue // inside the /dev tmpfs
		}
		if err := root.MkdirAll(rel, 0o755); err != nil {
			return fmt.Errorf("ocisandbox: mount point %s in the image: %w", d, err)
		}
		// A mount point of the image's user (the workspace) would be a
		// folder in the shared tree that uid writes: on this host that
		// uid is nobody's in particular (sandboxes run as leased ids), so
		// it goes to root; the mount covers it anyway.
		if err := root.Lchown(rel, 0, 0); err != nil {
			return fmt.Errorf("ocisandbox: mount point %s in the image: %w", d, err)
		}
	}
	return nil
}

// userHome reads uid's home folder from the image's /etc/passwd, as a
// container runtime does to set HOME.
func userHome(rootfs string, uid int) (string, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return "", fmt.Errorf("ocisandbox: %w", err)
	}
	defer root.Close()
	b, err := root.ReadFile("etc/passwd")
	if err != nil {
		return "", fmt.Errorf("ocisandbox: the image's /etc/passwd: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 6 && f[2] == strconv.Itoa(uid) {
			return f[5], nil
		}
	}
	return "", fmt.Errorf("ocisandbox: the image's /etc/passwd has no user %d: rebuild it with make image", uid)
}

// imageEnv is the image's environment with HOME set, as a container
// runtime gives it.
func imageEnv(env []string, home string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return append(out, "HOME="+home)
}

// read fills b from the launcher's entropy.
func (l *Launcher) read(b []byte) error {
	l.randMu.Lock()
	defer l.randMu.Unlock()
	if _, err := io.ReadFull(l.rand, b); err != nil {
		return fmt.Errorf("ocisandbox: read entropy: %w", err)
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
