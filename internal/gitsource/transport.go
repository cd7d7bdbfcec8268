package gitsource

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/plumbing/transport/server"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// go-git picks a transport by scheme from one process-wide table. Install
// replaces its entries once: http(s) through a client whose transport can
// cap what one fetch downloads (the cap rides on the request's context),
// which never follows a redirect to another host with the credentials
// (net/http drops Authorization across hosts) and times out a stalled
// connection; file:// through go-git's own server code in-process, so a
// mirror on disk is read without running git-upload-pack (which a Lambda
// does not have). ssh:// and git:// are removed: belay never uses them.
var installOnce sync.Once

func install() {
	installOnce.Do(func() {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = 60 * time.Second
		c := githttp.NewClient(&http.Client{Transport: cappedTransport{next: t}})
		client.InstallProtocol("https", c)
		client.InstallProtocol("http", c)
		client.InstallProtocol("file", server.NewClient(dirLoader{}))
		client.InstallProtocol("ssh", nil)
		client.InstallProtocol("git", nil)
	})
}

// errTransferCap is what a read past a fetch's byte cap fails with.
var errTransferCap = errors.New("the repository sent more than the size limit allows")

type capKey struct{}

// capCounter counts the bytes of every answer within one fetch.
type capCounter struct {
	max  int64
	read atomic.Int64
}

// withTransferCap returns ctx carrying a cap of max bytes over every
// answer read within it.
func withTransferCap(ctx context.Context, max int64) (context.Context, *capCounter) {
	c := &capCounter{max: max}
	return context.WithValue(ctx, capKey{}, c), c
}

type cappedTransport struct{ next http.RoundTripper }

func (t cappedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if c, ok := r.Context().Value(capKey{}).(*capCounter); ok {
		res.Body = &cappedBody{ReadCloser: res.Body, c: c}
	}
	return res, nil
}

type cappedBody struct {
	io.ReadCloser
	c *capCounter
}

func (b *cappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.c.read.Add(int64(n)) > b.c.max {
		return n, errTransferCap
	}
	return n, err
}

// dirLoader opens the repository at a file:// endpoint's path: a bare
// repository, or the .git folder of a work tree.
type dirLoader struct{}

func (dirLoader) Load(ep *transport.Endpoint) (storer.Storer, error) {
	dir := filepath.Clean(ep.Path)
	if fi, err := os.Stat(filepath.Join(dir, ".git")); err == nil && fi.IsDir() {
		dir = filepath.Join(dir, ".git")
	}
	if _, err := os.Stat(filepath.Join(dir, "objects")); err != nil {
		return nil, transport.ErrRepositoryNotFound
	}
	return filesystem.NewStorage(osfs.New(dir), cache.NewObjectLRUDefault()), nil
}
