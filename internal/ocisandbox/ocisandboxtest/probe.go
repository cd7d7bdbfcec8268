package ocisandboxtest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/hardening"
)

// ProbeScript is a Python program for the image's python3: run inside a
// sandbox with one argument (Targets' JSON), it reports on one line,
// "PROBE {...}", what the sandbox is and can reach: its user,
// capabilities, no_new_privs and seccomp state, whether / is writable, its
// interfaces, TCP connects to the host's listeners, connects to a host
// Unix socket (by path and abstract), the sockets it can see, the
// processes in its /proc, unshare and mount, setuid files, the sizes of
// its scratch folders, what it finds in them, its hostname, whether it can
// rename or remove api.sock, and whether a claim code is in its
// environment or the entry's.
const ProbeScript = `
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
out["scratch_before"] = sorted(p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in (os.path.join(d, n) for n in os.listdir(d)))
out["write_root"] = attempt(lambda: open("/probe-was-here", "w"))
out["write_usr"] = attempt(lambda: open("/usr/bin/probe", "w"))
out["write_above_workspace"] = attempt(lambda: open("/conftest.py", "w"))
out["write_tmp"] = attempt(lambda: open("/tmp/probe", "w").write("x"))
out["write_workspace"] = attempt(lambda: open(os.path.join(cfg["workspace"], "probe"), "w").write("x"))
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
setid = []
for d, _, files in os.walk("/"):
    if d.startswith(("/proc", "/sys", "/dev")):
        continue
    for f in files:
        p = os.path.join(d, f)
        try:
            m = os.lstat(p).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(m):
            out["sockets_visible"].append(p)
        if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):
            setid.append(p)
out["setid"] = setid
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["cmdlines"] = []
for p in out["pids"]:
    try:
        out["cmdlines"].append(open("/proc/%d/cmdline" % p, "rb").read().split(b"\0")[0].decode())
    except OSError:
        pass
out["entry_environ"] = attempt(lambda: open("/proc/1/environ", "rb").read())
out["claim_in_env"] = any(k.startswith("BELAY_") for k in os.environ)
libc.unshare.argtypes = [ctypes.c_int]
out["unshare_user"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
out["unshare_mount"] = "ok" if libc.unshare(0x00020000) == 0 else errno.errorcode[ctypes.get_errno()]
out["mount"] = "ok" if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 else errno.errorcode[ctypes.get_errno()]
r = subprocess.run(["unshare", "-Ur", "id", "-u"], capture_output=True, text=True)
out["unshare_cmd"] = r.returncode
for d in ["/tmp", "/var/tmp", "/dev/shm"]:
    v = os.statvfs(d)
    out["size " + d] = v.f_blocks * v.f_frsize
out["hostname"] = socket.gethostname()
sock = cfg["socket"]
out["api_socket"] = [attempt(lambda: os.rename(sock, sock + ".x")), attempt(lambda: os.unlink(sock)),
                     attempt(lambda: socket.socket(socket.AF_UNIX).bind(sock + ".relay")), attempt(lambda: unix(sock))]
print("PROBE " + json.dumps(out, separators=(",", ":")), flush=True)
`

// ProbeResult is what ProbeScript reports.
type ProbeResult struct {
	CapInh, CapPrm, CapEff, CapBnd, CapAmb string
	NoNewPrivs, Seccomp                    string
	UID                                    int               `json:"uid"`
	GID                                    int               `json:"gid"`
	Groups                                 []int             `json:"groups"`
	ScratchBefore                          []string          `json:"scratch_before"`
	WriteRoot                              string            `json:"write_root"`
	WriteUsr                               string            `json:"write_usr"`
	WriteAboveWorkspace                    string            `json:"write_above_workspace"`
	WriteTmp                               string            `json:"write_tmp"`
	WriteWorkspace                         string            `json:"write_workspace"`
	Interfaces                             []string          `json:"interfaces"`
	TCP                                    map[string]string `json:"tcp"`
	UnixFile                               string            `json:"unix_file"`
	UnixAbstract                           string            `json:"unix_abstract"`
	SocketsVisible                         []string          `json:"sockets_visible"`
	SetID                                  []string          `json:"setid"`
	PIDs                                   []int             `json:"pids"`
	Cmdlines                               []string          `json:"cmdlines"`
	EntryEnviron                           string            `json:"entry_environ"`
	ClaimInEnv                             bool              `json:"claim_in_env"`
	UnshareUser                            string            `json:"unshare_user"`
	UnshareMount                           string            `json:"unshare_mount"`
	Mount                                  string            `json:"mount"`
	UnshareCmd                             int               `json:"unshare_cmd"`
	TmpSize                                int64             `json:"size /tmp"`
	VarTmpSize                             int64             `json:"size /var/tmp"`
	ShmSize                                int64             `json:"size /dev/shm"`
	Hostname                               string            `json:"hostname"`
	APISocket                              []string          `json:"api_socket"`
}

// Targets are what the probe tries to reach on the host: a TCP listener on
// each of the host's IPv4 addresses, a Unix socket anyone may use (0777)
// in the host's temporary folder, and an abstract Unix socket. JSON is the
// probe's argument.
type Targets struct {
	TCP       []string `json:"tcp"`
	Unix      string   `json:"unix"`
	Abstract  string   `json:"abstract"`
	Socket    string   `json:"socket"`
	Workspace string   `json:"workspace"`
}

// JSON is the probe's argument.
func (t Targets) JSON() string {
	b, _ := json.Marshal(t)
	return string(b)
}

// ListenOnHost starts the host listeners the probe tries, each accepting
// and closing connections until the test ends, after checking that the
// host itself reaches them (so a refusal inside the sandbox means
// something). socket is api.sock's path inside the sandbox.
func ListenOnHost(tb testing.TB, socket string) Targets {
	tb.Helper()
	t := Targets{Socket: socket, Workspace: hardening.Sandbox.WorkspaceDir}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		tb.Fatal(err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		ln, err := net.Listen("tcp4", net.JoinHostPort(ipn.IP.String(), "0"))
		if err != nil {
			tb.Fatal(err)
		}
		serve(tb, ln)
		t.TCP = append(t.TCP, ln.Addr().String())
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			tb.Fatalf("the host cannot reach its own listener %s: %v", ln.Addr(), err)
		}
		c.Close()
	}
	if len(t.TCP) == 0 {
		tb.Fatal("no IPv4 address on the host to listen on")
	}
	t.Unix = filepath.Join(os.TempDir(), fmt.Sprintf("belay-probe-%d-%d.sock", os.Getpid(), time.Now().UnixNano()))
	uln, err := net.Listen("unix", t.Unix)
	if err != nil {
		tb.Fatal(err)
	}
	serve(tb, uln)
	if err := os.Chmod(t.Unix, 0o777); err != nil {
		tb.Fatal(err)
	}
	t.Abstract = strings.TrimPrefix(filepath.Base(t.Unix), "/") + "-abstract"
	aln, err := net.Listen("unix", "@"+t.Abstract)
	if err != nil {
		tb.Fatal(err)
	}
	serve(tb, aln)
	for _, a := range []string{t.Unix, "@" + t.Abstract} {
		c, err := net.DialTimeout("unix", a, 2*time.Second)
		if err != nil {
			tb.Fatalf("the host cannot reach its own socket %s: %v", a, err)
		}
		c.Close()
	}
	return t
}

func serve(tb testing.TB, ln net.Listener) {
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// ParseProbe finds the probe's report in out.
func ParseProbe(tb testing.TB, out string) ProbeResult {
	tb.Helper()
	for _, line := range strings.Split(out, "\n") {
		if _, j, ok := strings.Cut(line, "PROBE "); ok {
			var r ProbeResult
			if err := json.Unmarshal([]byte(j), &r); err != nil {
				tb.Fatalf("probe output: %v\n%s", err, j)
			}
			return r
		}
	}
	tb.Fatalf("the probe printed no report:\n%s", out)
	return ProbeResult{}
}

// CheckProbe asserts what every sandbox of the OCI launcher must be, by
// profile p, from the probe's report r on targets t; sandboxCommands are
// the only programs /proc may show (their first argument's base name).
func CheckProbe(tb testing.TB, r ProbeResult, t Targets, p hardening.Profile, sandboxCommands ...string) {
	tb.Helper()
	if r.UID != p.UID || r.GID != p.GID || len(r.Groups) > 1 || (len(r.Groups) == 1 && r.Groups[0] != p.GID) {
		tb.Errorf("uid %d gid %d groups %v, want %d:%d and no other group", r.UID, r.GID, r.Groups, p.UID, p.GID)
	}
	for name, v := range map[string]string{"CapInh": r.CapInh, "CapPrm": r.CapPrm, "CapEff": r.CapEff, "CapBnd": r.CapBnd, "CapAmb": r.CapAmb} {
		if v != "0000000000000000" {
			tb.Errorf("%s = %s, want 0", name, v)
		}
	}
	if r.NoNewPrivs != "1" || r.Seccomp != "2" {
		tb.Errorf("NoNewPrivs %s, Seccomp %s; want 1 and 2 (a filter)", r.NoNewPrivs, r.Seccomp)
	}
	if r.WriteRoot != "EROFS" || r.WriteUsr != "EROFS" || r.WriteAboveWorkspace != "EROFS" {
		tb.Errorf("writing /, /usr/bin, /conftest.py gave %s, %s, %s; want EROFS (read-only root: no config can be planted above the workspace)",
			r.WriteRoot, r.WriteUsr, r.WriteAboveWorkspace)
	}
	if r.WriteTmp != "ok" || r.WriteWorkspace != "ok" {
		tb.Errorf("writing /tmp gave %s, the workspace %s; want both writable", r.WriteTmp, r.WriteWorkspace)
	}
	if len(r.Interfaces) != 1 || r.Interfaces[0] != "lo" {
		tb.Errorf("interfaces %v, want only lo", r.Interfaces)
	}
	if len(r.TCP) != len(t.TCP) {
		tb.Errorf("the probe tried %d of %d host listeners", len(r.TCP), len(t.TCP))
	}
	for a, res := range r.TCP {
		if res == "ok" {
			tb.Errorf("the sandbox connected to the host's listener %s", a)
		}
	}
	if r.UnixFile != "ENOENT" {
		tb.Errorf("the host's 0777 socket %s: %s, want ENOENT (the host's file system is invisible)", t.Unix, r.UnixFile)
	}
	if r.UnixAbstract == "ok" {
		tb.Errorf("the host's abstract socket @%s was reached", t.Abstract)
	}
	if len(r.SocketsVisible) != 1 || r.SocketsVisible[0] != t.Socket {
		tb.Errorf("sockets visible in the file system: %v, want only %s", r.SocketsVisible, t.Socket)
	}
	if len(r.SetID) != 0 {
		tb.Errorf("setuid or setgid files: %v", r.SetID)
	}
	if len(r.PIDs) == 0 || r.PIDs[0] != 1 {
		tb.Errorf("/proc shows pids %v; want the sandbox's own, from 1", r.PIDs)
	}
	for _, c := range r.Cmdlines {
		ok := false
		for _, want := range sandboxCommands {
			if filepath.Base(c) == want || strings.HasPrefix(filepath.Base(c), want) {
				ok = true
			}
		}
		if !ok {
			tb.Errorf("/proc shows %q, not a process of the sandbox (%v): %q", c, sandboxCommands, r.Cmdlines)
		}
	}
	entryIsInit := len(r.Cmdlines) > 0 && filepath.Base(r.Cmdlines[0]) == filepath.Base(p.Entrypoint[0])
	if (entryIsInit && r.EntryEnviron == "ok") || r.ClaimInEnv {
		tb.Errorf("the entry's environment is readable (%s) or a BELAY_ variable reached a command (%v)", r.EntryEnviron, r.ClaimInEnv)
	}
	if r.UnshareUser != "EPERM" || r.UnshareMount != "EPERM" || r.Mount != "EPERM" || r.UnshareCmd == 0 {
		tb.Errorf("unshare(user) %s, unshare(mount) %s, mount %s, unshare -Ur exit %d; want EPERM from seccomp and a failure",
			r.UnshareUser, r.UnshareMount, r.Mount, r.UnshareCmd)
	}
	want := int64(p.TmpSizeMiB) << 20
	if r.TmpSize != want || r.VarTmpSize != want || r.ShmSize != want {
		tb.Errorf("/tmp %d, /var/tmp %d, /dev/shm %d bytes; want %d each", r.TmpSize, r.VarTmpSize, r.ShmSize, want)
	}
	if r.Hostname != p.Hostname {
		tb.Errorf("hostname %q, want %q", r.Hostname, p.Hostname)
	}
	if len(r.APISocket) != 4 || r.APISocket[0] != "EROFS" || r.APISocket[1] != "EROFS" || r.APISocket[2] != "EROFS" || r.APISocket[3] != "ok" {
		tb.Errorf("api.sock rename, unlink, bind beside it, connect = %v; want EROFS, EROFS, EROFS, ok", r.APISocket)
	}
}
