// Package gitsource fetches a run's source from a git repository, for the
// control plane (never the sandbox), with go-git: pure Go, so it works the
// same in belay serve and in a Lambda function, which has no git binary.
//
// Client.Fetch fetches exactly one commit (the one an event names, or what
// a ref points at) with its history, with the control plane's credentials,
// under the operator's repository limits, and writes it as a git bundle:
// the input the sandbox downloads and builds its repository from, the
// commit as its base. Client.Push writes a commit back (the safe outputs).
// The sessions' git sources use the same Fetch.
package gitsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/revlist"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"

	"github.com/belay-dev/belay/internal/belay"
)

// Limits bound what one fetch may bring: the files of the commit's tree
// and their bytes, and the bytes downloaded and bundled.
type Limits struct {
	MaxFiles int
	MaxBytes int64
}

// DefaultLimits are the reference repository limits.
func DefaultLimits() Limits {
	return Limits{MaxFiles: belay.DefaultRepoMaxFiles, MaxBytes: belay.DefaultRepoMaxBytes}
}

// LimitsOf returns the repository limits of the operator's run limits.
func LimitsOf(l belay.Limits) Limits {
	lim := Limits{MaxFiles: l.RepoMaxFiles, MaxBytes: belay.RepoMaxBytes(l)}
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = belay.DefaultRepoMaxFiles
	}
	return lim
}

// Client fetches and pushes with the control plane's credentials.
type Client struct {
	creds *Credentials
	tmp   string
	log   *slog.Logger
}

// Config configures a Client.
type Config struct {
	// Credentials are used for URLs they match; nil fetches anonymously.
	Credentials *Credentials
	// TempDir holds each fetch's repository and bundle until Close; empty
	// means os.TempDir().
	TempDir string
	// Logger gets a line per fetch and push; nil discards.
	Logger *slog.Logger
}

// New returns a Client.
func New(cfg Config) *Client {
	install()
	c := &Client{creds: cfg.Credentials, tmp: cfg.TempDir, log: cfg.Logger}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c
}

// auth is the credential for url, or nil.
func (c *Client) auth(url string) transport.AuthMethod {
	user, pass, ok := c.creds.For(url)
	if !ok {
		return nil
	}
	return &githttp.BasicAuth{Username: user, Password: pass}
}

// bundleRef is the one ref a source bundle holds, pointing at its commit.
const bundleRef = "refs/belay/base"

// Fetched is a fetched commit: its tree's paths and size, and its bundle
// on disk until Close.
type Fetched struct {
	URL    string
	Ref    string
	Commit string
	// Paths are the tree's files (regular files and symbolic links; not
	// submodules), in git's order.
	Paths  []string
	Tree   belay.SourceTree
	Bundle belay.SourceBundle

	dir        string
	bundlePath string
}

// OpenBundle opens the bundle: a git bundle (v2) with one ref,
// refs/belay/base, at Commit, and every object reachable from it.
func (f *Fetched) OpenBundle() (io.ReadCloser, error) { return os.Open(f.bundlePath) }

// Close removes the fetched repository and the bundle.
func (f *Fetched) Close() error { return os.RemoveAll(f.dir) }

// FetchSource is Fetch under lim's repository limits, as the run-creation
// path asks for it (belay.SourceFetcher).
func (c *Client) FetchSource(ctx context.Context, src belay.GitSource, lim belay.Limits) (*belay.FetchedSource, error) {
	f, err := c.Fetch(ctx, src, LimitsOf(lim))
	if err != nil {
		return nil, err
	}
	return &belay.FetchedSource{Ref: f.Ref, Commit: f.Commit, Paths: f.Paths, Tree: f.Tree, Bundle: f.Bundle, Data: f}, nil
}

// Fetch fetches src with the credentials that match its URL. src.URL must
// already have passed belay.CheckGitURL. With src.Commit set, exactly that
// commit is fetched (by id where the server allows it, as GitHub does;
// otherwise src.Ref, or every branch and tag, and the commit must be among
// them). Without it, src.Ref is resolved (a full ref, a branch, a tag, or a
// full commit id; empty for the remote's HEAD) and what it points at is
// fetched. The whole history of the commit comes along.
//
// Errors: invalid for a repository that is not there, refuses the
// credentials, is empty, or lacks the ref or commit; too_large past lim
// (files, bytes of the tree, bytes downloaded or bundled); unavailable when
// the host cannot be reached. Messages name the URL and ref, never a
// credential.
func (c *Client) Fetch(ctx context.Context, src belay.GitSource, lim Limits) (*Fetched, error) {
	if lim.MaxFiles <= 0 || lim.MaxBytes <= 0 {
		lim = DefaultLimits()
	}
	dir, err := os.MkdirTemp(c.tmp, "belay-fetch-")
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", src.URL, err)
	}
	f := &Fetched{URL: src.URL, Ref: src.Ref, dir: dir, bundlePath: filepath.Join(dir, "source.bundle")}
	if err := c.fetch(ctx, f, src, lim); err != nil {
		f.Close()
		return nil, err
	}
	c.log.Info("git source fetched", "url", src.URL, "ref", f.Ref, "commit", f.Commit,
		"files", f.Tree.Files, "bytes", f.Tree.Bytes, "bundle_bytes", f.Bundle.Size)
	return f, nil
}

func (c *Client) fetch(ctx context.Context, f *Fetched, src belay.GitSource, lim Limits) error {
	repo, err := git.PlainInit(filepath.Join(f.dir, "repo.git"), true)
	if err != nil {
		return fmt.Errorf("fetch %s: init: %w", src.URL, err)
	}
	remote, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{src.URL}})
	if err != nil {
		return fmt.Errorf("fetch %s: %w", src.URL, err)
	}
	// The pack may be somewhat larger than the bundle made from it; the
	// bundle is held to MaxBytes exactly below.
	ctx, _ = withTransferCap(ctx, lim.MaxBytes+lim.MaxBytes/8+(1<<20))
	auth := c.auth(src.URL)
	refs, err := remote.ListContext(ctx, &git.ListOptions{Auth: auth})
	if err != nil {
		return fetchError(src.URL, "", err, lim)
	}

	want := src.Commit
	ref := ""
	switch {
	case want == "" && belay.IsObjectName(src.Ref):
		want = src.Ref
	case src.Ref != "" || want == "":
		if ref, err = resolveRef(refs, src.Ref); err != nil {
			if want == "" {
				return belay.FieldErrorf(belay.CodeInvalid, "source.git.ref", "%v at %s", err, src.URL)
			}
			ref = "" // the commit alone decides
		}
	}
	f.Ref = ref

	exact := false // the fetch brought only what want (or ref) needs
	if want != "" {
		spec := config.RefSpec("+" + want + ":" + bundleRef)
		err = remote.FetchContext(ctx, &git.FetchOptions{RefSpecs: []config.RefSpec{spec}, Auth: auth, Tags: git.NoTags})
		exact = err == nil || errors.Is(err, git.NoErrAlreadyUpToDate)
		if !exact && !isLimitErr(err) && !isAuthErr(err) {
			// The server does not hand out commits by id: fetch the ref,
			// or every branch and tag, and look for the commit there.
			c.log.Info("the server does not give commits by id; fetching refs", "url", src.URL, "err", err.Error())
			specs := []config.RefSpec{"+refs/heads/*:refs/belay/heads/*", "+refs/tags/*:refs/belay/tags/*"}
			if ref != "" {
				specs = []config.RefSpec{config.RefSpec("+" + ref + ":refs/belay/ref")}
			}
			err = remote.FetchContext(ctx, &git.FetchOptions{RefSpecs: specs, Auth: auth, Tags: git.NoTags})
		}
		if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
			return fetchError(src.URL, ref, err, lim)
		}
		if _, err := repo.CommitObject(plumbing.NewHash(want)); err != nil {
			where := "any branch or tag"
			if ref != "" {
				where = ref
			}
			return belay.FieldErrorf(belay.CodeInvalid, "source.git.commit", "commit %s is not in %s (looked on %s)", want, src.URL, where)
		}
		f.Commit = want
	} else {
		spec := config.RefSpec("+" + ref + ":" + bundleRef)
		err = remote.FetchContext(ctx, &git.FetchOptions{RefSpecs: []config.RefSpec{spec}, Auth: auth, Tags: git.NoTags})
		if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
			return fetchError(src.URL, ref, err, lim)
		}
		got, err := repo.Reference(bundleRef, true)
		if err != nil {
			return fmt.Errorf("fetch %s: %w", src.URL, err)
		}
		commit, err := peelToCommit(repo, got.Hash())
		if err != nil {
			return belay.FieldErrorf(belay.CodeInvalid, "source.git.ref", "%s at %s does not point at a commit", ref, src.URL)
		}
		f.Commit = commit.String()
		exact = commit == got.Hash()
	}

	commit, err := repo.CommitObject(plumbing.NewHash(f.Commit))
	if err != nil {
		return fmt.Errorf("fetch %s: read commit %s: %w", src.URL, f.Commit, err)
	}
	if err := walkTree(commit, f, lim); err != nil {
		return err
	}
	return writeBundle(repo, f, exact, lim)
}

// resolveRef finds ref among the advertised refs: "" is HEAD's target, a
// name starting with refs/ must be there as it is, any other is tried as
// refs/heads/<name>, then refs/tags/<name>.
func resolveRef(refs []*plumbing.Reference, ref string) (string, error) {
	byName := make(map[plumbing.ReferenceName]*plumbing.Reference, len(refs))
	for _, r := range refs {
		byName[r.Name()] = r
	}
	if ref == "" {
		head, ok := byName[plumbing.HEAD]
		if !ok {
			return "", errors.New("the default branch cannot be found (the repository advertises no HEAD)")
		}
		if head.Type() == plumbing.SymbolicReference {
			return string(head.Target()), nil
		}
		// No symref: the branch HEAD points at.
		for _, r := range refs {
			if r.Name().IsBranch() && r.Hash() == head.Hash() {
				return string(r.Name()), nil
			}
		}
		return "", errors.New("the default branch cannot be found")
	}
	candidates := []string{ref}
	if !strings.HasPrefix(ref, "refs/") {
		candidates = []string{"refs/heads/" + ref, "refs/tags/" + ref}
	}
	for _, name := range candidates {
		if _, ok := byName[plumbing.ReferenceName(name)]; ok {
			return name, nil
		}
	}
	return "", fmt.Errorf("ref %q is not a branch or tag", ref)
}

// peelToCommit follows annotated tags to the commit they name.
func peelToCommit(repo *git.Repository, h plumbing.Hash) (plumbing.Hash, error) {
	for range 10 {
		if tag, err := repo.TagObject(h); err == nil {
			h = tag.Target
			continue
		}
		if _, err := repo.CommitObject(h); err != nil {
			return plumbing.ZeroHash, err
		}
		return h, nil
	}
	return plumbing.ZeroHash, errors.New("tag chain too long")
}

// walkTree lists the commit's files and holds them to the limits.
func walkTree(commit *object.Commit, f *Fetched, lim Limits) error {
	tree, err := commit.Tree()
	if err != nil {
		return fmt.Errorf("fetch %s: read the tree of %s: %w", f.URL, f.Commit, err)
	}
	errStop := errors.New("stop")
	err = tree.Files().ForEach(func(file *object.File) error {
		f.Tree.Files++
		f.Tree.Bytes += file.Size
		if f.Tree.Files > lim.MaxFiles || f.Tree.Bytes > lim.MaxBytes {
			return errStop
		}
		f.Paths = append(f.Paths, file.Name)
		return nil
	})
	switch {
	case errors.Is(err, errStop) && f.Tree.Files > lim.MaxFiles:
		return belay.FieldErrorf(belay.CodeTooLarge, "source.git", "commit %s of %s has more than %d files; the repository limit is %d files",
			f.Commit, f.URL, lim.MaxFiles, lim.MaxFiles)
	case errors.Is(err, errStop):
		return belay.FieldErrorf(belay.CodeTooLarge, "source.git", "the files of commit %s of %s hold more than %d bytes; the repository limit is %d bytes",
			f.Commit, f.URL, lim.MaxBytes, lim.MaxBytes)
	case err != nil:
		return fmt.Errorf("fetch %s: walk the tree of %s: %w", f.URL, f.Commit, err)
	}
	return nil
}

// writeBundle writes the git bundle (v2) of the commit: the fetched pack as
// it came when the fetch brought exactly the commit's history, otherwise a
// pack of the objects reachable from the commit.
func writeBundle(repo *git.Repository, f *Fetched, exact bool, lim Limits) error {
	out, err := os.OpenFile(f.bundlePath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	defer out.Close()
	h := sha256.New()
	w := &limitedWriter{w: io.MultiWriter(out, h), max: lim.MaxBytes}
	if _, err := fmt.Fprintf(w, "# v2 git bundle\n%s %s\n\n", f.Commit, bundleRef); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	packs, _ := filepath.Glob(filepath.Join(f.dir, "repo.git", "objects", "pack", "*.pack"))
	if exact && len(packs) == 1 {
		err = copyFile(w, packs[0])
	} else {
		err = encodePack(w, repo, plumbing.NewHash(f.Commit))
	}
	if errors.Is(err, errBundleTooLarge) {
		return belay.FieldErrorf(belay.CodeTooLarge, "source.git", "the history of commit %s of %s takes more than %d bytes; the repository limit is %d bytes",
			f.Commit, f.URL, lim.MaxBytes, lim.MaxBytes)
	}
	if err != nil {
		return fmt.Errorf("write bundle of %s: %w", f.URL, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	f.Bundle = belay.SourceBundle{Size: w.n, SHA256: hex.EncodeToString(h.Sum(nil))}
	return nil
}

func copyFile(w io.Writer, path string) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	_, err = io.Copy(w, in)
	return err
}

// encodePack writes a pack of every object reachable from commit.
func encodePack(w io.Writer, repo *git.Repository, commit plumbing.Hash) error {
	hashes, err := revlist.Objects(repo.Storer, []plumbing.Hash{commit}, nil)
	if err != nil {
		return fmt.Errorf("list objects: %w", err)
	}
	_, err = packfile.NewEncoder(w, repo.Storer, false).Encode(hashes, 10)
	return err
}

var errBundleTooLarge = errors.New("bundle too large")

type limitedWriter struct {
	w   io.Writer
	n   int64
	max int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n+int64(len(p)) > l.max {
		return 0, errBundleTooLarge
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	return n, err
}

func isLimitErr(err error) bool { return errors.Is(err, errTransferCap) }

func isAuthErr(err error) bool {
	return errors.Is(err, transport.ErrAuthenticationRequired) || errors.Is(err, transport.ErrAuthorizationFailed) ||
		errors.Is(err, transport.ErrRepositoryNotFound)
}

// fetchError turns what go-git said into an error a caller can act on.
func fetchError(url, ref string, err error, lim Limits) error {
	switch {
	case errors.Is(err, errTransferCap):
		return belay.FieldErrorf(belay.CodeTooLarge, "source.git", "%s sent more than %d bytes; the repository limit is %d bytes", url, lim.MaxBytes, lim.MaxBytes)
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return belay.FieldErrorf(belay.CodeInvalid, "source.git.url", "no repository at %s that the control plane's git credentials can read", url)
	case errors.Is(err, transport.ErrAuthenticationRequired):
		return belay.FieldErrorf(belay.CodeInvalid, "source.git.url", "%s needs credentials, and the control plane has none for it (BELAY_GIT_CREDENTIALS)", url)
	case errors.Is(err, transport.ErrAuthorizationFailed):
		return belay.FieldErrorf(belay.CodeInvalid, "source.git.url", "%s refused the control plane's git credentials", url)
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return belay.FieldErrorf(belay.CodeInvalid, "source.git.url", "the repository at %s is empty", url)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return belay.Errorf(belay.CodeUnavailable, "fetching %s took too long; try again", url)
	}
	what := url
	if ref != "" {
		what += " " + ref
	}
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return belay.Errorf(belay.CodeUnavailable, "could not fetch %s: %s", what, msg)
}
