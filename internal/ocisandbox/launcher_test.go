package ocisandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/ocisandbox"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
)

// newLauncher starts a launcher on the real image with profile p (nil:
// hardening.Sandbox) and a handler that answers every internal request
// with 204, in folders of the test's own.
func newLauncher(t *testing.T, p *hardening.Profile) *ocisandbox.Launcher {
	t.Helper()
	img := ocisandboxtest.Image(t)
	dir := t.TempDir()
	l, err := ocisandbox.New(ocisandbox.Config{
		Image:      img,
		ImageCache: ocisandboxtest.Cache(t),
		StateDir:   filepath.Join(dir, "state"),
		WorkRoot:   filepath.Join(dir, "sandboxes"),
		Internal:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		Profile:    p,
		Logger:     slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatalf("ocisandbox.New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// runCommand runs args in a sandbox to its end and returns how it ended
// and what it printed.
func runCommand(t *testing.T, l *ocisandbox.Launcher, args ...string) (exitCode int, signaled, oom bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := l.StartCommand(ctx, "run_probe", args, nil)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	exit, err := s.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return exit.ExitCode, exit.Signaled, exit.OOMKilled, s.OutputTail()
}

// probe is run by the image's python3 as the sandbox's only process; it
// reports what the sandbox can see and do as one JSON line.
const probe = `
import ctypes, errno, json, os, socket, stat, subprocess, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
out = {}
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    out[k] = status[k].strip()
out["uid"], out["gid"], out["groups"] = os.getuid(), os.getgid(), os.getgroups()
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
out["write_root"] = attempt(lambda: open("/probe-was-here", "w"))
out["write_usr"] = attempt(lambda: open("/usr/bin/probe", "w"))
out["write_tmp"] = attempt(lambda: open("/tmp/probe", "w").write("x"))
out["write_workspace"] = attempt(lambda: open("/workspace/probe", "w").write("x"))
out["tmp_before"] = sorted(set(os.listdir("/tmp")) - {"probe"})
out["interfaces"] = sorted(os.listdir("/sys/class/net"))
out["tcp"] = {}
for hp in cfg["tcp"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(2)
    out["tcp"][hp] = attempt(lambda: s.connect((hp.rsplit(":", 1)[0], int(hp.rsplit(":", 1)[1]))))
def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2)
    s.connect(path)
out["unix_file"] = attempt(lambda: unix(cfg["unix"]))
out["unix_abstract"] = attempt(lambda: unix("\0" + cfg["abstract"]))
out["sockets_visible"] = []
for d, _, files in os.walk("/"):
    if d.startswith(("/proc", "/sys", "/dev")):
        continue
    for f in files:
        p = os.path.join(d, f)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                out["sockets_visible"].append(p)
        except OSError:
            pass
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["cmdlines"] = [open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ").decode() for p in out["pids"] if os.path.exists("/proc/%s/cmdline" % p)]
libc.unshare.argtypes = [ctypes.c_int]
out["unshare_user"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
out["unshare_mount"] = "ok" if libc.unshare(0x00020000) == 0 else errno.errorcode[ctypes.get_errno()]
out["mount"] = "ok" if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 else errno.errorcode[ctypes.get_errno()]
r = subprocess.run(["unshare", "-Ur", "id", "-u"], capture_output=True, text=True)
out["unshare_cmd"] = [r.returncode, r.stdout.strip()]
setid = []
for d, _, files in os.walk("/", onerror=None):
    if d.startswith(("/proc", "/sys", "/dev")):
        continue
    for f in files:
        try:
            m = os.lstat(os.path.join(d, f)).st_mode
        except OSError:
            continue
        if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):
            setid.append(os.path.join(d, f))
out["setid"] = setid
for d in ["/tmp", "/var/tmp", "/dev/shm"]:
    v = os.statvfs(d)
    out["size " + d] = v.f_blocks * v.f_frsize
out["hostname"] = socket.gethostname()
out["api_socket"] = [oct(os.lstat(cfg["socket"]).st_mode), attempt(lambda: os.rename(cfg["socket"], cfg["socket"] + ".x")),
                     attempt(lambda: os.unlink(cfg["socket"])), attempt(lambda: unix(cfg["socket"]))]
print("PROBE " + json.dumps(out), flush=True)
`

type probeResult struct {
	CapInh, CapPrm, CapEff, CapBnd, CapAmb string
	NoNewPrivs, Seccomp                    string
	UID                                    int               `json:"uid"`
	GID                                    int               `json:"gid"`
	Groups                                 []int             `json:"groups"`
	WriteRoot                              string            `json:"write_root"`
	WriteUsr                               string            `json:"write_usr"`
	WriteTmp                               string            `json:"write_tmp"`
	WriteWorkspace                         string            `json:"write_workspace"`
	TmpBefore                              []string          `json:"tmp_before"`
	Interfaces                             []string          `json:"interfaces"`
	TCP                                    map[string]string `json:"tcp"`
	UnixFile                               string            `json:"unix_file"`
	UnixAbstract                           string            `json:"unix_abstract"`
	SocketsVisible                         []string          `json:"sockets_visible"`
	PIDs                                   []int             `json:"pids"`
	Cmdlines                               []string          `json:"cmdlines"`
	UnshareUser                            string            `json:"unshare_user"`
	UnshareMount                           string            `json:"unshare_mount"`
	Mount                                  string            `json:"mount"`
	UnshareCmd                             []any             `json:"unshare_cmd"`
	SetID                                  []string          `json:"setid"`
	TmpSize                                int64             `json:"size /tmp"`
	VarTmpSize                             int64             `json:"size /var/tmp"`
	ShmSize                                int64             `json:"size /dev/shm"`
	Hostname                               string            `json:"hostname"`
	APISocket                              []string          `json:"api_socket"`
}

// TestProbe runs the probe as the sandbox's process and checks every
// isolation measure from inside: the user, capabilities, no_new_privs,
// seccomp, the read-only root, the network (loopback only: a listener on
// the host is out of reach), the host's Unix sockets (a 0777 one in the
// host's /tmp and an abstract one), its own /proc, unshare and mount,
// setuid files, the private size-capped scratch folders, and api.sock,
// which it can connect to but not rename or remove.
func TestProbe(t *testing.T) {
	l := newLauncher(t, nil)

	// A host listener on every address the host has: none may be reached.
	var tcp []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		ln, err := net.Listen("tcp4", net.JoinHostPort(ipn.IP.String(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go acceptAll(ln)
		tcp = append(tcp, ln.Addr().String())
	}
	// A host Unix socket anyone may use, and an abstract one.
	hostSock := filepath.Join(os.TempDir(), fmt.Sprintf("belay-probe-%d.sock", os.Getpid()))
	_ = os.Remove(hostSock)
	uln, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uln.Close() })
	if err := os.Chmod(hostSock, 0o777); err != nil {
		t.Fatal(err)
	}
	go acceptAll(uln)
	abstract := fmt.Sprintf("belay-probe-%d", os.Getpid())
	aln, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { aln.Close() })
	go acceptAll(aln)
	// Check that the host itself can reach them, so refusals below mean
	// something.
	for _, a := range tcp {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			t.Fatalf("the host cannot reach its own listener %s: %v", a, err)
		}
		c.Close()
	}

	cfg, _ := json.Marshal(map[string]any{"tcp": tcp, "unix": hostSock, "abstract": abstract, "socket": ocisandbox.APISocketPath})
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", probe, string(cfg))
	r := parseProbe(t, out)
	if code != 0 {
		t.Errorf("probe exited %d", code)
	}
	p := hardening.Sandbox
	if r.UID != p.UID || r.GID != p.GID || len(r.Groups) > 1 || (len(r.Groups) == 1 && r.Groups[0] != p.GID) {
		t.Errorf("uid %d gid %d groups %v, want %d:%d and no other group", r.UID, r.GID, r.Groups, p.UID, p.GID)
	}
	for name, v := range map[string]string{"CapInh": r.CapInh, "CapPrm": r.CapPrm, "CapEff": r.CapEff, "CapBnd": r.CapBnd, "CapAmb": r.CapAmb} {
		if v != "0000000000000000" {
			t.Errorf("%s = %s, want 0", name, v)
		}
	}
	if r.NoNewPrivs != "1" || r.Seccomp != "2" {
		t.Errorf("NoNewPrivs %s, Seccomp %s; want 1 and 2 (filter)", r.NoNewPrivs, r.Seccomp)
	}
	if r.WriteRoot != "EROFS" || r.WriteUsr != "EROFS" {
		t.Errorf("writing / gave %s, /usr/bin gave %s; want EROFS (read-only root)", r.WriteRoot, r.WriteUsr)
	}
	if r.WriteTmp != "ok" || r.WriteWorkspace != "ok" {
		t.Errorf("writing /tmp gave %s, /workspace gave %s; want both writable", r.WriteTmp, r.WriteWorkspace)
	}
	if len(r.Interfaces) != 1 || r.Interfaces[0] != "lo" {
		t.Errorf("interfaces %v, want only lo", r.Interfaces)
	}
	if len(tcp) == 0 {
		t.Fatal("no host address to listen on")
	}
	for a, res := range r.TCP {
		if res == "ok" {
			t.Errorf("the sandbox connected to the host's listener %s", a)
		}
	}
	if r.UnixFile != "ENOENT" {
		t.Errorf("the host's 0777 socket %s: %s, want ENOENT (invisible)", hostSock, r.UnixFile)
	}
	if r.UnixAbstract == "ok" {
		t.Errorf("the host's abstract socket @%s was reached", abstract)
	}
	if len(r.SocketsVisible) != 1 || r.SocketsVisible[0] != ocisandbox.APISocketPath {
		t.Errorf("sockets visible in the file system: %v, want only %s", r.SocketsVisible, ocisandbox.APISocketPath)
	}
	// The probe is PID 1 and its unshare child is gone: /proc shows the
	// probe alone.
	if len(r.PIDs) != 1 || r.PIDs[0] != 1 {
		t.Errorf("/proc shows pids %v (%q); want only the sandbox's own (1)", r.PIDs, r.Cmdlines)
	}
	if r.UnshareUser != "EPERM" || r.UnshareMount != "EPERM" || r.Mount != "EPERM" {
		t.Errorf("unshare(user) %s, unshare(mount) %s, mount %s; want EPERM from seccomp", r.UnshareUser, r.UnshareMount, r.Mount)
	}
	if len(r.UnshareCmd) != 2 || r.UnshareCmd[0] == float64(0) {
		t.Errorf("unshare -Ur id -u = %v, want a failure", r.UnshareCmd)
	}
	if len(r.SetID) != 0 {
		t.Errorf("setuid or setgid files in the image: %v", r.SetID)
	}
	want := int64(p.TmpSizeMiB) << 20
	if r.TmpSize != want || r.VarTmpSize != want || r.ShmSize != want {
		t.Errorf("/tmp %d, /var/tmp %d, /dev/shm %d bytes; want %d each", r.TmpSize, r.VarTmpSize, r.ShmSize, want)
	}
	if len(r.TmpBefore) != 0 {
		t.Errorf("/tmp was not empty: %v", r.TmpBefore)
	}
	if r.Hostname != p.Hostname {
		t.Errorf("hostname %q, want %q", r.Hostname, p.Hostname)
	}
	if len(r.APISocket) != 4 || r.APISocket[1] != "EROFS" || r.APISocket[2] != "EROFS" || r.APISocket[3] != "ok" {
		t.Errorf("api.sock: mode, rename, unlink, connect = %v; want EROFS, EROFS, ok", r.APISocket)
	}
}

// TestScratchIsPrivate runs two sandboxes one after the other: what the
// first leaves in /tmp, /var/tmp and /dev/shm is not there for the second.
func TestScratchIsPrivate(t *testing.T) {
	l := newLauncher(t, nil)
	const write = `for d in /tmp /var/tmp /dev/shm; do echo secret > $d/left-behind || exit 1; done; ls /tmp /var/tmp /dev/shm`
	if code, _, _, out := runCommand(t, l, "/bin/sh", "-c", write); code != 0 {
		t.Fatalf("first sandbox exited %d: %s", code, out)
	}
	code, _, _, out := runCommand(t, l, "/bin/sh", "-c", `cat /tmp/left-behind /var/tmp/left-behind /dev/shm/left-behind 2>&1; exit 0`)
	if code != 0 || strings.Contains(out, "secret") || strings.Count(out, "No such file") != 3 {
		t.Errorf("second sandbox read (exit %d): %q; want three missing files", code, out)
	}
}

// TestMemoryLimit allocates past a (small) memory limit: the kernel kills
// the process, and the exit says it was for memory.
func TestMemoryLimit(t *testing.T) {
	p := hardening.Sandbox
	p.MemoryMiB = 128
	l := newLauncher(t, &p)
	code, signaled, oom, out := runCommand(t, l, "/usr/bin/python3", "-c", "b = bytearray(512 << 20); print('allocated', flush=True)")
	if !oom || !signaled || code != 128+9 {
		t.Errorf("exit %d, signaled %v, OOM killed %v (output %q); want killed by SIGKILL at the memory limit", code, signaled, oom, out)
	}
	if strings.Contains(out, "allocated") {
		t.Error("the allocation past the limit succeeded")
	}
	// Under the limit nothing is reported.
	code, _, oom, out = runCommand(t, l, "/usr/bin/python3", "-c", "b = bytearray(16 << 20)")
	if code != 0 || oom {
		t.Errorf("a small allocation: exit %d, OOM killed %v (%q)", code, oom, out)
	}
}

// TestProcessLimit forks until the kernel refuses: the sandbox never holds
// more processes than the profile allows.
func TestProcessLimit(t *testing.T) {
	p := hardening.Sandbox
	p.Processes = 40
	l := newLauncher(t, &p)
	const forker = `
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print("refused after", n, e.errno, flush=True)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
`
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", forker)
	var n, errno int
	if _, err := fmt.Sscanf(strings.TrimSpace(lastOutputLine(out)), "refused after %d %d", &n, &errno); err != nil {
		t.Fatalf("exit %d, output %q: %v", code, out, err)
	}
	if n >= p.Processes || n < p.Processes-5 || errno != 11 {
		t.Errorf("forked %d processes before EAGAIN (errno %d); want just under %d", n, errno, p.Processes)
	}
}

// TestFileSizeLimit writes past a (small) file size limit.
func TestFileSizeLimit(t *testing.T) {
	p := hardening.Sandbox
	p.FileSizeMiB = 1
	l := newLauncher(t, &p)
	code, _, _, out := runCommand(t, l, "/usr/bin/python3", "-c", `
import errno
try:
    open("/workspace/big", "wb").write(b"x" * (2 << 20))
    print("wrote")
except OSError as e:
    print("refused", errno.errorcode[e.errno])
`)
	if code != 0 || !strings.Contains(out, "refused EFBIG") {
		t.Errorf("exit %d, output %q; want EFBIG", code, out)
	}
}

func parseProbe(t *testing.T, out string) probeResult {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if j, ok := strings.CutPrefix(line, "PROBE "); ok {
			t.Logf("probe: %s", j)
			var r probeResult
			if err := json.Unmarshal([]byte(j), &r); err != nil {
				t.Fatalf("probe output: %v\n%s", err, j)
			}
			return r
		}
	}
	t.Fatalf("the probe printed no result:\n%s", out)
	return probeResult{}
}

func lastOutputLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func acceptAll(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// TestStopAndCleanup stops a sandbox that would run for a minute: Stop
// kills it, Cleanup removes its folder and runc keeps no container.
func TestStopAndCleanup(t *testing.T) {
	l := newLauncher(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := l.StartCommand(ctx, "run_stop", []string{"/bin/sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Workspace(), "..", "config.json")); !os.IsNotExist(err) {
		t.Errorf("config.json (which holds the claim code) is still there after the start: %v", err)
	}
	start := time.Now()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	exit, err := s.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !exit.Signaled || exit.OOMKilled || time.Since(start) > 30*time.Second {
		t.Errorf("exit %+v after Stop; want killed by a signal, not OOM", exit)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.Workspace())); !os.IsNotExist(err) {
		t.Errorf("the sandbox folder is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/belay", s.ID())); !os.IsNotExist(err) {
		t.Errorf("the sandbox's cgroup is still there: %v", err)
	}
}

// TestLaunchFailureSaysWhy starts a program the image does not have.
func TestLaunchFailureSaysWhy(t *testing.T) {
	l := newLauncher(t, nil)
	_, err := l.StartCommand(context.Background(), "run_missing", []string{"/no/such/program"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("err = %v, want runc's reason (no such file)", err)
	}
}

// TestOneLauncherPerStateDir: a second launcher on the same state folder
// is refused, and once the first is gone, a new one removes what it left.
func TestOneLauncherPerStateDir(t *testing.T) {
	img := ocisandboxtest.Image(t)
	dir := t.TempDir()
	cfg := ocisandbox.Config{
		Image:      img,
		ImageCache: ocisandboxtest.Cache(t),
		StateDir:   filepath.Join(dir, "state"),
		WorkRoot:   filepath.Join(dir, "sandboxes"),
		Internal:   http.NotFoundHandler(),
	}
	first, err := ocisandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ocisandbox.New(cfg); err == nil || !strings.Contains(err.Error(), "another belay serve") {
		t.Errorf("second launcher: err = %v, want a refusal", err)
	}
	s, err := first.StartCommand(context.Background(), "run_left", []string{"/bin/sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first launcher dies without cleaning up.
	first.Close()
	if _, err := ocisandbox.New(cfg); err != nil {
		t.Fatalf("launcher after the first died: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Wait(ctx); err != nil {
		t.Errorf("the sandbox left behind was not ended: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.Workspace())); !os.IsNotExist(err) {
		t.Errorf("the folder left behind is still there: %v", err)
	}
}
