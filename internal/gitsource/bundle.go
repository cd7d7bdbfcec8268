package gitsource

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/belay-dev/belay/internal/belay"
)

// LoadBundle reads a source bundle (as Fetch writes it) into an in-memory
// repository and returns it with the commit the bundle's ref names. It
// refuses a bundle with prerequisites (it must be whole) or without exactly
// one ref.
func LoadBundle(r io.Reader) (*git.Repository, plumbing.Hash, error) {
	br := bufio.NewReader(r)
	sig, err := br.ReadString('\n')
	if err != nil || sig != "# v2 git bundle\n" {
		return nil, plumbing.ZeroHash, errors.New("load bundle: not a v2 git bundle")
	}
	var tip plumbing.Hash
	refs := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, plumbing.ZeroHash, fmt.Errorf("load bundle: read header: %w", err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			break
		}
		if strings.HasPrefix(line, "-") {
			return nil, plumbing.ZeroHash, errors.New("load bundle: it has prerequisites; a source bundle holds the whole history")
		}
		id, _, ok := strings.Cut(line, " ")
		if !ok || !belay.IsObjectName(id) {
			return nil, plumbing.ZeroHash, errors.New("load bundle: malformed ref line")
		}
		tip = plumbing.NewHash(id)
		refs++
	}
	if refs != 1 {
		return nil, plumbing.ZeroHash, fmt.Errorf("load bundle: %d refs; a source bundle has one", refs)
	}
	st := memory.NewStorage()
	if err := packfile.UpdateObjectStorage(st, br); err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("load bundle: read pack: %w", err)
	}
	repo, err := git.Init(st, nil)
	if err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("load bundle: %w", err)
	}
	if _, err := repo.CommitObject(tip); err != nil {
		return nil, plumbing.ZeroHash, fmt.Errorf("load bundle: its ref names no commit in it: %w", err)
	}
	return repo, tip, nil
}

// Push pushes commit of repo to url as the new branch (never an existing
// one: a branch that exists at the remote is refused, not overwritten),
// with the credentials that match url.
func (c *Client) Push(ctx context.Context, repo *git.Repository, url string, commit plumbing.Hash, branch string) error {
	local := plumbing.NewBranchReferenceName(branch)
	if err := repo.Storer.SetReference(plumbing.NewHashReference(local, commit)); err != nil {
		return fmt.Errorf("push %s: %w", branch, err)
	}
	remote, err := repo.CreateRemoteAnonymous(&config.RemoteConfig{Name: "anonymous", URLs: []string{url}})
	if err != nil {
		return fmt.Errorf("push %s to %s: %w", branch, url, err)
	}
	auth := c.auth(url)
	// The branch must not exist yet: a fast-forward of an existing branch
	// would otherwise go through.
	refs, err := remote.ListContext(ctx, &git.ListOptions{Auth: auth})
	if err != nil && !errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return fmt.Errorf("push %s to %s: list refs: %w", branch, url, err)
	}
	for _, r := range refs {
		if r.Name() == local {
			return fmt.Errorf("push %s to %s: the branch exists already; belay pushes only new branches", branch, url)
		}
	}
	spec := config.RefSpec(local.String() + ":" + local.String())
	err = remote.PushContext(ctx, &git.PushOptions{
		RemoteName: "anonymous",
		RefSpecs:   []config.RefSpec{spec},
		Auth:       auth,
	})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("push %s to %s: %w", branch, url, err)
	}
	c.log.Info("branch pushed", "url", url, "branch", branch, "commit", commit.String())
	return nil
}
