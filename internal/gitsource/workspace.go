package gitsource

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/belay-dev/belay/internal/belay"
)

// This file builds a session's workspace in memory: the uploaded tree (or
// the fetched commit) as a base commit, each completed turn's validated
// patch as one commit on top (CommitPatch), and from the head what the next
// turn starts from (its files, or a bundle whose commit is the sandbox's
// base) and the session's whole change (DiffCommits).

// RepoFromFiles returns an in-memory repository with one commit holding
// files (regular files, mode 0644), as the sandbox commits an uploaded tree.
func RepoFromFiles(files []belay.File, sig Signature, when time.Time) (*git.Repository, plumbing.Hash, error) {
	repo, err := git.Init(memory.NewStorage(), nil)
	if err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("files repository: %w", err)
	}
	entries := make(map[string]object.TreeEntry, len(files))
	for _, f := range files {
		if err := belay.CheckPath(f.Path); err != nil {
			return nil, plumbing.ZeroHash, fmt.Errorf("files repository: %w", err)
		}
		h, err := storeBlob(repo, []byte(f.Content))
		if err != nil {
			return nil, plumbing.ZeroHash, fmt.Errorf("files repository: %s: %w", f.Path, err)
		}
		entries[f.Path] = object.TreeEntry{Name: f.Path, Mode: filemode.Regular, Hash: h}
	}
	tree, err := writeTrees(repo, entries)
	if err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("files repository: %w", err)
	}
	s := object.Signature{Name: sig.Name, Email: sig.Email, When: when}
	c := &object.Commit{Author: s, Committer: s, Message: "belay: session base\n", TreeHash: tree}
	obj := repo.Storer.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("files repository: encode commit: %w", err)
	}
	h, err := repo.Storer.SetEncodedObject(obj)
	if err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("files repository: store commit: %w", err)
	}
	return repo, h, nil
}

func storeBlob(repo *git.Repository, content []byte) (plumbing.Hash, error) {
	obj := repo.Storer.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(content); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	return repo.Storer.SetEncodedObject(obj)
}

// FilesAt returns the regular files of commit's tree, in git's order.
func FilesAt(repo *git.Repository, commit plumbing.Hash) ([]belay.File, error) {
	c, err := repo.CommitObject(commit)
	if err != nil {
		return nil, fmt.Errorf("files at %s: %w", commit, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("files at %s: %w", commit, err)
	}
	var files []belay.File
	err = tree.Files().ForEach(func(f *object.File) error {
		if f.Mode != filemode.Regular && f.Mode != filemode.Executable {
			return nil
		}
		content, err := f.Contents()
		if err != nil {
			return err
		}
		files = append(files, belay.File{Path: f.Name, Content: content})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("files at %s: %w", commit, err)
	}
	return files, nil
}

// CommitPaths returns the paths of commit's files (regular files and
// symbolic links), in git's order.
func CommitPaths(repo *git.Repository, commit plumbing.Hash) ([]string, belay.SourceTree, error) {
	c, err := repo.CommitObject(commit)
	if err != nil {
		return nil, belay.SourceTree{}, fmt.Errorf("paths at %s: %w", commit, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, belay.SourceTree{}, fmt.Errorf("paths at %s: %w", commit, err)
	}
	var paths []string
	var st belay.SourceTree
	err = tree.Files().ForEach(func(f *object.File) error {
		paths = append(paths, f.Name)
		st.Files++
		st.Bytes += f.Size
		return nil
	})
	return paths, st, err
}

// WriteBundle writes the git bundle (v2) of commit and its whole history,
// as Fetch writes a source bundle (one ref, refs/belay/base), to w, and
// returns its size and SHA-256. Returns too_large, having written part of
// it, past maxBytes.
func WriteBundle(w io.Writer, repo *git.Repository, commit plumbing.Hash, maxBytes int64) (belay.SourceBundle, error) {
	h := sha256.New()
	lw := &limitedWriter{w: io.MultiWriter(w, h), max: maxBytes}
	if _, err := fmt.Fprintf(lw, "# v2 git bundle\n%s %s\n\n", commit, bundleRef); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("write bundle: %w", err)
	}
	err := encodePack(lw, repo, commit)
	if errors.Is(err, errBundleTooLarge) {
		return belay.SourceBundle{}, belay.FieldErrorf(belay.CodeTooLarge, "source.git",
			"the session's workspace takes more than %d bytes as a bundle; the repository limit is %d bytes", maxBytes, maxBytes)
	}
	if err != nil {
		return belay.SourceBundle{}, fmt.Errorf("write bundle: %w", err)
	}
	return belay.SourceBundle{Size: lw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// DiffCommits returns the git diff from one commit's tree to another's, in
// the unified format git apply takes (empty when the trees are equal).
func DiffCommits(repo *git.Repository, from, to plumbing.Hash) ([]byte, error) {
	a, err := repo.CommitObject(from)
	if err != nil {
		return nil, fmt.Errorf("diff: %s: %w", from, err)
	}
	b, err := repo.CommitObject(to)
	if err != nil {
		return nil, fmt.Errorf("diff: %s: %w", to, err)
	}
	if a.TreeHash == b.TreeHash {
		return nil, nil
	}
	p, err := a.Patch(b)
	if err != nil {
		return nil, fmt.Errorf("diff %s..%s: %w", from, to, err)
	}
	var buf bytes.Buffer
	if err := p.Encode(&buf); err != nil {
		return nil, fmt.Errorf("diff %s..%s: %w", from, to, err)
	}
	return buf.Bytes(), nil
}

// Workspaces builds sessions' workspaces in memory with go-git: it
// implements belay.Workspaces, so the session service (and the handler
// that carries it) links no git code of its own.
type Workspaces struct{ Signature Signature }

// Workspace is one session's workspace: a base commit and the head after
// the patches applied on it.
type Workspace struct {
	repo       *git.Repository
	base, head plumbing.Hash
	sig        Signature
}

// FromFiles starts a workspace whose base holds files.
func (w Workspaces) FromFiles(files []belay.File, when time.Time) (belay.Workspace, error) {
	repo, base, err := RepoFromFiles(files, w.signature(), when)
	if err != nil {
		return nil, err
	}
	return &Workspace{repo: repo, base: base, head: base, sig: w.signature()}, nil
}

// FromBundle starts a workspace whose base is the commit of a source
// bundle (as Fetch writes it).
func (w Workspaces) FromBundle(r io.Reader) (belay.Workspace, error) {
	repo, base, err := LoadBundle(r)
	if err != nil {
		return nil, err
	}
	return &Workspace{repo: repo, base: base, head: base, sig: w.signature()}, nil
}

func (w Workspaces) signature() Signature {
	if w.Signature.Name == "" {
		return DefaultSignature
	}
	return w.Signature
}

// Apply commits patch (a validated git diff from the head) on the head.
func (w *Workspace) Apply(patch []byte, message string, when time.Time) error {
	head, err := CommitPatch(w.repo, w.head, patch, message, w.sig, when)
	if err != nil {
		return err
	}
	w.head = head
	return nil
}

// Changed reports whether a patch moved the head from the base.
func (w *Workspace) Changed() bool { return w.head != w.base }

// Files returns the head's files.
func (w *Workspace) Files() ([]belay.File, error) { return FilesAt(w.repo, w.head) }

// Bundle returns the bundle of the head with its history (at most
// maxBytes), and the head's commit, tree and paths: a git source a run can
// start from without a fetch.
func (w *Workspace) Bundle(maxBytes int64) (data []byte, commit string, tree belay.SourceTree, bundle belay.SourceBundle, paths []string, err error) {
	if paths, tree, err = CommitPaths(w.repo, w.head); err != nil {
		return nil, "", tree, bundle, nil, err
	}
	var buf bytes.Buffer
	if bundle, err = WriteBundle(&buf, w.repo, w.head, maxBytes); err != nil {
		return nil, "", tree, bundle, nil, err
	}
	return buf.Bytes(), w.head.String(), tree, bundle, paths, nil
}

// Diff returns the diff from the base to the head (empty when equal).
func (w *Workspace) Diff() ([]byte, error) { return DiffCommits(w.repo, w.base, w.head) }

var _ belay.Workspaces = Workspaces{}
