package embedded_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

func clientOf(tb testing.TB, m *embedded.Main) *httpapi.Client {
	tb.Helper()
	c, err := httpapi.NewClient("http://"+m.Addr(), m.Token(),
		httpapi.WithReconnectBackoff(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func runRequest() belay.RunRequest {
	return belay.RunRequest{
		Instruction:  "Fix the failing test in calc.py",
		Files:        []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n"}},
		AllowedPaths: []string{"calc.py"},
		Checks:       [][]string{{"python3", "-m", "pytest", "-q"}},
	}
}

func modeOf(tb testing.TB, path string) fs.FileMode {
	tb.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Mode()
}

func readFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}\n$`)

func TestTokenFilesWrittenOnFirstStartAndReused(t *testing.T) {
	cfg := embeddedtest.Config(t, nil)
	first := embeddedtest.Start(t, cfg)

	tokenFile := filepath.Join(cfg.DataDir, embedded.ControlTokenFile)
	keyFile := filepath.Join(cfg.DataDir, embedded.SigningKeyFile)
	if first.TokenFile() != tokenFile {
		t.Errorf("TokenFile() = %q; want %q", first.TokenFile(), tokenFile)
	}
	for _, f := range []string{tokenFile, keyFile} {
		if mode := modeOf(t, f); mode != 0o600 {
			t.Errorf("%s has mode %v; want -rw-------", f, mode)
		}
		if content := readFile(t, f); !hex64.MatchString(content) {
			t.Errorf("%s holds %d bytes; want 32 random bytes in hex and a newline", f, len(content))
		}
	}
	if mode := modeOf(t, cfg.DataDir); mode.Perm() != 0o700 {
		t.Errorf("data directory has mode %v; want drwx------", mode)
	}
	if got := readFile(t, tokenFile); strings.TrimSpace(got) != first.Token() {
		t.Errorf("Token() is not the token in %s", tokenFile)
	}
	if _, err := clientOf(t, first).ListRuns(context.Background(), httpapi.ListRunsOptions{}); err != nil {
		t.Fatalf("a call with the token: %v", err)
	}
	key := readFile(t, keyFile)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := embeddedtest.Start(t, cfg)
	if second.Token() != first.Token() {
		t.Error("the second start has another token; want the one written on first start")
	}
	if readFile(t, keyFile) != key {
		t.Error("the second start rewrote the signing key")
	}
	if _, err := clientOf(t, second).ListRuns(context.Background(), httpapi.ListRunsOptions{}); err != nil {
		t.Fatalf("a call with the token after a restart: %v", err)
	}

	// A token file anyone could read is refused, not used.
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := embedded.New(cfg); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("New with a 0644 token file: %v; want a refusal saying chmod 600", err)
	}
	if _, err := embedded.ReadControlToken(cfg.DataDir); err == nil {
		t.Fatal("ReadControlToken accepted a 0644 file")
	}
}

func TestTokenFromEnvironment(t *testing.T) {
	cfg := embeddedtest.Config(t, nil)
	cfg.Token = "ctl-env-token-" + strings.Repeat("e", 20)
	m := embeddedtest.Start(t, cfg)
	if m.Token() != cfg.Token || m.TokenFile() != "" {
		t.Fatalf("Token() = %q, TokenFile() = %q; want the configured token and no file", m.Token(), m.TokenFile())
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, embedded.ControlTokenFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a control-token file was written although BELAY_TOKEN is set: %v", err)
	}
	if _, err := clientOf(t, m).ListRuns(context.Background(), httpapi.ListRunsOptions{}); err != nil {
		t.Fatalf("a call with the configured token: %v", err)
	}
}

// TestCloseFinishesInFlightRequests sends half a run request, closes the
// server, checks it no longer accepts connections but is still waiting,
// sends the rest and gets the run; a restart on the same data directory
// still has it.
func TestCloseFinishesInFlightRequests(t *testing.T) {
	cfg := embeddedtest.Config(t, nil)
	m, err := embedded.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- m.Run(context.Background()) }()
	<-m.Ready()
	addr := m.Addr()

	body := []byte(`{"instruction":"Fix calc.py","files":[{"path":"calc.py","content":"def add(a, b):\n    return a - b\n"}],` +
		`"allowedPaths":["calc.py"],"checks":[["python3","-m","pytest","-q"]]}`)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Expect: 100-continue makes the server say when the handler starts
	// reading the body: from then on the request is in flight.
	fmt.Fprintf(conn, "POST /v1/runs HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", addr, m.Token(), len(body))
	br := bufio.NewReader(conn)
	if cont, err := http.ReadResponse(br, nil); err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue before the body: %v", err)
	}
	if _, err := conn.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	// Shutdown has begun once the listener refuses connections.
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was still in flight", err)
	default:
	}

	if _, err := conn.Write(body[len(body)/2:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the in-flight request got no answer: %v", err)
	}
	defer resp.Body.Close()
	var created wire.CreateRunResponse
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("in-flight create: %d, %v", resp.StatusCode, err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run after Close: %v", err)
	}

	again := embeddedtest.Start(t, cfg)
	if _, err := clientOf(t, again).GetRun(context.Background(), created.RunID); err != nil {
		t.Fatalf("the run created during shutdown is gone after a restart: %v", err)
	}
}

// TestFollowerResumesAcrossRestart follows a running run's events while the
// control plane shuts down and starts again on the same address: the
// stream ends at shutdown, the client reconnects after the restart, and
// sees every event exactly once, up to the run's end.
func TestFollowerResumesAcrossRestart(t *testing.T) {
	cfg := embeddedtest.Config(t, nil)
	cfg.SandboxBin = embeddedtest.IdleSandbox(t)
	// The restart fails the run it interrupted, which ends the stream
	// (with resumes on, an idle sandbox would take the run's wall time).
	noResumes(&cfg)
	m, err := embedded.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- m.Run(context.Background()) }()
	<-m.Ready()
	c := clientOf(t, m)
	created, err := c.CreateRun(context.Background(), runRequest(), "")
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan struct{})
	var got []belay.Event
	followed := make(chan error, 1)
	go func() {
		followed <- c.StreamEvents(ctx, created.RunID, 0, func(e belay.Event) error {
			got = append(got, e)
			if e.Type == belay.EventRunStarted {
				close(started)
			}
			return nil
		})
	}()
	select {
	case <-started:
	case err := <-followed:
		t.Fatalf("the stream ended before run.started: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close with a stream open: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	cfg.Addr = m.Addr()
	embeddedtest.Start(t, cfg)
	if err := <-followed; err != nil {
		t.Fatalf("StreamEvents across the restart: %v", err)
	}
	for i, e := range got {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d; want every event once, in order", i, e.Seq)
		}
	}
	last := got[len(got)-1]
	if last.Type != belay.EventRunFailed || !strings.Contains(string(last.Data), "shutting down") {
		t.Fatalf("last event %s %s; want run.failed for the shutdown", last.Type, last.Data)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	keyCanary := "sk-canary-" + strings.Repeat("k", 24)
	badKeyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(badKeyFile, []byte(keyCanary), 0o644); err != nil {
		t.Fatal(err)
	}
	goodKeyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(goodKeyFile, []byte(keyCanary), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream := func(url string) func(*embedded.Config) {
		return func(c *embedded.Config) {
			c.ScriptedModel, c.Model, c.ModelAPIURL, c.ModelAPIKey = "", "gpt-test", url, keyCanary
		}
	}
	tests := []struct {
		name string
		edit func(*embedded.Config)
		want []string
	}{
		{"sandbox event cap from the environment", func(c *embedded.Config) {
			c.SandboxEventLimits = embedded.ConfigFromEnv(func(k string) (string, bool) {
				return map[string]string{"BELAY_SANDBOX_EVENTS": "lots"}[k], k == "BELAY_SANDBOX_EVENTS"
			}).SandboxEventLimits
		}, []string{"BELAY_SANDBOX_EVENTS", "positive whole number"}},
		{"negative sandbox event bytes", func(c *embedded.Config) { c.SandboxEventLimits.MaxBytes = -5 },
			[]string{"BELAY_SANDBOX_EVENT_BYTES", "--sandbox-event-bytes"}},
		{"http to a non-loopback host", upstream("http://models.example.com/v1/chat/completions"),
			[]string{"BELAY_MODEL_API_URL", "plain http only for a loopback host"}},
		{"query string", upstream("https://models.example.com/v1/chat/completions?key=x"),
			[]string{"BELAY_MODEL_API_URL", "must not have a query"}},
		{"fragment", upstream("https://models.example.com/v1/chat/completions#x"),
			[]string{"BELAY_MODEL_API_URL", "fragment"}},
		{"credentials in the URL", upstream("https://u:pw@models.example.com/v1/chat/completions"),
			[]string{"BELAY_MODEL_API_URL", "credentials"}},
		{"wrong path", upstream("https://models.example.com/v1/completions"),
			[]string{"BELAY_MODEL_API_URL", "/chat/completions"}},
		{"no upstream URL", upstream(""), []string{"BELAY_MODEL_API_URL", "is not set"}},
		{"no model", func(c *embedded.Config) {
			upstream("https://models.example.com/v1/chat/completions")(c)
			c.Model = ""
		}, []string{"BELAY_MODEL", "is not set"}},
		{"no key", func(c *embedded.Config) {
			upstream("https://models.example.com/v1/chat/completions")(c)
			c.ModelAPIKey = ""
		}, []string{"BELAY_MODEL_API_KEY", "BELAY_MODEL_API_KEY_FILE"}},
		{"key and key file", func(c *embedded.Config) {
			upstream("https://models.example.com/v1/chat/completions")(c)
			c.ModelAPIKeyFile = goodKeyFile
		}, []string{"both BELAY_MODEL_API_KEY and BELAY_MODEL_API_KEY_FILE"}},
		{"key file readable by others", func(c *embedded.Config) {
			upstream("https://models.example.com/v1/chat/completions")(c)
			c.ModelAPIKey, c.ModelAPIKeyFile = "", badKeyFile
		}, []string{"BELAY_MODEL_API_KEY_FILE"}},
		{"scripted session and upstream", func(c *embedded.Config) {
			c.ModelAPIURL = "https://models.example.com/v1/chat/completions"
		}, []string{"BELAY_SCRIPTED_MODEL", "BELAY_MODEL_API_URL"}},
		{"missing script", func(c *embedded.Config) { c.ScriptedModel = "/nonexistent/script.json" },
			[]string{"BELAY_SCRIPTED_MODEL"}},
		{"short token", func(c *embedded.Config) { c.Token = "short" }, []string{"BELAY_TOKEN", "shorter than 16"}},
		{"missing sandbox binary", func(c *embedded.Config) { c.SandboxBin = "/nonexistent/belay-sandbox" },
			[]string{"BELAY_SANDBOX_BIN"}},
		{"bad address", func(c *embedded.Config) { c.Addr = "8700" }, []string{"BELAY_ADDR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := embeddedtest.Config(t, nil)
			tt.edit(&cfg)
			_, err := embedded.New(cfg)
			if err == nil {
				t.Fatal("New accepted the configuration")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), keyCanary) {
				t.Errorf("the error repeats the provider key: %v", err)
			}
			if _, serr := os.Stat(cfg.DataDir); !errors.Is(serr, fs.ErrNotExist) {
				t.Errorf("a refused configuration still created the data directory")
			}
		})
	}

	t.Run("valid https upstream with a key file", func(t *testing.T) {
		cfg := embeddedtest.Config(t, nil)
		upstream("https://models.example.com/v1/chat/completions")(&cfg)
		cfg.ModelAPIKey, cfg.ModelAPIKeyFile = "", goodKeyFile
		if _, err := embedded.New(cfg); err != nil {
			t.Fatalf("New: %v", err)
		}
	})
}

func TestSecretsStayOutOfLogs(t *testing.T) {
	logs := &embeddedtest.Logs{}
	cfg := embeddedtest.Config(t, logs)
	cfg.Token = "ctl-canary-" + strings.Repeat("t", 24)
	cfg.ModelAPIKey = "sk-canary-" + strings.Repeat("k", 24)
	m := embeddedtest.Start(t, cfg)
	c := clientOf(t, m)
	ctx := context.Background()
	created, err := c.CreateRun(ctx, runRequest(), "")
	if err != nil {
		t.Fatal(err)
	}
	// The inert sandbox fails the run; follow it to its end so the
	// orchestrator's lines are in.
	if err := c.StreamEvents(ctx, created.RunID, 0, func(belay.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	bad, err := httpapi.NewClient("http://"+m.Addr(), "ctl-wrong-"+strings.Repeat("w", 20))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.GetRun(ctx, created.RunID); !belay.IsCode(err, belay.CodeUnauthorized) {
		t.Fatalf("wrong token: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, created.RunID) {
		t.Fatalf("the logs never mention the run; is the logger wired? %s", out)
	}
	for _, secret := range []string{cfg.Token, cfg.ModelAPIKey, "ctl-wrong-", "return a - b"} {
		if strings.Contains(out, secret) {
			t.Errorf("the logs contain %q", secret)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"BELAY_ADDR": "127.0.0.1:9000", "BELAY_DATA_DIR": "/srv/belay", "BELAY_MODEL": "gpt-x",
		"BELAY_MODEL_API_URL": "https://m.example.com/v1/chat/completions", "BELAY_MODEL_API_KEY": "sk-1",
		"BELAY_MODEL_API_KEY_FILE": "/run/key", "BELAY_TOKEN": "tok", "BELAY_SANDBOX_BIN": "/opt/belay-sandbox",
		"BELAY_SANDBOX_DIR": "/srv/sbx", "BELAY_SCRIPTED_MODEL": "/x/s.json", "HOME": "/home/u",
		"BELAY_SANDBOX_EVENTS": "300", "BELAY_SANDBOX_EVENT_BYTES": "65536",
	}
	got := embedded.ConfigFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	want := embedded.Config{
		Addr: "127.0.0.1:9000", DataDir: "/srv/belay", Model: "gpt-x",
		ModelAPIURL: "https://m.example.com/v1/chat/completions", ModelAPIKey: "sk-1",
		ModelAPIKeyFile: "/run/key", Token: "tok", SandboxBin: "/opt/belay-sandbox",
		SandboxDir: "/srv/sbx", ScriptedModel: "/x/s.json",
		SandboxEventLimits: belay.SandboxEventLimits{MaxEvents: 300, MaxBytes: 65536},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("ConfigFromEnv =\n%+v\nwant\n%+v", got, want)
	}
}

func TestDefaultDataDir(t *testing.T) {
	tests := []struct {
		euid int
		env  map[string]string
		want string
	}{
		{1000, map[string]string{"BELAY_DATA_DIR": "/srv/belay", "HOME": "/home/u"}, "/srv/belay"},
		{1000, map[string]string{"XDG_DATA_HOME": "/xdg", "HOME": "/home/u"}, "/xdg/belay"},
		{1000, map[string]string{"XDG_DATA_HOME": "relative", "HOME": "/home/u"}, "/home/u/.local/share/belay"},
		{1000, map[string]string{"HOME": "/home/u"}, "/home/u/.local/share/belay"},
		{1000, map[string]string{}, ""},
		// Root gets system locations, whatever its HOME: root's home is
		// out of the sandbox uids' reach.
		{0, map[string]string{"BELAY_DATA_DIR": "/srv/belay", "HOME": "/root"}, "/srv/belay"},
		{0, map[string]string{"XDG_DATA_HOME": "/xdg", "HOME": "/root"}, embedded.DefaultRootDataDir},
		{0, map[string]string{}, embedded.DefaultRootDataDir},
	}
	for _, tt := range tests {
		got := embedded.DefaultDataDirAs(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }, tt.euid)
		if got != tt.want {
			t.Errorf("DefaultDataDir(%v) as uid %d = %q; want %q", tt.env, tt.euid, got, tt.want)
		}
	}
}

func TestFindSandboxBin(t *testing.T) {
	exeDir, pathDir, plainDir := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(dir string, mode os.FileMode) string {
		p := filepath.Join(dir, embedded.SandboxBinName)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	beside := write(exeDir, 0o755)
	onPath := write(pathDir, 0o755)
	notExec := write(plainDir, 0o644)
	exe := func(dir string) func() (string, error) {
		return func() (string, error) { return filepath.Join(dir, "belay"), nil }
	}
	path := func(found string) func(string) (string, error) {
		return func(string) (string, error) {
			if found == "" {
				return "", errors.New("not found")
			}
			return found, nil
		}
	}
	empty := t.TempDir()
	tests := []struct {
		name       string
		configured string
		exe        func() (string, error)
		lookPath   func(string) (string, error)
		want       string
		wantErr    string
	}{
		{"configured", onPath, exe(exeDir), path(""), onPath, ""},
		{"configured but missing", filepath.Join(empty, "nope"), exe(exeDir), path(onPath), "", "BELAY_SANDBOX_BIN"},
		{"configured but not executable", notExec, exe(exeDir), path(onPath), "", "not executable"},
		{"beside the executable", "", exe(exeDir), path(onPath), beside, ""},
		{"on PATH", "", exe(empty), path(onPath), onPath, ""},
		{"nowhere", "", exe(empty), path(""), "", "no sandbox binary"},
	}
	for _, tt := range tests {
		got, err := embedded.FindSandboxBin(tt.configured, tt.exe, tt.lookPath)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %q, %v; want an error containing %q", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// TestDataDirLetsTheSandboxUserThrough checks the data directory's mode
// when the sandbox workspaces are inside it (the default): as root the
// unprivileged sandbox user must pass through it (0711, no listing);
// otherwise it stays the owner's alone.
func TestDataDirLetsTheSandboxUserThrough(t *testing.T) {
	cfg := embeddedtest.Config(t, nil)
	cfg.DataDir = filepath.Join(embeddedtest.SandboxDir(t), "data")
	cfg.SandboxDir = ""
	embeddedtest.Start(t, cfg)
	want := fs.FileMode(0o700)
	if os.Geteuid() == 0 {
		want = 0o711
	}
	if mode := modeOf(t, cfg.DataDir).Perm(); mode != want {
		t.Errorf("data directory has mode %04o; want %04o", mode, want)
	}
	for _, private := range []string{embedded.ControlTokenFile, embedded.SigningKeyFile, "belay.db"} {
		if mode := modeOf(t, filepath.Join(cfg.DataDir, private)).Perm(); mode != 0o600 {
			t.Errorf("%s has mode %04o; want 0600", private, mode)
		}
	}
	if mode := modeOf(t, filepath.Join(cfg.DataDir, "artifacts")).Perm(); mode != 0o700 {
		t.Errorf("artifacts folder has mode %04o; want 0700", mode)
	}
}

// TestNewDefaultDataDir shows that a Config without a data directory gets
// the one DefaultDataDir names, where the CLI looks for the token: as root
// DefaultRootDataDir (0700), with the sandbox workspaces in
// DefaultRootSandboxDir (0711), created in a private mount namespace whose
// /var/lib is empty, so the machine's is not touched.
func TestNewDefaultDataDir(t *testing.T) {
	xdg := t.TempDir()
	t.Setenv(embedded.EnvDataDir, "")
	t.Setenv("XDG_DATA_HOME", xdg)
	cfg := embeddedtest.Config(t, nil)
	cfg.DataDir, cfg.SandboxDir = "", ""
	want := filepath.Join(xdg, "belay")
	if os.Geteuid() == 0 {
		want = embedded.DefaultRootDataDir
	}
	check := func() {
		m, err := embedded.New(cfg)
		if err != nil {
			t.Error(err)
			return
		}
		if m.DataDir() != want || m.TokenFile() != filepath.Join(want, embedded.ControlTokenFile) {
			t.Errorf("DataDir() = %q, TokenFile() = %q; want them under %s", m.DataDir(), m.TokenFile(), want)
		}
		tok, err := embedded.ReadControlToken(embedded.DefaultDataDir(os.LookupEnv))
		if err != nil || tok != m.Token() {
			t.Errorf("the CLI's lookup finds %v; want the token New wrote", err)
		}
		if mode := modeOf(t, want).Perm(); mode != 0o700 {
			t.Errorf("data directory %s has mode %04o; want 0700", want, mode)
		}
		if os.Geteuid() == 0 && m.SandboxDir() != embedded.DefaultRootSandboxDir {
			t.Errorf("SandboxDir() = %q; want %s", m.SandboxDir(), embedded.DefaultRootSandboxDir)
		}
	}
	if os.Geteuid() != 0 {
		check()
		return
	}
	onPrivateVarLib(t, check)
}

// onPrivateVarLib runs f on an OS thread of its own, in a mount namespace
// of its own whose /var/lib is an empty tmpfs: root's default locations
// can be made there without touching the machine's. The thread is never
// given back (the goroutine ends locked), so the namespace ends with it.
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

// TestOldImageCacheRemoved starts belay on a data directory where an
// earlier belay unpacked an image (<data dir>/oci/images, read-only parts
// included) and finds it gone, said in the log, with runc's state folder
// and everything else of the data directory kept.
func TestOldImageCacheRemoved(t *testing.T) {
	logs := &embeddedtest.Logs{}
	cfg := embeddedtest.Config(t, logs)
	old := filepath.Join(cfg.DataDir, "oci", "images")
	rootfs := filepath.Join(old, "sha256-0123", "rootfs", "usr", "bin")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "python3"), []byte("not really"), 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(rootfs, 0o555); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(cfg.DataDir, "oci", "state-of-runc")
	if err := os.WriteFile(keep, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := embeddedtest.Start(t, cfg)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the old image cache %s is still there (%v)", old, err)
	}
	if got := readFile(t, keep); got != "kept" {
		t.Fatalf("%s = %q; the rest of oci/ must stay", keep, got)
	}
	if !strings.Contains(logs.String(), "removed the image cache an earlier belay left") || !strings.Contains(logs.String(), old) {
		t.Fatalf("the log does not say the old cache was removed:\n%s", logs.String())
	}
}
