package gitsource_test

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/gitsource"
	"github.com/belay-dev/belay/internal/gitsource/gittest"
)

// password is the token the loopback git server wants; no error message
// may ever hold it.
const password = "ghp_CANARY_git_token_5b1e9d"

func creds(t *testing.T, lines ...string) *gitsource.Credentials {
	t.Helper()
	c, err := gitsource.ParseCredentials(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func client(t *testing.T, srv *gittest.Server) *gitsource.Client {
	t.Helper()
	return gitsource.New(gitsource.Config{
		Credentials: creds(t, "# the loopback host", strings.Replace(srv.URL, "http://", "http://x-access-token:"+password+"@", 1)),
		TempDir:     t.TempDir(),
	})
}

var files1 = map[string]string{
	"calc.py":            "def add(a, b):\n    return a - b\n",
	"tests/test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n",
	"README.md":          "# calc\n",
}

// bundleRepo clones the fetched bundle with git itself and returns the
// clone's folder: the bundle must be something git takes.
func bundleRepo(t *testing.T, f *gitsource.Fetched) string {
	t.Helper()
	rc, err := f.OpenBundle()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "source.bundle")
	b, _ := io.ReadAll(rc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != f.Bundle.Size {
		t.Errorf("bundle is %d bytes, Fetched says %d", len(b), f.Bundle.Size)
	}
	dir := filepath.Join(t.TempDir(), "clone")
	gittest.Git(t, "", "init", "-q", dir)
	gittest.Git(t, dir, "bundle", "verify", path)
	gittest.Git(t, dir, "-c", "transfer.fsckObjects=true", "fetch", "-q", path, "refs/belay/base:refs/heads/base")
	return dir
}

func TestFetchExactCommit(t *testing.T) {
	for _, byID := range []bool{true, false} {
		name := "by id"
		if !byID {
			name = "server refuses ids"
		}
		t.Run(name, func(t *testing.T) {
			srv := gittest.Start(t, "x-access-token", password)
			repo := srv.NewRepo(t, "octo-org/octo-repo", files1, byID)
			first := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
			second := repo.Commit(map[string]string{"calc.py": "def add(a, b):\n    return a + b\n", "NOTES.txt": "later\n"}, "a later commit")

			f, err := client(t, srv).Fetch(t.Context(), belay.GitSource{URL: repo.URL, Commit: first}, gitsource.DefaultLimits())
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			defer f.Close()
			if f.Commit != first {
				t.Errorf("fetched %s, want the event's commit %s", f.Commit, first)
			}
			want := []string{"README.md", "calc.py", "tests/test_calc.py"}
			if !slices.Equal(f.Paths, want) {
				t.Errorf("paths %v, want %v", f.Paths, want)
			}
			if f.Tree.Files != 3 || f.Tree.Bytes != int64(len(files1["calc.py"])+len(files1["tests/test_calc.py"])+len(files1["README.md"])) {
				t.Errorf("tree %+v", f.Tree)
			}
			dir := bundleRepo(t, f)
			if got := strings.TrimSpace(gittest.Git(t, dir, "rev-parse", "base")); got != first {
				t.Errorf("the bundle's ref is at %s, want %s", got, first)
			}
			if got := gittest.Git(t, dir, "show", "base:calc.py"); got != files1["calc.py"] {
				t.Errorf("calc.py at the base = %q", got)
			}
			// The later commit is not part of what the sandbox gets.
			if out, _ := gitOK(dir, "cat-file", "-e", second+"^{commit}"); out {
				t.Errorf("the bundle holds the later commit %s", second)
			}
			for _, r := range srv.Requests() {
				if !r.Authorized || r.User != "x-access-token" {
					t.Errorf("request %s %s went without the control plane's credentials", r.Method, r.Path)
				}
			}
		})
	}
}

func gitOK(dir string, args ...string) (bool, string) {
	cmd := exec(dir, args...)
	out, err := cmd.CombinedOutput()
	return err == nil, string(out)
}

func TestFetchRefs(t *testing.T) {
	srv := gittest.Start(t, "x-access-token", password)
	repo := srv.NewRepo(t, "octo-org/refs", files1, true)
	first := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
	gittest.Git(t, repo.Dir, "tag", "-a", "-m", "release one", "v1")
	gittest.Git(t, repo.Dir, "push", "-q", "origin", "v1")
	tip := repo.Commit(map[string]string{"calc.py": "def add(a, b):\n    return a + b\n"}, "fix")
	c := client(t, srv)
	for _, tc := range []struct{ ref, want, wantRef string }{
		{"", tip, "refs/heads/main"},
		{"main", tip, "refs/heads/main"},
		{"refs/heads/main", tip, "refs/heads/main"},
		{"v1", first, "refs/tags/v1"},
		{first, first, ""},
	} {
		f, err := c.Fetch(t.Context(), belay.GitSource{URL: repo.URL, Ref: tc.ref}, gitsource.DefaultLimits())
		if err != nil {
			t.Errorf("Fetch(ref %q): %v", tc.ref, err)
			continue
		}
		if f.Commit != tc.want || f.Ref != tc.wantRef {
			t.Errorf("Fetch(ref %q) = commit %s ref %q, want %s %q", tc.ref, f.Commit, f.Ref, tc.want, tc.wantRef)
		}
		dir := bundleRepo(t, f)
		if got := strings.TrimSpace(gittest.Git(t, dir, "rev-parse", "base")); got != tc.want {
			t.Errorf("Fetch(ref %q): the bundle is at %s, want %s", tc.ref, got, tc.want)
		}
		f.Close()
	}
	_, err := c.Fetch(t.Context(), belay.GitSource{URL: repo.URL, Ref: "no-such-branch"}, gitsource.DefaultLimits())
	if !belay.IsCode(err, belay.CodeInvalid) || !strings.Contains(err.Error(), "no-such-branch") {
		t.Errorf("an unknown ref: %v, want invalid naming it", err)
	}
	_, err = c.Fetch(t.Context(), belay.GitSource{URL: repo.URL, Commit: strings.Repeat("ab", 20)}, gitsource.DefaultLimits())
	if !belay.IsCode(err, belay.CodeInvalid) {
		t.Errorf("an unknown commit: %v, want invalid", err)
	}
}

func TestFetchCredentials(t *testing.T) {
	srv := gittest.Start(t, "x-access-token", password)
	repo := srv.NewRepo(t, "octo-org/private", files1, true)
	cases := map[string]*gitsource.Credentials{
		"none":           nil,
		"wrong password": creds(t, strings.Replace(srv.URL, "http://", "http://x-access-token:wrong-"+password[:4]+"@", 1)),
		"other host":     creds(t, "https://x-access-token:"+password+"@github.com"),
	}
	for name, c := range cases {
		cl := gitsource.New(gitsource.Config{Credentials: c, TempDir: t.TempDir()})
		_, err := cl.Fetch(t.Context(), belay.GitSource{URL: repo.URL}, gitsource.DefaultLimits())
		if !belay.IsCode(err, belay.CodeInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
			continue
		}
		if strings.Contains(err.Error(), password) || strings.Contains(err.Error(), "wrong-") {
			t.Errorf("%s: the error quotes a credential: %v", name, err)
		}
		if !strings.Contains(err.Error(), repo.URL) {
			t.Errorf("%s: the error does not name the URL: %v", name, err)
		}
	}
}

func TestFetchLimits(t *testing.T) {
	srv := gittest.Start(t, "", "")
	repo := srv.NewRepo(t, "octo-org/big", files1, true)
	c := gitsource.New(gitsource.Config{TempDir: t.TempDir()})
	for name, lim := range map[string]gitsource.Limits{
		"files":        {MaxFiles: 2, MaxBytes: 1 << 20},
		"tree bytes":   {MaxFiles: 100, MaxBytes: 60},
		"bundle bytes": {MaxFiles: 100, MaxBytes: 150},
	} {
		_, err := c.Fetch(t.Context(), belay.GitSource{URL: repo.URL}, lim)
		if !belay.IsCode(err, belay.CodeTooLarge) {
			t.Errorf("%s: %v, want too_large", name, err)
		}
	}
	// The temporary folder holds nothing once a fetch failed.
	if f, err := c.Fetch(t.Context(), belay.GitSource{URL: repo.URL}, gitsource.Limits{MaxFiles: 3, MaxBytes: 1 << 20}); err != nil {
		t.Errorf("at the limits: %v", err)
	} else {
		f.Close()
	}
}

func TestFetchFileURL(t *testing.T) {
	srv := gittest.Start(t, "", "")
	repo := srv.NewRepo(t, "octo-org/mirror", files1, false)
	head := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))
	c := gitsource.New(gitsource.Config{TempDir: t.TempDir()})
	for _, dir := range []string{repo.Bare, repo.Dir} {
		f, err := c.Fetch(t.Context(), belay.GitSource{URL: "file://" + dir, Commit: head}, gitsource.DefaultLimits())
		if err != nil {
			t.Fatalf("Fetch(file://%s): %v", dir, err)
		}
		if f.Commit != head {
			t.Errorf("file mirror: commit %s, want %s", f.Commit, head)
		}
		bundleRepo(t, f)
		f.Close()
	}
}

// TestCommitPatchAndPush: the patch git made is applied on the base by
// the control plane, pushed as a new branch with its credentials, and the
// branch's diff from the base is exactly that patch.
func TestCommitPatchAndPush(t *testing.T) {
	srv := gittest.Start(t, "x-access-token", password)
	files := map[string]string{"calc.py": files1["calc.py"], "tests/test_calc.py": files1["tests/test_calc.py"], "old.txt": "remove me\n", "run.sh": "#!/bin/sh\necho hi\n"}
	repo := srv.NewRepo(t, "octo-org/publish", files, true)
	base := strings.TrimSpace(gittest.Git(t, repo.Dir, "rev-parse", "HEAD"))

	// The change, made by git in a scratch clone as the sandbox would.
	scratch := t.TempDir()
	gittest.Git(t, "", "clone", "-q", repo.Bare, scratch)
	must(t, os.WriteFile(filepath.Join(scratch, "calc.py"), []byte("def add(a, b):\n    return a + b\n"), 0o644))
	must(t, os.MkdirAll(filepath.Join(scratch, "src", "deep"), 0o755))
	must(t, os.WriteFile(filepath.Join(scratch, "src", "deep", "new.py"), []byte("X = 1\n"), 0o644))
	must(t, os.Remove(filepath.Join(scratch, "old.txt")))
	must(t, os.Chmod(filepath.Join(scratch, "run.sh"), 0o755))
	gittest.Git(t, scratch, "add", "-A")
	gittest.Git(t, scratch, "commit", "-q", "-m", "agent")
	diffArgs := []string{"diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames"}
	patch := gittest.Git(t, scratch, append(diffArgs, base, "HEAD", "--")...)

	c := client(t, srv)
	f, err := c.Fetch(t.Context(), belay.GitSource{URL: repo.URL, Commit: base}, gitsource.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rc, _ := f.OpenBundle()
	r, tip, err := gitsource.LoadBundle(rc)
	rc.Close()
	if err != nil || tip.String() != base {
		t.Fatalf("LoadBundle = %v, %v", tip, err)
	}
	head, err := gitsource.CommitPatch(r, plumbing.NewHash(base), []byte(patch), "belay: fix add\n", gitsource.DefaultSignature, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatalf("CommitPatch: %v", err)
	}
	branch := belay.BranchFor("run_abc")
	if err := c.Push(t.Context(), r, repo.URL, head, branch); err != nil {
		t.Fatalf("Push: %v", err)
	}
	got := gittest.Git(t, repo.Bare, append(diffArgs, base, "refs/heads/"+branch, "--")...)
	if got != patch {
		t.Errorf("the pushed branch's diff from the base differs from the patch:\n got %q\nwant %q", got, patch)
	}
	if parents := strings.Fields(gittest.Git(t, repo.Bare, "rev-parse", "refs/heads/"+branch+"^@")); !slices.Equal(parents, []string{base}) {
		t.Errorf("the commit's parents are %v, want the base only", parents)
	}
	gittest.Git(t, repo.Bare, "fsck", "--strict", "--no-dangling")
	// main did not move, and the branch is never pushed twice.
	if got := strings.TrimSpace(gittest.Git(t, repo.Bare, "rev-parse", "main")); got != base {
		t.Errorf("main moved to %s", got)
	}
	if err := c.Push(t.Context(), r, repo.URL, head, branch); err == nil {
		t.Errorf("a second push of the same branch went through")
	}
	// A patch that does not apply is refused.
	if _, err := gitsource.CommitPatch(r, plumbing.NewHash(base), []byte(strings.ReplaceAll(patch, "return a - b", "return a * b")), "x", gitsource.DefaultSignature, time.Now()); err == nil {
		t.Errorf("a patch that does not apply was committed")
	}
}

func TestCredentials(t *testing.T) {
	c := creds(t, "https://u1:p1@github.com", "https://u2:p2@github.com/octo-org", "https://u3:p3@github.com/octo-org/special.git", "http://u4:p4@127.0.0.1:8080")
	for url, want := range map[string]string{
		"https://github.com/other/repo.git":         "p1",
		"https://github.com/octo-org/repo.git":      "p2",
		"https://github.com/octo-org/special.git":   "p3",
		"https://github.com/octo-organisation/x":    "p1",
		"http://127.0.0.1:8080/o/r.git":             "p4",
		"http://github.com/octo-org/repo.git":       "",
		"https://gitlab.com/octo-org/repo.git":      "",
		"https://127.0.0.1:8080/octo-org/repo.git":  "",
		"https://GitHub.com/octo-org/repo.git":      "p2",
		"https://github.com/octo-org/special.git/x": "p3",
	} {
		_, got, ok := c.For(url)
		if got != want || ok != (want != "") {
			t.Errorf("For(%s) = %q, %v; want %q", url, got, ok, want)
		}
	}
	if s := c.String(); strings.Contains(s, "p1") && strings.Contains(s, "u1:p1") {
		t.Errorf("String shows a password: %s", s)
	}
	for _, bad := range []string{"github.com", "https://github.com", "https://u@github.com", "ftp://u:p@host"} {
		_, err := gitsource.ParseCredentials(strings.NewReader("\n" + bad))
		if err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), bad) {
			t.Errorf("ParseCredentials(%q) = %v; want an error naming line 2 only", bad, err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
