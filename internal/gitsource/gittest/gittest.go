// Package gittest runs a real git server on loopback for tests: git's own
// http-backend behind net/http/cgi, serving bare repositories from a
// temporary folder over the smart HTTP protocol, with basic auth checked
// against one user and password (like a host checking a token), pushes
// allowed to that user, and fetches of commits by id allowed as GitHub
// allows them (uploadpack.allowReachableSHA1InWant). Work trees are made
// with the git command, so the repositories are git's, not a library's.
package gittest

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Server is a git server on loopback.
type Server struct {
	URL  string // http://127.0.0.1:PORT
	Root string // the folder of bare repositories
	// User and Password are what every request must present (basic auth);
	// empty User serves anonymously.
	User, Password string

	mu       sync.Mutex
	requests []Request
}

// Request is one request the server answered.
type Request struct {
	Method, Path, Query string
	User                string // the basic-auth user, "" when none
	Authorized          bool
}

// NeedGit skips the test when git is not installed, outside CI; under
// CI=true it fails: CI installs git.
func NeedGit(tb testing.TB) string {
	tb.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("git is not installed (CI installs it: apt-get install git)")
		}
		tb.Skip("git is not installed; apt-get install git")
	}
	return git
}

// Start starts a server whose requests must carry user and password (none
// when user is empty). It stops when the test ends.
func Start(tb testing.TB, user, password string) *Server {
	tb.Helper()
	git := NeedGit(tb)
	s := &Server{Root: tb.TempDir(), User: user, Password: password}
	execPath, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		tb.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	h := &cgi.Handler{
		Path: backend,
		Env: []string{
			"GIT_PROJECT_ROOT=" + s.Root,
			"GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1",
			"HOME=" + s.Root,
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		authorized := s.User == "" || (ok && u == s.User && p == s.Password)
		s.mu.Lock()
		s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, User: u, Authorized: authorized})
		s.mu.Unlock()
		if !authorized {
			w.Header().Set("WWW-Authenticate", `Basic realm="gittest"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		// http-backend lets an authenticated user push.
		r.Header.Del("Authorization")
		env := *h
		if s.User != "" {
			env.Env = append(append([]string(nil), h.Env...), "REMOTE_USER="+s.User)
		} else {
			env.Env = append(append([]string(nil), h.Env...), "REMOTE_USER=anonymous")
		}
		env.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Requests returns what the server answered so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Repo is a work tree whose commits the test makes with git, and its bare
// twin on the server.
type Repo struct {
	tb   testing.TB
	Dir  string // the work tree
	Bare string // the bare repository the server serves
	URL  string // its clone URL on the server
	Name string // "owner/name"
}

// NewRepo creates owner/name: a work tree with the files committed on
// main, pushed to a bare repository the server serves. allowByID lets
// clients fetch any reachable commit by id, as GitHub does.
func (s *Server) NewRepo(tb testing.TB, name string, files map[string]string, allowByID bool) *Repo {
	tb.Helper()
	r := &Repo{tb: tb, Dir: tb.TempDir(), Bare: filepath.Join(s.Root, name+".git"), URL: s.URL + "/" + name + ".git", Name: name}
	Git(tb, "", "init", "-q", "--bare", "-b", "main", r.Bare)
	Git(tb, r.Bare, "config", "http.receivepack", "true")
	if allowByID {
		Git(tb, r.Bare, "config", "uploadpack.allowReachableSHA1InWant", "true")
	}
	Git(tb, "", "init", "-q", "-b", "main", r.Dir)
	Git(tb, r.Dir, "remote", "add", "origin", r.Bare)
	r.Commit(files, "initial commit")
	return r
}

// Commit writes files (content "" removes a file) and commits them on the
// current branch, pushes to the bare repository, and returns the commit.
func (r *Repo) Commit(files map[string]string, message string) string {
	r.tb.Helper()
	for p, content := range files {
		full := filepath.Join(r.Dir, filepath.FromSlash(p))
		if content == "" {
			if err := os.Remove(full); err != nil {
				r.tb.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			r.tb.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			r.tb.Fatal(err)
		}
	}
	Git(r.tb, r.Dir, "add", "-A")
	Git(r.tb, r.Dir, "commit", "-q", "--allow-empty", "-m", message)
	Git(r.tb, r.Dir, "push", "-q", "origin", "HEAD")
	return strings.TrimSpace(Git(r.tb, r.Dir, "rev-parse", "HEAD"))
}

// Git runs git in dir with a fixed identity and no user configuration,
// and returns its standard output; it fails the test on an error.
func Git(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Octo Cat", "GIT_AUTHOR_EMAIL=octocat@example.com",
		"GIT_COMMITTER_NAME=Octo Cat", "GIT_COMMITTER_EMAIL=octocat@example.com",
		"GIT_TERMINAL_PROMPT=0")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		tb.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}
