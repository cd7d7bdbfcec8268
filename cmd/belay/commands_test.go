package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/wire"
)

// failedRun starts a run that the inert sandbox fails at once and waits
// for its end (seq 3, run.failed).
func failedRun(t *testing.T, s *server) string {
	t.Helper()
	r := s.belay(t, "run", project(t), "--instruction", "Fix it", "--allow", "calc.py", "--check", "python3 -m pytest -q")
	if r.code != 0 {
		t.Fatalf("belay run = %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	s.waitForEvent(t, id, belay.EventRunFailed)
	return id
}

func TestReadCommands(t *testing.T) {
	s := startServer(t, nil)
	id := failedRun(t, s)
	tests := []struct {
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{[]string{"runs"}, 0, []string{"RUN", id, "failed", "sandbox exited with code 64", "0/14"}, ""},
		{[]string{"runs", "--status", "completed"}, 0, []string{"no runs"}, ""},
		{[]string{"runs", "--status", "sleeping"}, 1, nil, "status: must be one of"},
		{[]string{"runs", "show", id}, 0, []string{"run " + id + ": failed", "exit code:     64", "files:         calc.py, tests/test_calc.py"}, ""},
		{[]string{"runs", "show", "run_nosuch"}, 1, nil, "(not_found, request id req_"},
		{[]string{"events", id}, 0, []string{"#1 ", "run.queued", "#3 ", "run.failed", "sandbox exited with code 64 (exit 64)"}, ""},
		{[]string{"events", id, "--after", "2"}, 0, []string{"#3 "}, ""},
		{[]string{"events", "--follow", id}, 0, []string{"run.failed"}, ""},
		{[]string{"approvals", id}, 0, []string{"no approval requests"}, ""},
		{[]string{"artifacts", id}, 0, []string{"no artifacts"}, ""},
		{[]string{"artifacts", id, "patch.diff"}, 1, nil, "(not_found, request id req_"},
		{[]string{"artifacts", id, "secrets.txt"}, 1, nil, "artifact not found"},
		{[]string{"cancel", id}, 1, nil, "(conflict, request id req_"},
		{[]string{"approve", id, "apr_nosuch", "deny"}, 1, nil, "(not_found, request id req_"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := s.belay(t, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Fatalf("= %d\nstdout: %s\nstderr: %s\nwant %d and stderr with %q", r.code, r.stdout, r.stderr, tt.code, tt.stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
				}
			}
		})
	}

	t.Run("events after 2 leaves out the earlier events", func(t *testing.T) {
		r := s.belay(t, "events", id, "--after", "2")
		if strings.Contains(r.stdout, "run.queued") || strings.Contains(r.stdout, "run.started") {
			t.Errorf("stdout: %s", r.stdout)
		}
	})
	t.Run("events as JSON", func(t *testing.T) {
		r := s.belay(t, "events", id, "--json")
		var got []belay.Event
		sc := bufio.NewScanner(strings.NewReader(r.stdout))
		for sc.Scan() {
			var e belay.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			got = append(got, e)
		}
		if len(got) != 3 || got[0].Seq != 1 || got[2].Type != belay.EventRunFailed {
			t.Fatalf("events --json = %+v", got)
		}
	})
	t.Run("runs as JSON", func(t *testing.T) {
		r := s.belay(t, "runs", "--json")
		var list wire.RunList
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Runs) != 1 || list.Runs[0].RunID != id {
			t.Fatalf("runs --json = %s (%v)", r.stdout, err)
		}
	})
}

func TestApproveAndCancel(t *testing.T) {
	// The idle sandbox keeps the run running until it is cancelled.
	s := startServer(t, func(c *embedded.Config) { c.SandboxBin = embeddedtest.IdleSandbox(t) })
	r := s.belay(t, "run", project(t), "--instruction", "Fix it", "--allow", "calc.py",
		"--check", "python3 -m pytest -q", "--approval", "ask")
	if r.code != 0 {
		t.Fatalf("belay run = %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	s.waitForEvent(t, id, belay.EventRunStarted)
	apr := s.askApproval(t, id)

	steps := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"events", id}, 0, "answer with: belay approve " + id + " " + apr, ""},
		{[]string{"approvals", id}, 0, apr, ""},
		{[]string{"approve", id, apr, "allow_once", "--reason", "only a listing"}, 0, "approval " + apr + " (shell): allow_once", ""},
		{[]string{"approve", id, apr, "deny"}, 1, "", "is already decided (allow_once) (conflict, request id req_"},
		{[]string{"approvals", id}, 0, "allow_once (user)", ""},
		{[]string{"events", id}, 0, `shell {"command":"ls -la"} (` + apr + ")", ""},
		{[]string{"events", id}, 0, "allow_once by user (" + apr + "): only a listing", ""},
		{[]string{"cancel", id}, 0, "run " + id + ": cancel requested", ""},
		{[]string{"events", id, "--follow"}, 0, "run.cancelled", ""},
		{[]string{"runs", "show", id}, 0, ": cancelled", ""},
		{[]string{"cancel", id}, 1, "", "(conflict, request id req_"},
	}
	for _, st := range steps {
		r := s.belay(t, st.args...)
		if r.code != st.code || !strings.Contains(r.stdout, st.stdout) || !strings.Contains(r.stderr, st.stderr) {
			t.Fatalf("belay %v = %d\nstdout: %s\nstderr: %s\nwant %d, stdout with %q, stderr with %q",
				st.args, r.code, r.stdout, r.stderr, st.code, st.stdout, st.stderr)
		}
	}
}

func TestServe(t *testing.T) {
	tokenCanary := "ctl-serve-canary-" + strings.Repeat("c", 16)
	keyCanary := "sk-serve-canary-" + strings.Repeat("k", 16)
	data := t.TempDir()
	environ := map[string]string{
		embedded.EnvToken:         tokenCanary,
		embedded.EnvModelAPIKey:   keyCanary,
		embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel,
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", data,
			"--launcher", "process", "--allow-weak-isolation",
			"--sandbox-bin", embeddedtest.InertSandbox(t), "--sandbox-dir", embeddedtest.SandboxDir(t)},
			&env{stdout: &stdout, stderr: &stderr, lookup: func(k string) (string, bool) { v, ok := environ[k]; return v, ok }})
	}()
	var endpoint string
	for endpoint == "" {
		select {
		case code := <-done:
			t.Fatalf("belay serve exited %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if _, rest, ok := strings.Cut(stdout.String(), "serving on "); ok {
			if line, _, ok := strings.Cut(rest, "\n"); ok {
				endpoint = line
			}
		}
	}
	client := map[string]string{envEndpoint: endpoint, embedded.EnvToken: tokenCanary}
	if r := belayCLI(t, ctx, client, "runs"); r.code != 0 || !strings.Contains(r.stdout, "no runs") {
		t.Fatalf("belay runs against belay serve = %d: %s %s", r.code, r.stdout, r.stderr)
	}
	cancel() // what SIGINT does through signal.NotifyContext
	if code := <-done; code != 0 {
		t.Fatalf("belay serve exited %d after its context ended: %s", code, stderr.String())
	}

	out := stdout.String()
	for _, want := range []string{"model:      belay-scripted, through scripted session", "token:      from BELAY_TOKEN",
		"launcher:   process (chosen by BELAY_LAUNCHER (--launcher)", "WARNING:    weaker isolation accepted: the process launcher",
		"isolation:\n    - ", "empty environment", "not applied:\n    - ", "a private /tmp", "clients:    export BELAY_ENDPOINT=" + endpoint, "belay: stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("belay serve's output lacks %q:\n%s", want, out)
		}
	}
	logs := stderr.String()
	if !strings.Contains(logs, `"msg":"belay control plane listening"`) {
		t.Errorf("belay serve did not log JSON to a non-terminal stderr:\n%s", logs)
	}
	for _, secret := range []string{tokenCanary, keyCanary} {
		if strings.Contains(out+logs, secret) {
			t.Errorf("belay serve printed a secret")
		}
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		args    []string
		stderr  string
	}{
		{"no model", map[string]string{}, nil, "BELAY_MODEL (--model) is not set"},
		{"upstream over plain http", map[string]string{embedded.EnvModel: "m", embedded.EnvModelAPIKey: "k"},
			[]string{"--model-api-url", "http://models.example.com/v1/chat/completions"}, "BELAY_MODEL_API_URL (--model-api-url)"},
		{"upstream with a query", map[string]string{embedded.EnvModel: "m", embedded.EnvModelAPIKey: "k",
			embedded.EnvModelAPIURL: "https://models.example.com/v1/chat/completions?k=1"}, nil, "must not have a query"},
		{"positional argument", map[string]string{}, []string{"now"}, "takes no arguments"},
		{"no launcher", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--sandbox-image", "/nonexistent/belay-sandbox.oci.tar"},
			"no sandbox launcher: the OCI launcher cannot run here: BELAY_SANDBOX_IMAGE (--sandbox-image): stat /nonexistent/belay-sandbox.oci.tar"},
		{"no launcher, how to get one", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--sandbox-image", "/nonexistent/belay-sandbox.oci.tar"}, "make image"},
		{"no launcher, how to accept weaker isolation", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--sandbox-image", "/nonexistent/belay-sandbox.oci.tar"}, "--allow-weak-isolation (BELAY_ALLOW_WEAK_ISOLATION=1)"},
		{"process launcher without accepting it", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel,
			embedded.EnvLauncher: "process"}, nil, "BELAY_LAUNCHER (--launcher) is process, which gives weaker isolation"},
		{"oci launcher without its image", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--launcher", "oci", "--allow-weak-isolation", "--sandbox-image", "/nonexistent/img.tar"}, "the OCI launcher cannot run here"},
		{"unknown launcher", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--launcher", "docker"}, `"docker" is neither oci nor process`},
		{"not an extension", map[string]string{embedded.EnvModel: "m", embedded.EnvScriptedModel: embeddedtest.Config(t, nil).ScriptedModel},
			[]string{"--allow-extension", "kt"}, `BELAY_EXTENSIONS (--allow-extension) "kt" is not an extension`},
		{"empty check", map[string]string{embedded.EnvModel: "m"}, []string{"--allow-check", " "}, `--allow-check " " is empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"serve", "--data-dir", t.TempDir(), "--sandbox-bin", embeddedtest.InertSandbox(t)}, tt.args...)
			r := belayCLI(t, context.Background(), tt.environ, args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("belay serve = %d\nstderr: %s\nwant an error with %q", r.code, r.stderr, tt.stderr)
			}
		})
	}
}

// TestOutputEscapesTerminalControls feeds a run's log the kind of text a
// hostile model or sandbox could write, terminal escape sequences among it
// (clear the screen, set the clipboard, a bare carriage return that hides
// what came before), and shows that `belay events` prints them escaped.
func TestOutputEscapesTerminalControls(t *testing.T) {
	s := startServer(t, func(c *embedded.Config) { c.SandboxBin = embeddedtest.IdleSandbox(t) })
	r := s.belay(t, "run", project(t), "--instruction", "Fix it", "--allow", "calc.py", "--check", "python3 -m pytest -q")
	if r.code != 0 {
		t.Fatalf("belay run = %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	s.waitForEvent(t, id, belay.EventRunStarted)

	batch := `{"batchId":"escapes","events":[` +
		`{"type":"agent.message","data":{"text":"all fixed\u001b]52;c;ZXZpbA==\u0007\rnothing to see"}},` +
		`{"type":"tool.result","data":{"step":1,"name":"read_file","result":"\u001b[2J\u009b31mred"}}]}`
	req, err := http.NewRequest("POST", "http://"+s.main.Addr()+"/internal/v1/runs/"+id+"/events", strings.NewReader(batch))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.runTokens(t, id).Events)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("append the events: %d", resp.StatusCode)
	}

	out := s.belay(t, "events", id)
	if out.code != 0 {
		t.Fatalf("belay events = %d: %s", out.code, out.stderr)
	}
	if i := strings.IndexFunc(out.stdout, func(r rune) bool { return r != '\n' && unicode.IsControl(r) }); i >= 0 {
		t.Errorf("belay events printed control character %q:\n%q", out.stdout[i:i+1], out.stdout)
	}
	for _, want := range []string{`all fixed\x1b]52;c;ZXZpbA==\x07\x0dnothing to see`, `read_file ok: \x1b[2J\x9b31mred`} {
		if !strings.Contains(out.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.stdout)
		}
	}
}
