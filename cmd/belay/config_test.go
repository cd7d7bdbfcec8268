package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/wire"
)

// operatorServer is a server whose operator accepts Kotlin files and
// allowlists a Gradle check, through the BELAY_* variables as belay serve
// reads them.
func operatorServer(t *testing.T) *server {
	t.Helper()
	return startServer(t, func(c *embedded.Config) {
		c.Limits = embedded.ConfigFromEnv(func(k string) (string, bool) {
			switch k {
			case embedded.EnvExtensions:
				return " .kt, .KTS ", true
			case embedded.EnvChecks:
				return "gradle test; go test ./...", true
			}
			return "", false
		}).Limits
	})
}

// kotlinProject is a project with a Kotlin source, a Python one and a file
// no server here accepts.
func kotlinProject(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"Main.kt":          "fun main() = println(add(2, 3))\n",
		"calc.py":          "def add(a, b):\n    return a - b\n",
		"notes.adoc":       "= Notes\n",
		"build.gradle.kts": "plugins { kotlin(\"jvm\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRunUploadsWhatTheServerAccepts(t *testing.T) {
	dir := kotlinProject(t)
	args := []string{"run", dir, "--instruction", "Fix add", "--allow", "Main.kt", "--check", "git diff --check"}

	s := operatorServer(t)
	r := s.belay(t, args...)
	if r.code != 0 {
		t.Fatalf("belay run = %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	view, err := s.client(t).GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := view.Request.Files; !slices.Equal(got, []string{"Main.kt", "build.gradle.kts", "calc.py"}) {
		t.Errorf("uploaded %v; want the operator's .kt and .kts files with calc.py", got)
	}
	if !strings.Contains(r.stderr, "skipping notes.adoc: the server does not accept this extension") {
		t.Errorf("stderr does not name the file it left out:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "Main.kt") {
		t.Errorf("stderr names an uploaded file as skipped:\n%s", r.stderr)
	}

	// A server with the reference extensions: the Kotlin files are named
	// as left out, and the allow path then names no uploaded file.
	plain := startServer(t, nil)
	r = plain.belay(t, append(args[:len(args)-4], "--allow", "calc.py", "--check", "git diff --check")...)
	if r.code != 0 {
		t.Fatalf("belay run against the reference limits = %d\nstderr: %s", r.code, r.stderr)
	}
	for _, name := range []string{"Main.kt", "build.gradle.kts", "notes.adoc"} {
		if !strings.Contains(r.stderr, "skipping "+name+": the server does not accept this extension") {
			t.Errorf("stderr does not name %s:\n%s", name, r.stderr)
		}
	}
}

func TestConfigPrintsWhatTheServerAccepts(t *testing.T) {
	s := operatorServer(t)
	r := s.belay(t, "config")
	if r.code != 0 {
		t.Fatalf("belay config = %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"model:               " + s.main.Model(),
		" .py ", " .kt .KTS\n",
		"extensionless names: Makefile Dockerfile LICENSE README",
		"  python3 -m pytest -q\n", "  gradle test\n", "  go test ./...\n",
		"files:             at most 32, 64 KiB each, 512 KiB in all",
		"wall time:         180 s by default, at most 220 s",
		"git sources:       fetched by the server (belay run --repo); at most 20000 files, 100 MiB",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("belay config lacks %q:\n%s", want, r.stdout)
		}
	}

	r = s.belay(t, "config", "--json")
	if r.code != 0 {
		t.Fatalf("belay config --json = %d: %s", r.code, r.stderr)
	}
	var got wire.ServerConfig
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("belay config --json printed %q: %v", r.stdout, err)
	}
	want := belay.DefaultLimits(s.main.Model())
	want.Extensions = append(want.Extensions, ".kt", ".KTS")
	want.AllowedChecks = append(want.AllowedChecks, []string{"gradle", "test"}, []string{"go", "test", "./..."})
	// belay serve fetches git sources, also from a loopback server.
	want.GitURLs.AllowLoopbackHTTP = true
	wantCfg := wire.ConfigOf(want)
	wantCfg.GitSources = true
	if !reflect.DeepEqual(got, wantCfg) {
		t.Errorf("belay config --json = %+v\nwant %+v", got, wantCfg)
	}
	if !reflect.DeepEqual(got.RunLimits(), want) {
		t.Errorf("RunLimits() = %+v\nwant %+v", got.RunLimits(), want)
	}
}
