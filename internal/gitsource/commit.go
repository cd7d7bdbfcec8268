package gitsource

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/belay-dev/belay/internal/belay"
)

// Signature is the author and committer of the commits belay writes.
type Signature struct {
	Name  string
	Email string
}

// DefaultSignature signs belay's commits when the operator names no other.
var DefaultSignature = Signature{Name: "belay", Email: "belay@belay.invalid"}

// CommitPatch applies patch (a git diff from base, as the sandbox made it
// and the control plane validated it) to base's tree and stores the result
// as one commit whose only parent is base. It builds the trees itself from
// base's entries and the patch's files, with no work tree. Every path the
// patch touches is checked again (belay.CheckPath); a patch that does not
// apply cleanly is refused.
func CommitPatch(repo *git.Repository, base plumbing.Hash, patch []byte, message string, sig Signature, when time.Time) (plumbing.Hash, error) {
	baseCommit, err := repo.CommitObject(base)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: base %s: %w", base, err)
	}
	baseTree, err := baseCommit.Tree()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: base tree: %w", err)
	}
	entries := map[string]object.TreeEntry{}
	err = baseTree.Files().ForEach(func(f *object.File) error {
		entries[f.Name] = object.TreeEntry{Name: f.Name, Mode: f.Mode, Hash: f.Hash}
		return nil
	})
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: list base tree: %w", err)
	}
	// Submodules are not files but stay in the tree as they were.
	walker := object.NewTreeWalker(baseTree, true, nil)
	for {
		name, e, err := walker.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			walker.Close()
			return plumbing.ZeroHash, fmt.Errorf("commit patch: walk base tree: %w", err)
		}
		if e.Mode == filemode.Submodule {
			entries[name] = object.TreeEntry{Name: name, Mode: e.Mode, Hash: e.Hash}
		}
	}
	walker.Close()

	files, _, err := gitdiff.Parse(bytes.NewReader(patch))
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: parse: %w", err)
	}
	for _, f := range files {
		if err := applyFile(repo, entries, f); err != nil {
			return plumbing.ZeroHash, fmt.Errorf("commit patch: %w", err)
		}
	}
	tree, err := writeTrees(repo, entries)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: %w", err)
	}
	s := object.Signature{Name: sig.Name, Email: sig.Email, When: when}
	c := &object.Commit{Author: s, Committer: s, Message: message, TreeHash: tree, ParentHashes: []plumbing.Hash{base}}
	obj := repo.Storer.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: encode commit: %w", err)
	}
	h, err := repo.Storer.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("commit patch: store commit: %w", err)
	}
	return h, nil
}

// applyFile applies one file of the patch to entries.
func applyFile(repo *git.Repository, entries map[string]object.TreeEntry, f *gitdiff.File) error {
	if f.IsCopy || (f.IsRename && f.OldName != f.NewName) {
		return fmt.Errorf("%s: copies and renames are not expected in a validated patch", f.NewName)
	}
	name := f.NewName
	if f.IsDelete {
		name = f.OldName
	}
	if err := belay.CheckPath(name); err != nil {
		return err
	}
	old, exists := entries[name]
	switch {
	case f.IsNew && exists:
		return fmt.Errorf("%s: the patch adds it, but the base has it", name)
	case !f.IsNew && !exists:
		return fmt.Errorf("%s: the patch changes it, but the base does not have it", name)
	case exists && old.Mode != filemode.Regular && old.Mode != filemode.Executable:
		return fmt.Errorf("%s: the patch changes a file that is not a regular file", name)
	}
	if f.IsDelete {
		delete(entries, name)
		return nil
	}
	var src []byte
	if exists {
		blob, err := repo.BlobObject(old.Hash)
		if err != nil {
			return fmt.Errorf("%s: read base content: %w", name, err)
		}
		r, err := blob.Reader()
		if err != nil {
			return fmt.Errorf("%s: read base content: %w", name, err)
		}
		src, err = io.ReadAll(r)
		r.Close()
		if err != nil {
			return fmt.Errorf("%s: read base content: %w", name, err)
		}
	}
	var out bytes.Buffer
	if err := gitdiff.Apply(&out, bytes.NewReader(src), f); err != nil {
		return fmt.Errorf("%s: the patch does not apply: %w", name, err)
	}
	mode := old.Mode
	if f.NewMode != 0 || !exists {
		switch f.NewMode {
		case 0o100755:
			mode = filemode.Executable
		case 0o100644, 0:
			mode = filemode.Regular
		default:
			return fmt.Errorf("%s: mode %o is not a regular file's", name, uint32(f.NewMode))
		}
	}
	obj := repo.Storer.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	w, err := obj.Writer()
	if err != nil {
		return err
	}
	if _, err := w.Write(out.Bytes()); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	h, err := repo.Storer.SetEncodedObject(obj)
	if err != nil {
		return fmt.Errorf("%s: store content: %w", name, err)
	}
	entries[name] = object.TreeEntry{Name: name, Mode: mode, Hash: h}
	return nil
}

// writeTrees stores the tree objects of entries (full path → entry) and
// returns the root tree's hash.
func writeTrees(repo *git.Repository, entries map[string]object.TreeEntry) (plumbing.Hash, error) {
	type dir struct {
		entries []object.TreeEntry
		subdirs map[string]bool
	}
	dirs := map[string]*dir{"": {subdirs: map[string]bool{}}}
	ensure := func(p string) *dir {
		d, ok := dirs[p]
		if !ok {
			d = &dir{subdirs: map[string]bool{}}
			dirs[p] = d
		}
		return d
	}
	for full, e := range entries {
		parent := path.Dir(full)
		if parent == "." {
			parent = ""
		}
		e.Name = path.Base(full)
		ensure(parent).entries = append(ensure(parent).entries, e)
		for p := parent; p != ""; {
			up := path.Dir(p)
			if up == "." {
				up = ""
			}
			ensure(up).subdirs[path.Base(p)] = true
			p = up
		}
	}
	// Deepest folders first, so a folder's subtrees exist when it is written.
	paths := make([]string, 0, len(dirs))
	for p := range dirs {
		paths = append(paths, p)
	}
	depth := func(p string) int {
		if p == "" {
			return 0
		}
		return strings.Count(p, "/") + 1
	}
	sort.Slice(paths, func(i, j int) bool { return depth(paths[i]) > depth(paths[j]) })
	written := map[string]plumbing.Hash{}
	for _, p := range paths {
		d := dirs[p]
		es := append([]object.TreeEntry(nil), d.entries...)
		for sub := range d.subdirs {
			full := sub
			if p != "" {
				full = p + "/" + sub
			}
			h, ok := written[full]
			if !ok {
				return plumbing.ZeroHash, fmt.Errorf("tree %s written before its subtree %s", p, full)
			}
			es = append(es, object.TreeEntry{Name: sub, Mode: filemode.Dir, Hash: h})
		}
		// Git's order: by name, a folder's name read with a trailing "/".
		sort.Slice(es, func(i, j int) bool { return sortName(es[i]) < sortName(es[j]) })
		t := &object.Tree{Entries: es}
		obj := repo.Storer.NewEncodedObject()
		if err := t.Encode(obj); err != nil {
			return plumbing.ZeroHash, fmt.Errorf("encode tree %q: %w", p, err)
		}
		h, err := repo.Storer.SetEncodedObject(obj)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("store tree %q: %w", p, err)
		}
		written[p] = h
	}
	return written[""], nil
}

func sortName(e object.TreeEntry) string {
	if e.Mode == filemode.Dir {
		return e.Name + "/"
	}
	return e.Name
}
