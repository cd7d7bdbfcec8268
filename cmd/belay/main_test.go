package main

// The CLI's tests run the subcommands in-process (a main package cannot be
// imported, hence package main) against a real embedded control plane on
// 127.0.0.1 port 0, through the same run function main calls.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/token"
)

// lockedBuffer collects output written from several goroutines (the
// server's logger writes to the CLI's stderr).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// result is one CLI invocation.
type result struct {
	code           int
	stdout, stderr string
}

// server is a running embedded control plane and the environment a CLI
// needs to reach it: the endpoint and the data directory holding the token.
type server struct {
	main *embedded.Main
	cfg  embedded.Config
	env  map[string]string
}

func startServer(tb testing.TB, edit func(*embedded.Config)) *server {
	tb.Helper()
	cfg := embeddedtest.Config(tb, nil)
	if edit != nil {
		edit(&cfg)
	}
	m := embeddedtest.Start(tb, cfg)
	return &server{main: m, cfg: cfg, env: map[string]string{
		envEndpoint:         "http://" + m.Addr(),
		embedded.EnvDataDir: cfg.DataDir,
	}}
}

// belayCLI runs `belay args...` with the given environment.
func belayCLI(tb testing.TB, ctx context.Context, environ map[string]string, args ...string) result {
	tb.Helper()
	var stdout, stderr lockedBuffer
	code := run(ctx, args, &env{stdout: &stdout, stderr: &stderr, lookup: func(k string) (string, bool) {
		v, ok := environ[k]
		return v, ok
	}})
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func (s *server) belay(tb testing.TB, args ...string) result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return belayCLI(tb, ctx, s.env, args...)
}

func (s *server) client(tb testing.TB) *httpapi.Client {
	tb.Helper()
	c, err := httpapi.NewClient("http://"+s.main.Addr(), s.main.Token())
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// waitForEvent follows the run until an event of type typ has been written.
func (s *server) waitForEvent(tb testing.TB, id, typ string) {
	tb.Helper()
	found := errors.New("found")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.client(tb).StreamEvents(ctx, id, 0, func(e belay.Event) error {
		if e.Type == typ {
			return found
		}
		return nil
	})
	if !errors.Is(err, found) {
		tb.Fatalf("run %s never wrote %s: %v", id, typ, err)
	}
}

// runTokens issues the run's three audience tokens with the server's
// signing key, as the orchestrator does for a sandbox.
func (s *server) runTokens(tb testing.TB, runID string) token.Set {
	tb.Helper()
	keyHex, err := os.ReadFile(filepath.Join(s.cfg.DataDir, embedded.SigningKeyFile))
	if err != nil {
		tb.Fatal(err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(keyHex)))
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := token.NewSigner(key, nil)
	if err != nil {
		tb.Fatal(err)
	}
	set, err := signer.IssueSet(runID, s.main.Model(), time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return set
}

// askApproval asks for a shell approval the way the sandbox does, on the
// internal route with the run's approvals token, and returns its id.
func (s *server) askApproval(tb testing.TB, runID string) string {
	tb.Helper()
	set := s.runTokens(tb, runID)
	req, err := http.NewRequest("POST", "http://"+s.main.Addr()+"/internal/v1/runs/"+runID+"/approvals",
		strings.NewReader(`{"tool":"shell","arguments":{"command":"ls -la"}}`))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+set.Approvals)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var a belay.Approval
	if err := decodeJSON(resp, &a); err != nil || resp.StatusCode != http.StatusCreated {
		tb.Fatalf("ask approval: %d %v", resp.StatusCode, err)
	}
	return a.ID
}

func decodeJSON(resp *http.Response, v any) error {
	return json.NewDecoder(resp.Body).Decode(v)
}

// project writes a small project to a new directory, with things the
// upload must leave out, and returns the directory.
func project(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	files := map[string]string{
		"calc.py":                 "def add(a, b):\n    return a - b\n",
		"tests/test_calc.py":      "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n",
		".git/config":             "[core]\n",
		".pytest_cache/README.md": "cache\n",
		"__pycache__/calc.py":     "cached\n",
		"logo.png":                "\x89PNG\r\n",
		"latin1.py":               "# caf\xe9\n",
		"big.txt":                 strings.Repeat("a", 65<<10),
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd.txt")); err != nil {
		tb.Fatal(err)
	}
	return dir
}

func TestUsageAndVersion(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		args     []string
		code     int
		stdout   string
		stderr   string
		noStderr string
	}{
		{args: nil, code: 2, stderr: "Usage:"},
		{args: []string{"help"}, code: 0, stderr: "belay run DIR"},
		{args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		{args: []string{"version"}, code: 0, stdout: "belay dev (go"},
		{args: []string{"version", "extra"}, code: 2, stderr: "takes no arguments"},
		{args: []string{"events", "-h"}, code: 0, stderr: "--follow"},
		{args: []string{"events", "--bogus", "run_x"}, code: 2, stderr: "flag provided but not defined: -bogus"},
		{args: []string{"events"}, code: 2, stderr: "takes ID (got 0"},
		{args: []string{"approve", "run_x", "apr_x", "maybe"}, code: 2, stderr: `decision "maybe" is not one of`},
		{args: []string{"runs", "--limit", "-1"}, code: 2, stderr: "--limit must not be negative"},
	}
	for _, tt := range tests {
		r := belayCLI(t, ctx, map[string]string{}, tt.args...)
		if r.code != tt.code || !strings.Contains(r.stdout, tt.stdout) || !strings.Contains(r.stderr, tt.stderr) {
			t.Errorf("belay %v = %d\nstdout: %s\nstderr: %s\nwant %d, stdout with %q, stderr with %q",
				tt.args, r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.stderr)
		}
	}
}

func TestFindsServerAndToken(t *testing.T) {
	xdg := t.TempDir()
	s := startServer(t, func(c *embedded.Config) { c.DataDir = filepath.Join(xdg, "belay") })
	ctx := context.Background()
	wrong := "ctl-wrong-canary-" + strings.Repeat("w", 16)
	tests := []struct {
		name   string
		env    map[string]string
		code   int
		stdout string
		stderr string
		// who is "root" or "user" for a case of one kind of user only
		// (the data directory differs), "" for both. Root's cases run
		// with a private /var/lib whose belay/control-token holds the
		// server's token when rootToken.
		who       string
		rootToken bool
	}{
		{"token file in BELAY_DATA_DIR", s.env, 0, "no runs", "", "", false},
		{"token in BELAY_TOKEN", map[string]string{envEndpoint: s.env[envEndpoint], embedded.EnvToken: s.main.Token()}, 0, "no runs", "", "", false},
		{"token file under XDG_DATA_HOME", map[string]string{envEndpoint: s.env[envEndpoint], "XDG_DATA_HOME": xdg}, 0, "no runs", "", "user", false},
		{"no token file under XDG_DATA_HOME", map[string]string{envEndpoint: s.env[envEndpoint], "XDG_DATA_HOME": xdg + "/x"},
			1, "", "no control-plane token: set BELAY_TOKEN, or start `belay serve` once so it writes " + xdg + "/x/belay/control-token", "user", false},
		// Root's data directory is /var/lib/belay, whatever XDG_DATA_HOME
		// and HOME say.
		{"as root, token file in /var/lib/belay", map[string]string{envEndpoint: s.env[envEndpoint], "XDG_DATA_HOME": xdg + "/x"},
			0, "no runs", "", "root", true},
		{"as root, no token file in /var/lib/belay", map[string]string{envEndpoint: s.env[envEndpoint], "XDG_DATA_HOME": xdg},
			1, "", "no control-plane token: set BELAY_TOKEN, or start `belay serve` once so it writes /var/lib/belay/control-token", "root", false},
		{"wrong token", map[string]string{envEndpoint: s.env[envEndpoint], embedded.EnvToken: wrong}, 1, "",
			"belay: missing or invalid control-plane token (unauthorized, request id req_", "", false},
		{"no token anywhere", map[string]string{envEndpoint: s.env[envEndpoint]}, 1, "", "no control-plane token", "", false},
		{"endpoint over plain http to another host", map[string]string{envEndpoint: "http://belay.example.com", embedded.EnvToken: wrong},
			1, "", "must use https", "", false},
	}
	me := map[bool]string{true: "root", false: "user"}[os.Geteuid() == 0]
	for _, tt := range tests {
		if tt.who != "" && tt.who != me {
			continue // the other kind of user's lookup (see TestDefaultDataDir for both)
		}
		t.Run(tt.name, func(t *testing.T) {
			var r result
			if tt.who == "root" {
				onPrivateVarLib(t, func() {
					if tt.rootToken {
						if err := os.MkdirAll("/var/lib/belay", 0o700); err != nil {
							t.Error(err)
							return
						}
						if err := os.WriteFile("/var/lib/belay/control-token", []byte(s.main.Token()+"\n"), 0o600); err != nil {
							t.Error(err)
							return
						}
					}
					r = belayCLI(t, ctx, tt.env, "runs")
				})
			} else {
				r = belayCLI(t, ctx, tt.env, "runs")
			}
			if r.code != tt.code || !strings.Contains(r.stdout, tt.stdout) || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("belay runs = %d\nstdout: %s\nstderr: %s\nwant %d, stdout with %q, stderr with %q",
					r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.stderr)
			}
			for _, secret := range []string{wrong, s.main.Token()} {
				if strings.Contains(r.stdout+r.stderr, secret) {
					t.Errorf("the output repeats a token")
				}
			}
		})
	}
}

// onPrivateVarLib runs f on an OS thread of its own, in a mount namespace
// of its own whose /var/lib is an empty tmpfs, so root's default data
// directory can be used without touching the machine's. The goroutine ends
// with its thread locked, so the thread and its namespace end with it.
func onPrivateVarLib(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			t.Errorf("unshare the mount namespace: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make mounts private: %v", err)
			return
		}
		if err := unix.Mount("belay-test", "/var/lib", "tmpfs", 0, "mode=0755"); err != nil {
			t.Errorf("mount a tmpfs on /var/lib: %v", err)
			return
		}
		f()
	}()
	<-done
}
