package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/wire"
)

// sourceBundleFile is where the entry keeps the downloaded bundle until the
// repository is built from it: in the workspace's home/, one of the folders
// the sandbox may write (the workspace folder itself is the launcher's).
const sourceBundleFile = "belay-source.bundle"

// downloadSource fetches the run's git bundle from t (the source route with
// the events token, or a presigned URL) into dst, and checks that it is
// exactly the bundle the control plane stored: its size and SHA-256 are in
// the spec.
func (u *uploader) downloadSource(ctx context.Context, t wire.Upload, dst string, want belay.SourceBundle) error {
	client, target, err := u.resolve(t, http.MethodGet)
	if err != nil {
		return fmt.Errorf("download source: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return errors.New("download source: build the request")
	}
	for k, v := range t.Header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("download source: %w", errors.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download source: the control plane answered %d", resp.StatusCode)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
	if err != nil {
		return fmt.Errorf("download source: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, want.Size+1))
	if err != nil {
		return fmt.Errorf("download source: %w", err)
	}
	if n != want.Size || hex.EncodeToString(h.Sum(nil)) != want.SHA256 {
		return fmt.Errorf("download source: got %d bytes that are not the bundle the spec names (%d bytes, SHA-256 %s)", n, want.Size, want.SHA256)
	}
	return f.Close()
}

// BuildRepoFromBundle creates the repository g.Dir from a git bundle: the
// run's source commit and its history. The commit, which must be what the
// bundle's one ref names, becomes the base, checked out as the work tree,
// so the patch is `git diff base` as for uploaded files. Objects are
// checked as they are fetched (transfer.fsckObjects), and .git is laid
// out as BuildRepo lays it out (hooks off, attributes that keep bytes as
// they are).
func BuildRepoFromBundle(ctx context.Context, g Git, bundle, commit string) (*Base, error) {
	if !belay.IsObjectName(commit) {
		return nil, fmt.Errorf("build repository: %q is not a commit id", commit)
	}
	if err := os.Mkdir(g.Dir, 0o755); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("build repository: %w", err)
		}
		entries, rerr := os.ReadDir(g.Dir)
		if rerr != nil || len(entries) > 0 {
			return nil, fmt.Errorf("build repository: %s exists and is not an empty directory", g.Dir)
		}
	}
	if err := g.Init(ctx); err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	const fetched = "refs/belay/source"
	if _, err := g.Run(ctx, "-c", "transfer.fsckObjects=true", "-c", "fetch.fsckObjects=true",
		"fetch", "-q", "--no-tags", "--no-write-fetch-head", bundle, "+refs/belay/base:"+fetched); err != nil {
		return nil, fmt.Errorf("build repository: fetch the source bundle: %w", err)
	}
	out, err := g.Run(ctx, "rev-parse", "--verify", fetched+"^{commit}")
	if err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	if got := strings.TrimSpace(string(out)); got != commit {
		return nil, fmt.Errorf("build repository: the bundle holds commit %s, not the run's %s", got, commit)
	}
	if _, err := g.Run(ctx, "update-ref", "HEAD", commit); err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	if _, err := g.Run(ctx, "update-ref", "-d", fetched); err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	if _, err := g.Run(ctx, "read-tree", "-u", "--reset", commit); err != nil {
		return nil, fmt.Errorf("build repository: check out %s: %w", commit, err)
	}
	base, err := newBase(ctx, g, commit)
	if err != nil {
		return nil, fmt.Errorf("build repository: %w", err)
	}
	return base, nil
}

// buildFromSource downloads the run's bundle into the workspace, builds the
// repository from it and removes the bundle.
func (e *entry) buildFromSource(ctx context.Context, se session, g Git) (*Base, error) {
	src := se.spec.Source.Git
	if se.source == nil {
		return nil, errors.New("build repository: the run has a git source but no download target for it")
	}
	path := filepath.Join(se.ws.HomeDir(), sourceBundleFile)
	u := &uploader{api: se.api, base: se.spec.APIBaseURL, log: e.log}
	if err := u.downloadSource(ctx, *se.source, path, *src.Bundle); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	defer os.Remove(path)
	return BuildRepoFromBundle(ctx, g, path, src.Commit)
}
