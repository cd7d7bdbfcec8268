// Package localdir is the embedded deployment's belay.ArtifactStore: each
// run's artifacts are files in a folder under the data directory,
// <dir>/<runId>/<name>, readable by the operator's user alone (files 0600,
// folders 0700).
//
// A put writes a temporary file beside the target, fsyncs it, renames it
// over the target and fsyncs the folder, so a crash leaves the old artifact
// or the new one, never half of one. Every path is opened through an
// os.Root, so even a symlink planted in the folder cannot lead a read or
// write outside it.
package localdir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/belay-dev/belay/internal/belay"
)

const (
	dirMode  = 0o700
	fileMode = 0o600
	// tempPrefix starts every temporary file. Artifact names cannot start
	// with ".", so a temporary file is never mistaken for an artifact, and
	// one left by a crash is ignored.
	tempPrefix = ".tmp-"
)

// Store keeps artifacts in a folder. It is safe for concurrent use, also by
// several processes sharing the folder.
type Store struct {
	root *os.Root
	seq  atomic.Uint64
}

var _ belay.ArtifactStore = (*Store)(nil)

// New opens (creating it if needed) the artifacts folder dir and tightens it
// to 0700, since artifacts hold the user's code and the agent's transcript.
// Close releases it.
func New(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("localdir: artifacts folder not set")
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("localdir: create artifacts folder: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("localdir: artifacts folder: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("localdir: artifacts folder %s is not a directory", dir)
	}
	if fi.Mode().Perm() != dirMode {
		if err := os.Chmod(dir, dirMode); err != nil {
			return nil, fmt.Errorf("localdir: restrict artifacts folder to its owner: %w", err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("localdir: open artifacts folder: %w", err)
	}
	return &Store{root: root}, nil
}

// Close releases the folder. The Store must not be used after.
func (s *Store) Close() error { return s.root.Close() }

// PutArtifact stores content as <runId>/<name>, replacing any earlier
// artifact atomically. Returns invalid for a bad run id or name; too_large
// over belay.MaxArtifactBytes, having written nothing.
func (s *Store) PutArtifact(ctx context.Context, runID, name string, content []byte) error {
	if err := belay.CheckArtifactPut(runID, name, content); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("localdir: put artifact %s/%s: %w", runID, name, err)
	}
	if err := s.ensureRunDir(runID); err != nil {
		return fmt.Errorf("localdir: put artifact %s/%s: %w", runID, name, err)
	}
	if err := s.writeAtomic(runID, name, content); err != nil {
		return fmt.Errorf("localdir: put artifact %s/%s: %w", runID, name, err)
	}
	return nil
}

// ensureRunDir creates the run's folder; when it is new, the parent is
// fsynced so the folder survives a crash together with what goes in it.
func (s *Store) ensureRunDir(runID string) error {
	err := s.root.Mkdir(runID, dirMode)
	if errors.Is(err, fs.ErrExist) {
		fi, serr := s.root.Lstat(runID)
		if serr != nil {
			return serr
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", runID)
		}
		return nil
	}
	if err != nil {
		return err
	}
	return s.syncDir(".")
}

func (s *Store) writeAtomic(runID, name string, content []byte) (err error) {
	target := runID + "/" + name
	tmp := runID + "/" + tempPrefix + name + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(s.seq.Add(1), 10)
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = s.root.Remove(tmp)
		}
	}()
	if _, err = f.Write(content); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = s.root.Rename(tmp, target); err != nil {
		return err
	}
	return s.syncDir(runID)
}

func (s *Store) syncDir(name string) error {
	d, err := s.root.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync folder %s: %w", name, err)
	}
	return nil
}

// GetArtifact returns the content of <runId>/<name>. Returns invalid for a
// bad run id or name; not_found if the artifact does not exist.
func (s *Store) GetArtifact(ctx context.Context, runID, name string) ([]byte, error) {
	if err := belay.CheckArtifact(runID, name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("localdir: get artifact %s/%s: %w", runID, name, err)
	}
	f, err := s.root.Open(runID + "/" + name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, belay.Errorf(belay.CodeNotFound, "artifact %s not found", name)
	}
	if err != nil {
		return nil, fmt.Errorf("localdir: get artifact %s/%s: %w", runID, name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("localdir: get artifact %s/%s: %w", runID, name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, belay.Errorf(belay.CodeNotFound, "artifact %s not found", name)
	}
	content, err := io.ReadAll(io.LimitReader(f, belay.MaxArtifactBytes+1))
	if err != nil {
		return nil, fmt.Errorf("localdir: get artifact %s/%s: %w", runID, name, err)
	}
	if len(content) > belay.MaxArtifactBytes {
		return nil, belay.Errorf(belay.CodeTooLarge, "artifact %s is larger than %d bytes", name, belay.MaxArtifactBytes)
	}
	return content, nil
}

// ListArtifacts returns the run's artifacts sorted by name; an empty list
// when it has none. Returns invalid for a bad run id.
func (s *Store) ListArtifacts(ctx context.Context, runID string) ([]belay.ArtifactInfo, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("localdir: list artifacts of %s: %w", runID, err)
	}
	list := []belay.ArtifactInfo{}
	d, err := s.root.Open(runID)
	if errors.Is(err, fs.ErrNotExist) {
		return list, nil
	}
	if err != nil {
		return nil, fmt.Errorf("localdir: list artifacts of %s: %w", runID, err)
	}
	defer d.Close()
	entries, err := d.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("localdir: list artifacts of %s: %w", runID, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || belay.CheckArtifactName(e.Name()) != nil {
			continue // a temporary file, or something that is not ours
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("localdir: list artifacts of %s: %w", runID, err)
		}
		list = append(list, belay.ArtifactInfo{Name: e.Name(), Size: fi.Size()})
	}
	slices.SortFunc(list, func(a, b belay.ArtifactInfo) int { return strings.Compare(a.Name, b.Name) })
	return list, nil
}

// DeleteArtifact removes <runId>/<name> and fsyncs the run's folder; an
// artifact that does not exist is no error. Returns invalid for a bad run
// id or name.
func (s *Store) DeleteArtifact(ctx context.Context, runID, name string) error {
	if err := belay.CheckArtifact(runID, name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("localdir: delete artifact %s/%s: %w", runID, name, err)
	}
	err := s.root.Remove(runID + "/" + name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("localdir: delete artifact %s/%s: %w", runID, name, err)
	}
	return s.syncDir(runID)
}
