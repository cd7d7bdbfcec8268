package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/embedded"
	"github.com/belay-dev/belay/internal/embedded/embeddedtest"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
)

// calcRepo serves examples/calc as a git repository on loopback (git
// http-backend behind net/http/cgi), with credentials belay serve holds.
func calcRepo(t *testing.T) (*gittest.Repo, string) {
	t.Helper()
	srv := gittest.Start(t, "x-access-token", "ghs_cli_CANARY_token")
	files := map[string]string{}
	for _, p := range []string{"calc.py", "tests/test_calc.py", "tests/conftest.py", "README.md"} {
		b := mustRead(t, filepath.Join(embeddedtest.ModuleRoot(t), "examples", "calc", p))
		files[p] = b
	}
	repo := srv.NewRepo(t, "octo-org/calc", files, true)
	return repo, strings.Replace(srv.URL, "http://", "http://x-access-token:ghs_cli_CANARY_token@", 1)
}

// TestRunRepoFixesCalc: belay run --repo has the server fetch the tree
// from git (the same path a repository event takes), and the run fixes it.
func TestRunRepoFixesCalc(t *testing.T) {
	gittest.NeedGit(t)
	repo, creds := calcRepo(t)
	head := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
	entry := embeddedtest.RealSandbox(t)
	s := startServer(t, func(c *embedded.Config) {
		c.SandboxBin = entry
		c.RepoEvents.GitCredentials = creds
	})
	r := s.belay(t, "run", "--repo", repo.URL, "--ref", "main", "--instruction", "Fix the failing test in calc.py",
		"--allow", "calc.py", "--check", "python3 -m pytest -q", "--follow")
	if r.code != 0 {
		t.Fatalf("belay run --repo = %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"run.completed", "changed files: calc.py", "+    return a + b"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	id := strings.Split(r.stdout, "\n")[0]
	view, err := s.client(t).GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if g := view.Request.Source; g == nil || g.Git.URL != repo.URL || g.Git.Ref != "main" || g.Git.Commit != head || g.Git.Tree.Files != 4 {
		t.Errorf("the run's source is %+v; want %s at main = %s", view.Request.Source, repo.URL, head)
	}
	if len(view.Request.Files) != 0 {
		t.Errorf("the run uploaded files %v", view.Request.Files)
	}
	if strings.Contains(r.stdout+r.stderr, "ghs_cli_CANARY_token") {
		t.Errorf("the CLI printed the server's git token")
	}
}

// TestRunRepoRefusals: bad --repo and --ref values are refused before
// any request, and what the server finds wrong comes back clearly; no run
// is created.
func TestRunRepoRefusals(t *testing.T) {
	gittest.NeedGit(t)
	repo, creds := calcRepo(t)
	s := startServer(t, func(c *embedded.Config) { c.RepoEvents.GitCredentials = creds })
	base := []string{"--instruction", "Fix it", "--allow", "calc.py", "--check", "python3 -m pytest -q"}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"ssh URL", []string{"--repo", "ssh://github.com/o/r.git"}, 2, `has scheme "ssh"; allowed is https`},
		{"credentials in the URL", []string{"--repo", "https://u:p@github.com/o/r.git"}, 2, "holds credentials"},
		{"file URL", []string{"--repo", "file:///etc"}, 2, "only the operator's triggers file may name local mirrors"},
		{"http elsewhere", []string{"--repo", "http://example.com/o/r.git"}, 2, "uses plain http"},
		{"bad ref", []string{"--repo", repo.URL, "--ref", "main..dev"}, 2, "holds .., @{ or //"},
		{"ref option", []string{"--repo", repo.URL, "--ref", "-c"}, 2, "may not start with - or /"},
		{"ref without repo", []string{"--ref", "main", filepath.Join(embeddedtest.ModuleRoot(t), "examples", "calc")}, 2, "--ref goes with --repo"},
		{"repo and DIR", []string{"--repo", repo.URL, "somedir"}, 2, "takes no arguments"},
		{"no such ref", []string{"--repo", repo.URL, "--ref", "nope"}, 1, `ref "nope" is not a branch or tag`},
		{"no such repository", []string{"--repo", strings.TrimSuffix(repo.URL, ".git") + "-gone.git"}, 1, "no repository at"},
		{"path not in the tree", []string{"--repo", repo.URL, "--allow", "src/**"}, 1, `"src/**" matches no uploaded file`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"run"}, base...), tt.args...)
			if tt.name == "path not in the tree" {
				args = []string{"run", "--instruction", "Fix it", "--allow", "src/**", "--check", "python3 -m pytest -q", "--repo", repo.URL}
			}
			r := s.belay(t, args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("belay %v = %d\nstderr: %s\nwant %d and %q", args, r.code, r.stderr, tt.code, tt.stderr)
			}
		})
	}
	if list := s.belay(t, "runs"); !strings.Contains(list.stdout, "no runs") {
		t.Errorf("refused invocations created runs:\n%s", list.stdout)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
