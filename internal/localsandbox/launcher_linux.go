package localsandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/hostids"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// entryName is the copy of the entry binary in WorkRoot/bin.
const entryName = "belay-sandbox"

// maxSocketPath is the longest path a Unix socket address can hold
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

// minRunIDRoom is how many bytes of run id a WorkRoot must leave room for
// in the socket path; belay's run ids are 30 bytes.
const minRunIDRoom = 32

// namespaceFlags are the namespaces a sandbox gets when they are available.
const namespaceFlags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// The isolation measures, as Isolation reports them.
const (
	measureProcessGroup = "own session and process group (no controlling terminal), killed with everything it started, and by the kernel if belay dies"
	measureEmptyEnv     = "empty environment (no token, no provider key, nothing from belay's environment)"
	measurePIDNS        = "PID namespace"
	measureMountNS      = "mount namespace"
	measureNetNS        = "network namespace (no network; the control plane only through api.sock)"
	measureIPCNS        = "IPC namespace"
	measureUTSNS        = "UTS namespace"
	measureLease        = "its uid and gid leased host-wide (" + DefaultLeaseDir + "), so no other sandbox on this machine, of this belay or another, runs as them at the same time; an id that still owns a process, or files in a workspace left behind, is skipped"
	measureWorkspace    = "a workspace folder of root's: the sandbox reads spec.json and connects to api.sock but cannot rename or replace them, nor the folder; it writes only in tokens/, repo/ and home/, and no folder above its repository is writable by any sandbox"
	// measurePeerUID is missing wherever the sandbox runs as belay's own
	// uid: the entry pins the api.sock it found at its start and checks its
	// listener's uid, but a process of the sandbox has that uid too.
	measurePeerUID = "the entry cannot tell belay's api.sock listener from a process of the sandbox by its uid (both run as this user)"
)

// WeakIsolation lists what a local process cannot get, whatever the
// launcher does: the isolation an operator accepts when choosing this
// launcher over the OCI one.
func WeakIsolation() []string {
	return []string{
		"a private /tmp, /var/tmp and /dev/shm: it shares the host's with the host and with every other sandbox",
		"its own /proc: the host's shows it the command line of every process on the machine",
		"a seccomp filter: every system call is open to it, unshare and mount included (it can make user namespaces)",
		"hiding the host's Unix sockets: any socket file on the machine that it can reach and write accepts its connections",
		"a memory limit for the sandbox as a whole (a cgroup): memory is limited per process, so several processes together can use more",
	}
}

// tier is one isolation setting the launcher may apply, strongest first.
// Every tier starts the entry with Setsid rather than only Setpgid: a new
// session is also a new process group (killed as one by Stop), and it has
// no controlling terminal, so a sandbox cannot open belay's terminal
// through /dev/tty and push keystrokes into it (TIOCSTI).
type tier struct {
	name    string
	applied []string
	missing []string
	// dropsUID says whether the tier runs each sandbox as its own uid.
	dropsUID bool
	sysAttrs func(uid, gid int) *syscall.SysProcAttr
}

// Launcher starts local sandboxes. It is safe for concurrent use.
type Launcher struct {
	entry    string
	root     string
	internal http.Handler
	uid, gid int // the first of the uids and gids sandboxes run as
	ids      int // how many
	asRoot   bool
	tier     tier
	leaseDir string   // where uids are leased, when the tier drops to them
	prlimit  string   // prlimit(1), or "" when the limits cannot be applied
	limits   []rlimit // applied to every sandbox through prlimit
	log      *slog.Logger
	now      func() time.Time

	randMu sync.Mutex
	rand   io.Reader
}

// New checks cfg, prepares WorkRoot (and, as root, the root-owned copy of
// the entry), finds out which isolation the machine allows and reports it
// in one log line, with a warning that says plainly what could not be
// applied and what that means.
func New(cfg Config) (*Launcher, error) {
	l := &Launcher{
		internal: cfg.Internal,
		uid:      cfg.UID,
		gid:      cfg.GID,
		ids:      cfg.UIDs,
		asRoot:   os.Geteuid() == 0,
		log:      cfg.Logger,
		now:      cfg.Now,
		rand:     cfg.Rand,
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
	if l.uid == 0 {
		l.uid = DefaultSandboxID
	}
	if l.gid == 0 {
		l.gid = DefaultSandboxID
	}
	if l.ids == 0 {
		l.ids = DefaultSandboxIDs
	}
	switch {
	case cfg.Internal == nil:
		return nil, errors.New("localsandbox: Config.Internal is required")
	case cfg.EntryPath == "":
		return nil, errors.New("localsandbox: Config.EntryPath is required")
	case cfg.WorkRoot == "":
		return nil, errors.New("localsandbox: Config.WorkRoot is required")
	case l.uid < 0 || l.gid < 0 || l.ids < 0:
		return nil, fmt.Errorf("localsandbox: sandbox uid:gid %d:%d (count %d) is negative", l.uid, l.gid, l.ids)
	case uint64(l.uid)+uint64(l.ids) > 1<<31 || uint64(l.gid)+uint64(l.ids) > 1<<31:
		return nil, fmt.Errorf("localsandbox: sandbox uids %d and gids %d plus %d run past the largest id", l.uid, l.gid, l.ids)
	}
	isolation := cfg.Isolation
	if isolation == "" {
		isolation = IsolationAuto
	}
	if isolation != IsolationAuto && isolation != IsolationNone {
		return nil, fmt.Errorf("localsandbox: isolation %q is neither %q nor %q", cfg.Isolation, IsolationAuto, IsolationNone)
	}

	root, err := l.prepareWorkRoot(cfg.WorkRoot)
	if err != nil {
		return nil, err
	}
	l.root = root
	if room := maxSocketPath - len(root) - len("/-") - 2*workspaceSuffixBytes - len("/"+workspace.Socket); room < minRunIDRoom {
		return nil, fmt.Errorf("localsandbox: WorkRoot %s is too long: a Unix socket path in it leaves room for a run id of only %d bytes (need %d); choose a shorter directory", root, room, minRunIDRoom)
	}
	if l.entry, err = l.prepareEntry(cfg.EntryPath); err != nil {
		return nil, err
	}
	l.sweepStale()

	var tiers []tier
	if isolation == IsolationAuto {
		tiers = l.autoTiers()
	}
	tiers = append(tiers, l.noneTier())
	var refused []string
	for i, t := range tiers {
		if i == len(tiers)-1 {
			l.tier = t
			break
		}
		if err := l.probe(t); err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", t.name, err))
			continue
		}
		l.tier = t
		break
	}
	if l.tier.dropsUID {
		l.leaseDir = DefaultLeaseDir
		if err := hostids.PrepareDir(l.leaseDir); err != nil {
			return nil, fmt.Errorf("localsandbox: %w", err)
		}
	}
	l.tier = l.withExtras(l.tier, cfg.Limits)
	l.report(isolation, refused)
	return l, nil
}

// withExtras completes t with what every tier gets besides its namespaces
// and uid: the workspace layout and uid leases where sandboxes have uids
// of their own, the resource limits, and what no local process can get.
func (l *Launcher) withExtras(t tier, profile *hardening.Profile) tier {
	t.applied = append([]string(nil), t.applied...)
	t.missing = append([]string(nil), t.missing...)
	if t.dropsUID {
		t.applied = append(t.applied, measureLease, measureWorkspace)
	}
	if profile == nil {
		profile = &hardening.Sandbox
	}
	lims, what := sandboxLimits(*profile, t.dropsUID)
	switch p, err := findPrlimit(); {
	case err != nil:
		t.missing = append(t.missing, "resource limits (processes, file size, memory, open files): "+err.Error())
	default:
		l.prlimit, l.limits = p, lims
		t.applied = append(t.applied, what)
		if !t.dropsUID {
			t.missing = append(t.missing, "a process limit (RLIMIT_NPROC): it counts every process of a uid, and sandboxes have no uid of their own here")
		}
	}
	t.missing = append(t.missing, WeakIsolation()...)
	return t
}

// Isolation lists the isolation measures applied to every sandbox, for
// `belay serve` to print.
func (l *Launcher) Isolation() []string {
	return append([]string(nil), l.tier.applied...)
}

// NotApplied lists the isolation measures that no sandbox of this launcher
// gets: what its tier could not apply, then WeakIsolation.
func (l *Launcher) NotApplied() []string {
	return append([]string(nil), l.tier.missing...)
}

func (l *Launcher) report(isolation string, refused []string) {
	l.log.Info("local sandbox isolation", "mode", isolation, "tier", l.tier.name,
		"applied", strings.Join(l.tier.applied, "; "))
	attrs := []any{"mode", isolation, "not_applied", strings.Join(l.tier.missing, "; ")}
	if len(refused) > 0 {
		attrs = append(attrs, "refused", strings.Join(refused, "; "))
	}
	var plainly string
	switch {
	case isolation == IsolationNone && l.asRoot:
		plainly = "isolation is off (mode none): the sandbox runs as root (uid 0), sees belay's processes and can reach the network"
	case isolation == IsolationNone:
		plainly = fmt.Sprintf("isolation is off (mode none): the sandbox runs as this user (uid %d), can read what this user can read, and can reach the network", os.Getuid())
	case l.tier.name == tierRootNS:
		plainly = "a local process has no private /tmp, no /proc of its own, no seccomp filter and no view without the host's Unix sockets: a sandbox can read what others leave in /tmp, see every process's command line, use every system call and connect to the host's reachable Unix sockets"
	case l.asRoot:
		plainly = fmt.Sprintf("namespaces could not be created: each sandbox runs as its own uid (from %d) but shares belay's network and process view", l.uid)
	case l.tier.name == tierUserNS:
		plainly = fmt.Sprintf("not running as root: the sandbox runs as this user (uid %d) inside its own user namespace, so it cannot be moved to another uid; it can read what this user can read", os.Getuid())
	default:
		plainly = fmt.Sprintf("not running as root and no user namespace could be created: the sandbox runs as this user (uid %d) without namespaces, can read what this user can read, and can reach the network", os.Getuid())
	}
	l.log.Warn("local sandbox: "+plainly, attrs...)
}

const (
	tierRootNS  = "root: uid drop and namespaces"
	tierRootUID = "root: uid drop only"
	tierUserNS  = "unprivileged user namespace"
	tierNone    = "none"
)

func (l *Launcher) autoTiers() []tier {
	namespaces := []string{measurePIDNS, measureMountNS, measureNetNS, measureIPCNS, measureUTSNS}
	always := []string{measureProcessGroup, measureEmptyEnv}
	if l.asRoot {
		uidDrop := fmt.Sprintf("each sandbox runs as a uid:gid of its own from %d:%d to %d:%d, with no supplementary groups and no capabilities",
			l.uid, l.gid, l.uid+l.ids-1, l.gid+l.ids-1)
		cred := func(uid, gid int) *syscall.Credential {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		}
		return []tier{
			{
				name:     tierRootNS,
				applied:  append(append([]string{uidDrop}, namespaces...), always...),
				dropsUID: true,
				sysAttrs: func(uid, gid int) *syscall.SysProcAttr {
					return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL,
						Credential: cred(uid, gid), Cloneflags: namespaceFlags}
				},
			},
			{
				name:     tierRootUID,
				applied:  append([]string{uidDrop}, always...),
				missing:  namespaces,
				dropsUID: true,
				sysAttrs: func(uid, gid int) *syscall.SysProcAttr {
					return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Credential: cred(uid, gid)}
				},
			},
		}
	}
	uid, gid := os.Getuid(), os.Getgid()
	return []tier{{
		name: tierUserNS,
		applied: append(append([]string{fmt.Sprintf("user namespace (uid %d mapped to itself, no capabilities)", uid)},
			namespaces...), always...),
		missing: []string{fmt.Sprintf("uid drop (not root: runs as this user, uid %d)", uid), measurePeerUID},
		sysAttrs: func(int, int) *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL,
				Cloneflags:                 syscall.CLONE_NEWUSER | namespaceFlags,
				UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
				GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
				GidMappingsEnableSetgroups: false,
			}
		},
	}}
}

func (l *Launcher) noneTier() tier {
	missing := []string{measurePIDNS, measureMountNS, measureNetNS, measureIPCNS, measureUTSNS}
	if l.asRoot {
		missing = append([]string{fmt.Sprintf("uid drop (runs as root, not as uid %d)", l.uid)}, missing...)
	} else {
		missing = append([]string{fmt.Sprintf("uid drop (not root: runs as this user, uid %d)", os.Getuid()), "user namespace"}, missing...)
	}
	missing = append(missing, measurePeerUID)
	return tier{
		name:    tierNone,
		applied: []string{measureProcessGroup, measureEmptyEnv},
		missing: missing,
		sysAttrs: func(int, int) *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
		},
	}
}

// probe finds out whether the kernel lets this process start a child with
// t's attributes. The child execs a file that does not exist, in a
// directory the sandbox user can search: ENOENT from the exec means the
// kernel created the namespaces and changed the credentials (both happen
// before the exec) and no code ran at all.
func (l *Launcher) probe(t tier) error {
	var b [workspaceSuffixBytes]byte
	if err := l.read(b[:]); err != nil {
		return err
	}
	cmd := &exec.Cmd{
		Path:        filepath.Join(l.root, fmt.Sprintf(".probe-absent-%x", b)),
		Env:         []string{},
		Dir:         "/",
		SysProcAttr: t.sysAttrs(l.uid, l.gid),
	}
	cmd.Args = []string{cmd.Path}
	err := cmd.Start()
	if err == nil {
		// Something was there after all; do not let it run.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return errors.New("probe target unexpectedly exists")
	}
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err
}

// prepareWorkRoot creates WorkRoot when absent and checks it. The
// directory must be belay's alone (mode 0711 as root, 0700 otherwise,
// when created here), and no directory on the way to it may be writable
// by every user; as root every one must also be searchable by others (the
// sandbox uids) and writable by no sandbox user (see checkAncestors). New
// says which directory to fix rather than changing the operator's
// directories.
func (l *Launcher) prepareWorkRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("localsandbox: WorkRoot %s: %w", dir, err)
	}
	mode := os.FileMode(0o700)
	if l.asRoot {
		mode = 0o711
	}
	if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(abs, mode); err != nil {
			return "", fmt.Errorf("localsandbox: create WorkRoot: %w", err)
		}
		// MkdirAll applies the umask.
		if err := os.Chmod(abs, mode); err != nil {
			return "", fmt.Errorf("localsandbox: create WorkRoot: %w", err)
		}
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("localsandbox: WorkRoot %s: %w", abs, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("localsandbox: WorkRoot %s: %w", real, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return "", fmt.Errorf("localsandbox: WorkRoot %s is not a directory", real)
	case st.Uid != uint32(os.Geteuid()):
		return "", fmt.Errorf("localsandbox: WorkRoot %s is owned by uid %d; it must be owned by uid %d (belay)", real, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("localsandbox: WorkRoot %s has mode %04o; it must not be writable by group or others", real, fi.Mode().Perm())
	}
	if err := l.checkAncestors(real); err != nil {
		return "", err
	}
	return real, nil
}

// prepareEntry returns the path of the entry binary to start. As root it
// copies the binary into WorkRoot/bin (0711) as a root-owned 0555 file,
// written under a temporary name and renamed into place, so a sandbox that
// is still running the previous copy is not disturbed.
func (l *Launcher) prepareEntry(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("localsandbox: entry %s: %w", path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("localsandbox: entry: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("localsandbox: entry %s is not a regular file", abs)
	}
	if !l.asRoot {
		if fi.Mode().Perm()&0o100 == 0 {
			return "", fmt.Errorf("localsandbox: entry %s is not executable", abs)
		}
		return abs, nil
	}
	bin := filepath.Join(l.root, "bin")
	if err := os.Mkdir(bin, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("localsandbox: create %s: %w", bin, err)
	}
	if err := os.Lchown(bin, 0, 0); err != nil {
		return "", fmt.Errorf("localsandbox: chown %s: %w", bin, err)
	}
	if err := os.Chmod(bin, 0o711); err != nil {
		return "", fmt.Errorf("localsandbox: chmod %s: %w", bin, err)
	}
	var b [workspaceSuffixBytes]byte
	if err := l.read(b[:]); err != nil {
		return "", err
	}
	dst := filepath.Join(bin, entryName)
	tmp := filepath.Join(bin, fmt.Sprintf(".%s-%x", entryName, b))
	if err := copyExecutable(abs, tmp); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("localsandbox: copy entry %s: %w", abs, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("localsandbox: install entry: %w", err)
	}
	return dst, nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chown(0, 0); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(0o555); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sweepStale removes workspaces left behind by a belay process that died
// before it could clean up: their sandboxes died with it (parent-death
// signal), but token files the entry never read may still be there. A
// workspace is stale when nothing answers on its api.sock; a live launcher
// sharing WorkRoot always has a listener there.
func (l *Launcher) sweepStale() {
	ents, err := os.ReadDir(l.root)
	if err != nil {
		l.log.Warn("look for stale sandbox workspaces", "err", err.Error())
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !isWorkspaceName(e.Name()) {
			continue
		}
		ws := filepath.Join(l.root, e.Name())
		if c, err := net.Dial("unix", filepath.Join(ws, workspace.Socket)); err == nil {
			c.Close()
			continue
		}
		if err := removeTree(ws); err != nil {
			l.log.Warn("remove stale sandbox workspace", "workspace", ws, "err", err.Error())
			continue
		}
		l.log.Info("removed stale sandbox workspace", "workspace", ws)
	}
}

// isWorkspaceName reports whether name is what Launch names a workspace:
// a run id, a dash, and the hex suffix.
func isWorkspaceName(name string) bool {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || len(name)-i-1 != 2*workspaceSuffixBytes || checkRunID(name[:i]) != nil {
		return false
	}
	_, err := hex.DecodeString(name[i+1:])
	return err == nil && strings.ToLower(name[i+1:]) == name[i+1:]
}

// read fills b from the launcher's entropy.
func (l *Launcher) read(b []byte) error {
	l.randMu.Lock()
	defer l.randMu.Unlock()
	if _, err := io.ReadFull(l.rand, b); err != nil {
		return fmt.Errorf("localsandbox: read entropy: %w", err)
	}
	return nil
}
