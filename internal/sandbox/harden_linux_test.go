package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/sandbox"
)

func init() {
	helpers["harden"] = hardenHelper
}

// hardenReport is what the harden helper prints as JSON.
type hardenReport struct {
	Err          string   `json:"err,omitempty"`
	UID          int      `json:"uid"`
	ThreadNoNew  string   `json:"threadNoNewPrivs"`
	ProcessNoNew string   `json:"processNoNewPrivs"`
	ChildNoNew   string   `json:"childNoNewPrivs"`
	ChildUID     string   `json:"childUid"`
	Dumpable     int      `json:"dumpable"`
	EnvKeys      []string `json:"envKeys"`
	EnvHasCanary bool     `json:"envHasCanary"`
}

// hardenHelper runs in a re-executed test binary as a non-root user: it
// hardens itself and reports what the kernel says about it and about a
// child it starts.
func hardenHelper() int {
	// Stay on one thread so its /proc/thread-self entry is the one Harden
	// ran on, whichever way Harden had to set the flag.
	runtime.LockOSThread()
	var r hardenReport
	if err := sandbox.Harden(); err != nil {
		r.Err = err.Error()
	} else {
		r.UID = os.Getuid()
		r.ThreadNoNew = statusField("/proc/thread-self/status", "NoNewPrivs")
		r.ProcessNoNew = statusField("/proc/self/status", "NoNewPrivs")
		d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		if err != nil {
			r.Err = err.Error()
		}
		r.Dumpable = d
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			r.EnvKeys = append(r.EnvKeys, k)
			r.EnvHasCanary = r.EnvHasCanary || strings.Contains(kv, envCanary)
		}
		slices.Sort(r.EnvKeys)
		res, err := sandbox.RunCommand(context.Background(), sandbox.Command{
			Argv: []string{"cat", "/proc/self/status"}, Dir: "/", Env: sandbox.CleanEnv("/"),
		})
		if err != nil {
			r.Err = err.Error()
		}
		r.ChildNoNew = fieldOf(string(res.Output), "NoNewPrivs")
		r.ChildUID = strings.Fields(fieldOf(string(res.Output), "Uid") + " ?")[0]
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	return 0
}

func statusField(path, key string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "error: " + err.Error()
	}
	return fieldOf(string(b), key)
}

func fieldOf(status, key string) string {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestHardenSetsNoNewPrivsAndNotDumpable(t *testing.T) {
	bin := helperBinary(t)
	cmd := helperCommand(t, bin, "harden", "BELAY_TEST_SECRET="+envCanary, "AWS_SECRET_ACCESS_KEY="+envCanary)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v (output %q)", err, out)
	}
	var r hardenReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	if r.Err != "" {
		t.Fatalf("Harden in the helper: %s", r.Err)
	}
	if r.UID == 0 {
		t.Error("the helper ran as root; it must run as an unprivileged user")
	}
	if r.ThreadNoNew != "1" {
		t.Errorf("NoNewPrivs of the hardened thread = %q, want 1", r.ThreadNoNew)
	}
	if r.ChildNoNew != "1" {
		t.Errorf("NoNewPrivs of a child process = %q, want 1", r.ChildNoNew)
	}
	if r.ChildUID != fmt.Sprint(r.UID) {
		t.Errorf("child uid %q, want %d", r.ChildUID, r.UID)
	}
	if r.Dumpable != 0 {
		t.Errorf("dumpable = %d, want 0", r.Dumpable)
	}
	if want := []string{"HOME", "LANG", "PATH"}; !slices.Equal(r.EnvKeys, want) {
		t.Errorf("environment after Harden has %q, want only %q", r.EnvKeys, want)
	}
	if r.EnvHasCanary || strings.Contains(string(out), envCanary) {
		t.Error("a secret from the environment survived Harden")
	}
	t.Logf("process-wide NoNewPrivs (main thread) = %s", r.ProcessNoNew)
}

func TestHardenRefusesRoot(t *testing.T) {
	requireRoot(t, "to see Harden refuse uid 0")
	// Harden checks the uid before changing anything, so calling it here
	// leaves the test process as it was.
	err := sandbox.Harden()
	if err == nil || !strings.Contains(err.Error(), "root") {
		t.Fatalf("Harden as root: %v; want a refusal that names root", err)
	}
}
