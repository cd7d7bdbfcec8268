//go:build linux

package localsandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// helperEnv names the environment variable that turns the test binary into
// a helper process (see TestMain): the test re-executes itself as an
// unprivileged user to show what the launcher does without root.
const helperEnv = "BELAY_LOCALSANDBOX_TEST_HELPER"

// The helper's inputs, passed in its environment.
const (
	helperEntryEnv = "BELAY_LOCALSANDBOX_TEST_ENTRY"
	helperDirEnv   = "BELAY_LOCALSANDBOX_TEST_DIR"
)

// helperUID is the unprivileged user the helper runs as; distinct from the
// default sandbox uid so that a mix-up would show.
const helperUID = 10002

// unprivilegedResult is what the helper reports on stdout.
type unprivilegedResult struct {
	UID             int
	Isolation       []string
	Logs            string
	Report          report
	ReachedNetwork  bool
	Tokens          belay.SandboxTokens
	MessCleanupErr  string
	MessWorkspaceOK bool // the workspace was gone after Cleanup
	Err             string
}

func runHelper(mode string) int {
	switch mode {
	case "holder":
		return holderScenario()
	case "unprivileged":
	default:
		fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
		return 2
	}
	res := unprivilegedScenario()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// unprivilegedScenario runs the test entry through a launcher built by a
// process that is not root, as TestLaunchWithoutRoot's helper.
func unprivilegedScenario() (res unprivilegedResult) {
	res.UID = os.Getuid()
	tb := &helperTB{}
	defer func() {
		if r := recover(); r != nil && r != errHelperFailed {
			panic(r)
		}
		if tb.failure != "" {
			res.Err = tb.failure
		}
	}()
	logs := &syncBuffer{}
	defer func() { res.Logs = logs.String() }()
	api, _ := recordingAPI(tb)
	l, err := localsandbox.New(localsandbox.Config{
		EntryPath: os.Getenv(helperEntryEnv),
		WorkRoot:  filepath.Join(os.Getenv(helperDirEnv), "w"),
		Internal:  api,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		res.Err = "New: " + err.Error()
		return res
	}
	res.Isolation = l.Isolation()

	target := listenTCP(tb)
	spec := testSpec(tb, "run_unpriv", "report "+target.ln.Addr().String())
	res.Tokens = spec.Tokens
	sb := launch(tb, l, spec)
	if exit := wait(tb, sb); exit.ExitCode != 0 {
		res.Err = fmt.Sprintf("report entry exited %d: %s", exit.ExitCode, sb.OutputTail())
		return res
	}
	res.Report = readReport(tb, sb)
	res.ReachedNetwork = target.Accepted() > 0

	mess := launch(tb, l, testSpec(tb, "run_unpriv_mess", "mess"))
	if exit := wait(tb, mess); exit.ExitCode != 0 {
		res.Err = fmt.Sprintf("mess entry exited %d: %s", exit.ExitCode, mess.OutputTail())
		return res
	}
	if err := mess.Cleanup(); err != nil {
		res.MessCleanupErr = err.Error()
	}
	_, err = os.Lstat(mess.Workspace())
	res.MessWorkspaceOK = errors.Is(err, os.ErrNotExist)
	tb.runCleanups()
	return res
}

// errHelperFailed unwinds the helper scenario on a Fatal.
var errHelperFailed = errors.New("helper failed")

// helperTB lets the helper process reuse the test helpers outside a test.
type helperTB struct {
	testing.TB
	failure  string
	cleanups []func()
}

func (h *helperTB) Helper()                  {}
func (h *helperTB) Cleanup(f func())         { h.cleanups = append(h.cleanups, f) }
func (h *helperTB) Context() context.Context { return context.Background() }
func (h *helperTB) Errorf(format string, args ...any) {
	h.failure += fmt.Sprintf(format, args...) + "\n"
}
func (h *helperTB) Fatal(args ...any) {
	h.failure += fmt.Sprint(args...) + "\n"
	panic(errHelperFailed)
}
func (h *helperTB) Fatalf(format string, args ...any) {
	h.failure += fmt.Sprintf(format, args...) + "\n"
	panic(errHelperFailed)
}

func (h *helperTB) runCleanups() {
	for i := len(h.cleanups) - 1; i >= 0; i-- {
		h.cleanups[i]()
	}
	h.cleanups = nil
}

// TestLaunchWithoutRoot re-executes the test binary as an unprivileged
// user, which builds a launcher and runs the test entry. The kernel here
// allows unprivileged user namespaces, so the launcher must use one: the
// entry runs as that same user, in its own PID namespace, without network,
// and still reaches the control plane through api.sock. On a kernel that
// refuses, the launcher must fall back and say so in its log; either way
// Cleanup removes a workspace the sandbox made hard to remove.
func TestLaunchWithoutRoot(t *testing.T) {
	requireRoot(t) // root only to become the unprivileged user
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTempDir(t)
	bin := filepath.Join(dir, "localsandbox.test")
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, helperUID, helperUID); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin)
	cmd.Env = []string{helperEnv + "=unprivileged", helperEntryEnv + "=" + testEntry, helperDirEnv + "=" + home,
		"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: helperUID, Gid: helperUID, Groups: []uint32{}}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v\n%s", err, stderr.String())
	}
	var res unprivilegedResult
	if err := json.NewDecoder(io.LimitReader(&stdout, 1<<20)).Decode(&res); err != nil {
		t.Fatalf("helper answer: %v\n%s", err, stderr.String())
	}
	if res.Err != "" {
		t.Fatalf("helper failed: %s\nlog:\n%s", res.Err, res.Logs)
	}
	if res.UID != helperUID {
		t.Fatalf("helper ran as uid %d, want %d", res.UID, helperUID)
	}

	usedUserNS := strings.Contains(strings.Join(res.Isolation, "\n"), "user namespace")
	t.Logf("without root the launcher applied: %q", res.Isolation)
	if !usedUserNS && !strings.Contains(res.Logs, "no user namespace could be created") {
		t.Errorf("without root the launcher neither used a user namespace nor said it could not:\n%s", res.Logs)
	}
	if !strings.Contains(res.Logs, "not_applied=") || !strings.Contains(res.Logs, "uid drop") {
		t.Errorf("the log does not say plainly that the uid drop was not applied without root:\n%s", res.Logs)
	}
	rep := res.Report
	if rep.UID != helperUID {
		t.Errorf("entry ran as uid %d, want the launcher's own uid %d", rep.UID, helperUID)
	}
	for _, name := range []string{workspace.ModelTokenFile, workspace.EventsTokenFile, workspace.ApprovalsTokenFile} {
		tf, ok := rep.TokenFiles[name]
		if !ok || tf.ReadErr != "" || tf.Mode != "-rw-------" {
			t.Errorf("%s: found %v, mode %s, read error %q; want a 0600 file the entry read", name, ok, tf.Mode, tf.ReadErr)
		}
	}
	assertNoToken(t, "the entry's environment", strings.Join(rep.Env, "\n"), res.Tokens)
	assertNoToken(t, "the log", res.Logs, res.Tokens)
	if rep.APIStatus != 200 {
		t.Errorf("entry's call through api.sock: status %d, error %q", rep.APIStatus, rep.APIError)
	}
	if usedUserNS {
		if res.ReachedNetwork || rep.PID != 1 {
			t.Errorf("in a user namespace the entry reached the network: %v (%q), was pid %d; want no network and pid 1", res.ReachedNetwork, rep.TCPError, rep.PID)
		}
	} else if !res.ReachedNetwork {
		t.Errorf("fallback without namespaces, yet the entry could not reach the network (%q)", rep.TCPError)
	}
	if res.MessCleanupErr != "" || !res.MessWorkspaceOK {
		t.Errorf("Cleanup without root: %q, workspace removed: %v", res.MessCleanupErr, res.MessWorkspaceOK)
	}
}
