package localdir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"

	"github.com/belay-dev/belay/internal/belay"
)

var _ belay.SourceStore = (*Store)(nil)

// PutSource streams r into <runId>/source.bundle as a put does: a
// temporary file, fsynced and renamed over the target. Returns invalid for
// a bad run id; too_large past maxBytes, having written nothing.
func (s *Store) PutSource(ctx context.Context, runID string, r io.Reader, maxBytes int64) (belay.SourceBundle, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return belay.SourceBundle{}, err
	}
	if err := s.ensureRunDir(runID); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	name := belay.SourceBundleName
	target := runID + "/" + name
	tmp := runID + "/" + tempPrefix + name + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(s.seq.Add(1), 10)
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = s.root.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, maxBytes+1))
	switch {
	case err != nil:
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	case n > maxBytes:
		return belay.SourceBundle{}, belay.Errorf(belay.CodeTooLarge, "the source bundle is larger than %d bytes", maxBytes)
	}
	if err := f.Sync(); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	if err := f.Close(); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	done = true
	if err := s.root.Rename(tmp, target); err != nil {
		_ = s.root.Remove(tmp)
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	if err := s.syncDir(runID); err != nil {
		return belay.SourceBundle{}, fmt.Errorf("localdir: put source of %s: %w", runID, err)
	}
	return belay.SourceBundle{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// OpenSource opens <runId>/source.bundle. Returns invalid for a bad run
// id; not_found if it does not exist.
func (s *Store) OpenSource(ctx context.Context, runID string) (io.ReadCloser, int64, error) {
	if err := belay.CheckArtifactRunID(runID); err != nil {
		return nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	f, err := s.root.Open(runID + "/" + belay.SourceBundleName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, belay.Errorf(belay.CodeNotFound, "run %s has no source bundle", runID)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("localdir: open source of %s: %w", runID, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, belay.Errorf(belay.CodeNotFound, "run %s has no source bundle", runID)
	}
	return f, fi.Size(), nil
}

// ctxReader stops a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
