package main

// Tests of the built binaries: `belay serve` as an operator starts it, in a
// process of its own (its own open-file limit, its own mount namespace),
// and the CLI as a separate process.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/sandbox/workspace/workspacetest"
)

// builtBinaries builds bin/belay and bin/belay-sandbox (beside it, where
// belay serve looks) into a fresh directory, as make build does.
func builtBinaries(tb testing.TB) (belayBin string) {
	tb.Helper()
	root := embeddedtest.ModuleRoot(tb)
	dir := tb.TempDir()
	for _, b := range []struct{ out, pkg string }{
		{filepath.Join(dir, "belay"), "./cmd/belay"},
		{filepath.Join(dir, embedded.SandboxBinName), "./sandbox-task"},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return filepath.Join(dir, "belay")
}

// serveProcess is a running `belay serve`.
type serveProcess struct {
	cmd      *exec.Cmd
	stdout   lockedBuffer
	stderr   lockedBuffer
	endpoint string
}

// startServe starts cmd (a belay serve, possibly behind a wrapper that
// execs it), waits until it prints where it serves, and stops it with
// SIGTERM when the test ends.
func startServe(tb testing.TB, cmd *exec.Cmd) *serveProcess {
	tb.Helper()
	s := &serveProcess{cmd: cmd}
	cmd.Stdout, cmd.Stderr = &s.stdout, &s.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			tb.Errorf("belay serve did not stop within 60 s of SIGTERM")
		}
	})
	deadline := time.After(60 * time.Second)
	for {
		if _, rest, ok := strings.Cut(s.stdout.String(), "serving on "); ok {
			if line, _, ok := strings.Cut(rest, "\n"); ok {
				s.endpoint = line
				return s
			}
		}
		select {
		case err := <-exited:
			tb.Fatalf("belay serve exited (%v)\nstdout: %s\nstderr: %s", err, s.stdout.String(), s.stderr.String())
		case <-deadline:
			tb.Fatalf("belay serve did not start within 60 s\nstdout: %s\nstderr: %s", s.stdout.String(), s.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// processLauncherEnv chooses the process launcher, the one these tests are
// about, and accepts its weaker isolation, as an operator must once belay
// serve prefers the OCI launcher (a belay serve without that choice ignores
// the variables).
var processLauncherEnv = []string{"BELAY_LAUNCHER=process", "BELAY_ALLOW_WEAK_ISOLATION=1"}

// requireRootHere skips a test that needs root outside CI, and fails it in
// CI, which runs the tests as root.
func requireRootHere(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("this test needs root (%s); CI runs the tests as root", why)
	}
	tb.Skipf("needs root (%s): run the tests as root (CI does)", why)
}

// TestServeBinary runs the tests of the built belay serve, which share one
// build of the binaries.
func TestServeBinary(t *testing.T) {
	belayBin := builtBinaries(t)
	t.Run("as root with defaults", func(t *testing.T) { testServeAsRootWithDefaults(t, belayBin) })
	t.Run("survives a connection flood", func(t *testing.T) { testServeSurvivesAConnectionFlood(t, belayBin) })
}

// testServeAsRootWithDefaults is issue 8's new user: root starts the
// built belay serve with a fresh HOME and no BELAY_DATA_DIR or
// BELAY_SANDBOX_DIR, and `belay run examples/calc --follow` (another
// process, with no token or data directory given) sees the run complete.
// Both run in a private mount namespace whose /var/lib is an empty tmpfs,
// so the real default paths are used without touching the machine's: this
// test's thread makes the namespace and starts both from it, and is never
// given back, so the namespace ends with the test.
func testServeAsRootWithDefaults(t *testing.T, belayBin string) {
	requireRootHere(t, "root's defaults are what is tested")
	hostHad := map[string]bool{}
	for _, d := range []string{embedded.DefaultRootDataDir, embedded.DefaultRootSandboxDir} {
		_, err := os.Lstat(d)
		hostHad[d] = err == nil
	}
	root := embeddedtest.ModuleRoot(t)
	home := t.TempDir()
	port := freePort(t)
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8"}

	runtime.LockOSThread() // for good: see above
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		t.Fatalf("unshare the mount namespace: %v", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	if err := unix.Mount("belay-test", "/var/lib", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs on /var/lib: %v", err)
	}

	serve := exec.Command(belayBin, "serve")
	serve.Env = append(env, processLauncherEnv...)
	serve.Env = append(serve.Env, embedded.EnvAddr+"=127.0.0.1:"+port,
		embedded.EnvScriptedModel+"="+filepath.Join(root, "examples", "sessions", "fix-calc.json"))
	s := startServe(t, serve)

	out := s.stdout.String()
	for _, want := range []string{"data:       " + embedded.DefaultRootDataDir, "sandboxes:  " + embedded.DefaultRootSandboxDir,
		"token:      in " + filepath.Join(embedded.DefaultRootDataDir, "control-token")} {
		if !strings.Contains(out, want) {
			t.Errorf("belay serve's output lacks %q:\n%s", want, out)
		}
	}
	for dir, mode := range map[string]os.FileMode{embedded.DefaultRootDataDir: 0o700, embedded.DefaultRootSandboxDir: 0o711} {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s in belay serve's namespace: %v, %v; want a directory of mode %04o", dir, fi, err, mode)
		}
	}

	run := exec.Command(belayBin, "run", filepath.Join(root, "examples", "calc"),
		"--instruction", "Make python3 -m pytest -q pass by fixing calc.py.",
		"--allow", "calc.py", "--check", "python3 -m pytest -q", "--max-steps", "12", "--wall-time", "120", "--follow")
	run.Env = append(env, envEndpoint+"="+s.endpoint)
	b, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("belay run: %v\n%s\nserver log:\n%s", err, b, s.stderr.String())
	}
	if !strings.Contains(string(b), "completed") {
		t.Errorf("belay run's output does not say the run completed:\n%s", b)
	}

	// The machine's /var/lib, seen from a thread outside the namespace.
	host := make(chan map[string]bool)
	go func() {
		now := map[string]bool{}
		for d := range hostHad {
			_, err := os.Lstat(d)
			now[d] = err == nil
		}
		host <- now
	}()
	for d, there := range <-host {
		if there != hostHad[d] {
			t.Errorf("the test changed the machine's %s (there before: %v, after: %v)", d, hostHad[d], there)
		}
	}
}

// freePort finds a loopback port that is free now.
func freePort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := strings.Cut(ln.Addr().String(), ":")
	return port
}

// floodConnections is how many idle connections without a token the flood
// test opens, as the review did.
const floodConnections = 20_000

// serverFileLimit is belay serve's open-file limit in the flood test:
// fewer descriptors than the flood has connections, so without a cap the
// flood exhausts them.
const serverFileLimit = 16384

// testServeSurvivesAConnectionFlood is issue 16, hole 9: 20,000 idle
// connections without a token, from other processes, against a belay serve
// whose open-file limit is below that; an authorised request is still
// answered, and belay serve never runs out of descriptors.
func testServeSurvivesAConnectionFlood(t *testing.T, belayBin string) {
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil {
		t.Fatal(err)
	}
	flood := filepath.Join(t.TempDir(), "flood")
	build := exec.Command("go", "build", "-o", flood, "./testdata/flood")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./testdata/flood: %v\n%s", err, out)
	}

	serverLimit := min(uint64(serverFileLimit), own.Max)
	token := "flood-test-token-" + strings.Repeat("t", 24)
	serve := exec.Command("prlimit", fmt.Sprintf("--nofile=%d:%d", serverLimit, serverLimit), "--",
		belayBin, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--sandbox-dir", workspacetest.Dir(t, "fl"),
		"--scripted-model", filepath.Join(embeddedtest.ModuleRoot(t), "examples", "sessions", "fix-calc.json"))
	serve.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir(), embedded.EnvToken + "=" + token}, processLauncherEnv...)
	s := startServe(t, serve)

	// The flood comes from several processes, each holding what its own
	// descriptor limit allows.
	perProcess := min(floodConnections, int(own.Max)-200)
	if perProcess < 1000 {
		t.Fatalf("the open-file hard limit (%d) is too low to hold a flood", own.Max)
	}
	var total struct{ opened, asked, unauthorized, closeHeader, closedAfter, dialErrors int }
	for left := floodConnections; left > 0; left -= perProcess {
		n := min(left, perProcess)
		cmd := exec.Command(flood, "-addr", strings.TrimPrefix(s.endpoint, "http://"), "-n", strconv.Itoa(n), "-ask", "10")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr lockedBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
		var rep struct {
			Opened, DialErrors, Asked, Unauthorized, CloseHeader, ClosedAfter int
			FirstDialErr                                                      string
		}
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err != nil || json.Unmarshal(line, &rep) != nil {
			t.Fatalf("flood process: %v %q\n%s", err, line, stderr.String())
		}
		if rep.DialErrors > 0 {
			t.Logf("flood: %d connections failed to open (%s)", rep.DialErrors, rep.FirstDialErr)
		}
		total.opened += rep.Opened
		total.asked += rep.Asked
		total.unauthorized += rep.Unauthorized
		total.closeHeader += rep.CloseHeader
		total.closedAfter += rep.ClosedAfter
		total.dialErrors += rep.DialErrors
	}
	t.Logf("flood: %d connections opened (%d failed), %d asked without a token: %d answered 401, %d with Connection: close, %d then closed by the server",
		total.opened, total.dialErrors, total.asked, total.unauthorized, total.closeHeader, total.closedAfter)
	if total.opened < floodConnections*9/10 {
		t.Errorf("only %d of %d flood connections opened: the flood did not happen", total.opened, floodConnections)
	}
	if total.asked == 0 || total.unauthorized != total.asked || total.closeHeader != total.asked || total.closedAfter != total.asked {
		t.Errorf("of %d requests without a token, %d got 401, %d with Connection: close, %d were then closed; want all",
			total.asked, total.unauthorized, total.closeHeader, total.closedAfter)
	}

	// With the flood holding its connections, an authorised request. The
	// bound is generous: it is a liveness check, not a timing.
	client := &http.Client{Timeout: 60 * time.Second}
	req, err := http.NewRequest(http.MethodGet, s.endpoint+"/v1/runs", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	asked := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("an authorised request during the flood: %v\nserver log:\n%s", err, tail(s.stderr.String(), 4000))
	}
	t.Logf("the authorised request was answered %d after %v", resp.StatusCode, time.Since(asked).Round(time.Millisecond))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("an authorised request during the flood answered %d; want 200", resp.StatusCode)
	}
	logs := s.stderr.String()
	if strings.Contains(logs, "too many open files") {
		t.Errorf("belay serve ran out of file descriptors:\n%s", tail(logs, 4000))
	}
	if !strings.Contains(logs, `"max_connections":`) || !strings.Contains(logs, "public connections at their cap") {
		t.Errorf("belay serve's log does not show its connection cap at work:\n%s", tail(logs, 4000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
