package sandbox

import (
	"bufio"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrRepositoryTampered is wrapped by the error Finalize or Reset returns
// when the repository is no longer one the entry can vouch for: its folder
// or .git was replaced, the base commit no longer reads as the upload, an
// object does not hash to its name, or the work tree could not be made
// exactly the head commit's tree. Only something the agent ran (an
// approved shell command, or the patch's code run by a check) can cause
// it; the entry then reports the run failed with ReasonRepositoryTampered
// and no patch.
var ErrRepositoryTampered = errors.New("the repository was tampered with")

func tampered(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRepositoryTampered, fmt.Sprintf(format, args...))
}

// Base is the entry's memory of the repository as it built it, taken before
// the agent ran: the base commit and tree, the identity of the repository's
// folder and of .git, and the bytes of .git/config and .git/HEAD. It lives
// only in the entry's memory, out of reach of anything the agent runs, and
// is what Finalize puts .git back from and checks the base against.
type Base struct {
	// Commit is the base commit's hash, Tree its tree's.
	Commit string
	Tree   string

	git          Git
	repo, gitDir os.FileInfo
	config, head []byte
}

// newBase records g's repository right after its base commit.
func newBase(ctx context.Context, g Git, commit string) (*Base, error) {
	b := &Base{Commit: commit, git: g}
	var err error
	if b.repo, err = os.Lstat(g.Dir); err != nil {
		return nil, err
	}
	if b.gitDir, err = os.Lstat(g.gitDir()); err != nil {
		return nil, err
	}
	if b.config, err = os.ReadFile(filepath.Join(g.gitDir(), "config")); err != nil {
		return nil, err
	}
	if b.head, err = os.ReadFile(filepath.Join(g.gitDir(), "HEAD")); err != nil {
		return nil, err
	}
	tree, err := g.Run(ctx, "rev-parse", "--verify", commit+"^{tree}")
	if err != nil {
		return nil, err
	}
	b.Tree = strings.TrimSpace(string(tree))
	return b, nil
}

// Final is the repository once the agent's turn is over.
type Final struct {
	// Head is the commit of the agent's allowed changes; its only parent
	// is the base.
	Head string
	// Patch is the binary-safe diff from the base to Head, and Changed the
	// paths it touches, sorted.
	Patch   []byte
	Changed []string
	// Discarded are the changed paths left out of Head (see
	// Git.CommitAllowed).
	Discarded []string
}

// Finalize turns what the agent left in the repository into the head
// commit and makes the work tree exactly that commit's tree, so the checks
// that run next run on the files the patch produces and nothing else. It
// is called once, after the agent loop, when nothing the agent started is
// still running.
//
// In order, it makes everything in the repository readable by its owner
// again (a shell can take permissions away); removes every .git below the
// top (a nested repository is never part of a patch, and one without a
// commit makes git refuse to stage the tree); puts .git back as it was built
// (config and HEAD from the recorded bytes, info/exclude and
// info/attributes as the entry writes them, no hooks, no refs but the
// branch, no alternates or commit graph, no index, nothing else at the top
// of .git; only the object store is kept); checks that the base commit
// still names the recorded tree; commits the allowed changes
// (Git.CommitAllowed); checks that every object reachable from the head
// commit, the base included, hashes to its name (git does not check this
// when it reads, and an object planted under a name the agent could
// predict would otherwise change what the patch says) and that the head's
// only parent is the base; takes the patch; checks the head commit out over
// the work tree and removes every file that is not in it, ignored files
// included, and anything that is not a regular file or a folder; compares
// every file with the head commit by content; and finally leaves HEAD and
// the index at the base, the head's new files marked intent-to-add, so a
// check such as `git diff --check` sees exactly the patch.
//
// An error wrapping ErrRepositoryTampered means the repository cannot be
// vouched for; any other error is the entry's own failure.
func (b *Base) Finalize(ctx context.Context, allowedPaths []string, message string) (Final, error) {
	fin, err := b.finalize(ctx, allowedPaths, message)
	if err != nil {
		return Final{}, fmt.Errorf("finalize: %w", err)
	}
	return fin, nil
}

func (b *Base) finalize(ctx context.Context, allowedPaths []string, message string) (Final, error) {
	g := b.git
	if err := b.restoreGit(ctx); err != nil {
		return Final{}, err
	}
	head, discarded, err := g.CommitAllowed(ctx, b.Commit, allowedPaths, message)
	if err != nil {
		return Final{}, fmt.Errorf("commit the agent's changes: %w", err)
	}
	if err := g.verifyObjects(ctx, head); err != nil {
		return Final{}, err
	}
	parents, err := g.Run(ctx, "rev-parse", head+"^@")
	if err != nil {
		return Final{}, err
	}
	if got := strings.Fields(string(parents)); !slices.Equal(got, []string{b.Commit}) {
		return Final{}, tampered("the head commit's parents are %q, not the base %s", got, b.Commit)
	}
	patch, err := g.Diff(ctx, b.Commit, head)
	if err != nil {
		return Final{}, err
	}
	changed, err := g.ChangedFiles(ctx, b.Commit, head)
	if err != nil {
		return Final{}, err
	}
	if err := b.settle(ctx, head); err != nil {
		return Final{}, err
	}
	return Final{Head: head, Patch: patch, Changed: changed, Discarded: discarded}, nil
}

// Reset puts the repository back as Finalize left it for head: .git
// restored, every object reachable from head checked against its hash, the
// work tree exactly head's tree, HEAD and the index at the base. The entry
// calls it before each final check after the first: a check runs code from
// the patch, and that code can change the tree, .git or the object store a
// later check would read. Errors are as Finalize's.
func (b *Base) Reset(ctx context.Context, head string) error {
	err := b.restoreGit(ctx)
	if err == nil {
		err = b.git.verifyObjects(ctx, head)
	}
	if err == nil {
		err = b.settle(ctx, head)
	}
	if err != nil {
		return fmt.Errorf("reset to the head commit: %w", err)
	}
	return nil
}

// restoreGit makes the repository readable by its owner, removes nested
// repositories, puts .git back (restore), checks that the base commit still
// names the base tree, and points HEAD at the base.
func (b *Base) restoreGit(ctx context.Context) error {
	g := b.git
	if err := makeOwnerAccessible(g.Dir); err != nil {
		return err
	}
	if err := removeNestedGit(g.Dir); err != nil {
		return err
	}
	if err := b.restore(); err != nil {
		return err
	}
	tree, err := g.Run(ctx, "rev-parse", "--verify", b.Commit+"^{tree}")
	if err != nil {
		return tampered("the base commit cannot be read: %v", err)
	}
	if got := strings.TrimSpace(string(tree)); got != b.Tree {
		return tampered("the base commit names tree %s, not the base tree %s", got, b.Tree)
	}
	if _, err := g.Run(ctx, "update-ref", "HEAD", b.Commit); err != nil {
		return err
	}
	return nil
}

// settle makes the work tree exactly head's tree and leaves the index at
// the base.
func (b *Base) settle(ctx context.Context, head string) error {
	if err := b.git.checkoutExactly(ctx, head); err != nil {
		return err
	}
	return b.git.indexAtBase(ctx, b.Commit, head)
}

// restore puts .git back as the entry built it. It fails with
// ErrRepositoryTampered when the repository's folder, .git or .git/objects
// is not the folder it was (replaced, or a symbolic link), since what it
// would write then could land anywhere.
func (b *Base) restore() error {
	g := b.git
	if fi, err := os.Lstat(g.Dir); err != nil || !os.SameFile(fi, b.repo) {
		return tampered("the repository folder was replaced")
	}
	gitDir := g.gitDir()
	if fi, err := os.Lstat(gitDir); err != nil || !os.SameFile(fi, b.gitDir) {
		return tampered(".git was replaced or removed")
	}
	objects := filepath.Join(gitDir, "objects")
	if fi, err := os.Lstat(objects); err != nil || !fi.IsDir() {
		return tampered(".git/objects is not a folder")
	}
	entries, err := os.ReadDir(gitDir)
	if err != nil {
		return fmt.Errorf("restore .git: %w", err)
	}
	for _, e := range entries {
		if e.Name() != "objects" {
			if err := removeAll(filepath.Join(gitDir, e.Name())); err != nil {
				return fmt.Errorf("restore .git: %w", err)
			}
		}
	}
	if err := removeAll(filepath.Join(objects, "info")); err != nil {
		return fmt.Errorf("restore .git: %w", err)
	}
	for _, d := range []string{"objects/info", "info", "refs/heads", "refs/tags"} {
		if err := os.MkdirAll(filepath.Join(gitDir, d), 0o755); err != nil {
			return fmt.Errorf("restore .git: %w", err)
		}
	}
	for name, data := range map[string][]byte{
		"config": b.config, "HEAD": b.head,
		"info/exclude": []byte(excludePatterns), "info/attributes": []byte(attributePatterns),
	} {
		if err := writeNewFile(filepath.Join(gitDir, name), data); err != nil {
			return fmt.Errorf("restore .git: %w", err)
		}
	}
	return nil
}

// verifyObjects reads every object reachable from tip and checks that each
// hashes to its name. A missing object or a wrong hash is tampering.
func (g Git) verifyObjects(ctx context.Context, tip string) error {
	list, err := g.Run(ctx, "rev-list", "--objects", "--no-object-names", tip)
	if err != nil {
		return tampered("the objects of the head commit cannot be listed: %v", err)
	}
	ids := strings.Fields(string(list))
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		err := checkObjects(bufio.NewReader(pr), ids)
		_, _ = io.Copy(io.Discard, pr) // let git finish writing
		checked <- err
	}()
	runErr := g.run(ctx, strings.NewReader(strings.Join(ids, "\n")+"\n"), pw, "cat-file", "--batch")
	pw.Close()
	checkErr := <-checked
	switch {
	case errors.Is(checkErr, ErrRepositoryTampered):
		return checkErr
	case runErr != nil:
		return fmt.Errorf("verify objects: %w", runErr)
	}
	return checkErr
}

// checkObjects reads `git cat-file --batch` output for ids, in order, and
// hashes each object as git names it.
func checkObjects(r *bufio.Reader, ids []string) error {
	for _, id := range ids {
		header, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("verify objects: read object %s: %w", id, err)
		}
		f := strings.Fields(header)
		if len(f) == 2 && f[0] == id && f[1] == "missing" {
			return tampered("object %s is missing", id)
		}
		size, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		if len(f) != 3 || f[0] != id || err != nil || size < 0 {
			return fmt.Errorf("verify objects: unexpected header %q for %s", truncate(header, 100), id)
		}
		var h hash.Hash
		switch len(id) {
		case 2 * sha1.Size:
			h = sha1.New()
		case 2 * sha256.Size:
			h = sha256.New()
		default:
			return fmt.Errorf("verify objects: %q is not an object name", truncate(id, 100))
		}
		fmt.Fprintf(h, "%s %d\x00", f[1], size)
		if _, err := io.CopyN(h, r, size); err != nil {
			return fmt.Errorf("verify objects: read object %s: %w", id, err)
		}
		if nl, err := r.ReadByte(); err != nil || nl != '\n' {
			return fmt.Errorf("verify objects: object %s is not followed by a newline", id)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != id {
			return tampered("object %s holds content that hashes to %s", id, got)
		}
	}
	return nil
}

// checkoutExactly makes the work tree exactly head's tree: head's files
// written over whatever is there, every other file removed (ignored ones,
// nested repositories and anything that is not a regular file or a folder
// included), then every file compared with head by content.
func (g Git) checkoutExactly(ctx context.Context, head string) error {
	if _, err := g.Run(ctx, "read-tree", "-u", "--reset", head); err != nil {
		return tampered("the head commit cannot be checked out: %v", err)
	}
	if _, err := g.Run(ctx, "clean", "-ffdxq"); err != nil {
		return tampered("files outside the head commit cannot be removed: %v", err)
	}
	if err := removeOddFiles(g.Dir); err != nil {
		return err
	}
	// An index without file times makes git compare every file's content.
	if err := os.Remove(filepath.Join(g.gitDir(), "index")); err != nil {
		return fmt.Errorf("remove the index: %w", err)
	}
	if _, err := g.Run(ctx, "read-tree", head); err != nil {
		return err
	}
	// Exits non-zero when some file differs; diff-files says which.
	_, _ = g.Run(ctx, "update-index", "-q", "--refresh")
	if out, err := g.Run(ctx, "diff-files", "--name-only", "-z"); err != nil {
		return err
	} else if len(out) > 0 {
		return tampered("after checking out the head commit, %q still differs from it", truncate(firstPath(out), 200))
	}
	if out, err := g.Run(ctx, "ls-files", "--others", "-z"); err != nil {
		return err
	} else if len(out) > 0 {
		return tampered("after checking out the head commit, %q is still there", truncate(firstPath(out), 200))
	}
	return nil
}

// indexAtBase leaves the index at base with head's new files added as
// intent-to-add: to git, the head's changes are then uncommitted changes
// on the base, as the agent saw them while it worked.
func (g Git) indexAtBase(ctx context.Context, base, head string) error {
	if err := os.Remove(filepath.Join(g.gitDir(), "index")); err != nil {
		return fmt.Errorf("remove the index: %w", err)
	}
	if _, err := g.Run(ctx, "read-tree", base); err != nil {
		return err
	}
	out, err := g.Run(ctx, "diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", base, head, "--")
	if err != nil {
		return err
	}
	added := slices.DeleteFunc(strings.Split(string(out), "\x00"), func(p string) bool { return p == "" })
	for chunk := range slices.Chunk(added, 100) {
		if _, err := g.Run(ctx, append([]string{"add", "-N", "-f", "--"}, literalPathspecs(chunk)...)...); err != nil {
			return err
		}
	}
	return nil
}

func firstPath(z []byte) string {
	p, _, _ := strings.Cut(string(z), "\x00")
	return p
}

// removeOddFiles removes everything under dir, outside its .git, that is
// neither a regular file nor a folder: a head commit holds only regular
// files, and git leaves a FIFO or a socket it does not know in place.
func removeOddFiles(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return fmt.Errorf("walk the work tree: %w", err)
		case p == filepath.Join(dir, ".git"):
			return skipDir(d)
		case d.IsDir() || d.Type().IsRegular():
			return nil
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove %s from the work tree: %w", filepath.Base(p), err)
		}
		return nil
	})
}

// removeNestedGit removes every file or folder named .git under dir but
// dir's own.
func removeNestedGit(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return fmt.Errorf("walk the work tree: %w", err)
		case p == filepath.Join(dir, ".git"):
			return skipDir(d)
		case d.Name() != ".git":
			return nil
		}
		if err := removeAll(p); err != nil {
			return fmt.Errorf("remove a nested .git: %w", err)
		}
		return skipDir(d)
	})
}

// skipDir is what a WalkDir function returns to pass over d: SkipDir for a
// folder, nil for anything else (for which SkipDir would skip the rest of
// its folder).
func skipDir(d fs.DirEntry) error {
	if d.IsDir() {
		return filepath.SkipDir
	}
	return nil
}

// makeOwnerAccessible gives the owner read, write and search permission on
// every folder under dir and read permission on every file, without
// following symbolic links. The entry and the commands the agent ran are
// one user, so a command can take permissions away that the entry needs to
// read, replace or remove what it left.
func makeOwnerAccessible(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("walk %s: %w", dir, err)
		}
		var need fs.FileMode
		switch {
		case d.IsDir():
			need = 0o700
		case d.Type().IsRegular():
			need = 0o400
		default:
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("walk %s: %w", dir, err)
		}
		if fi.Mode().Perm()&need != need {
			if err := os.Chmod(p, fi.Mode().Perm()|need); err != nil {
				return fmt.Errorf("walk %s: %w", dir, err)
			}
		}
		return nil
	})
}

// removeAll removes path and everything under it, first giving the owner
// back any permission a command took away when a plain removal fails.
func removeAll(path string) error {
	if err := os.RemoveAll(path); err == nil {
		return nil
	}
	if err := makeOwnerAccessible(path); err != nil {
		return err
	}
	return os.RemoveAll(path)
}

// writeNewFile creates path, which must not exist, with data; it never
// follows a symbolic link.
func writeNewFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
