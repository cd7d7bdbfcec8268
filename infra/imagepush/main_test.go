package main

import (
	"archive/tar"
	"encoding/base64"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// archive writes an OCI layout tar holding one random linux/arch image,
// as make image packs the sandbox image, and returns its path and digest.
func archive(t *testing.T, arch string) (string, v1.Hash) {
	t.Helper()
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(dir, "image.oci.tar")
	f, _ := os.Create(tarPath)
	tw := tar.NewWriter(f)
	root := filepath.Join(dir, "layout")
	_ = filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(path)
			_, err = tw.Write(b)
		}
		return err
	})
	_ = tw.Close()
	_ = f.Close()
	d, _ := img.Digest()
	return tarPath, d
}

func TestDigestOfArchive(t *testing.T) {
	path, want := archive(t, "arm64")
	img, cleanup, err := openArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	d, arch, err := describe(img)
	if err != nil {
		t.Fatal(err)
	}
	if d != want.String() || arch != "arm64" {
		t.Errorf("digest %s %s, want %s arm64", d, arch, want)
	}
}

// TestPushKeepsTheDigest pushes to go-containerregistry's registry (a
// real OCI distribution server, in this process; ECR itself has no peer
// here) and reads the image back by the digest the task definition pins.
func TestPushKeepsTheDigest(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	path, want := archive(t, "amd64")
	img, cleanup, err := openArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	repo := u.Host + "/belay-sandbox"
	got, err := push(t.Context(), img, repo, authn.Anonymous, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if got != want.String() {
		t.Fatalf("pushed %s, want %s", got, want)
	}
	ref, _ := name.NewDigest(repo+"@"+got, name.Insecure)
	pulled, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
	if d, _ := pulled.Digest(); d != want {
		t.Errorf("pulled %s", d)
	}
	tags, err := remote.List(ref.Context())
	if err != nil || len(tags) != 1 || !strings.HasPrefix(tags[0], "sandbox-"+want.Hex[:16]) {
		t.Errorf("tags %v (%v)", tags, err)
	}
}

func TestRefusesWhatIsNotOneLinuxImage(t *testing.T) {
	path, _ := archive(t, "s390x")
	img, cleanup, err := openArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if _, _, err := describe(img); err == nil || !strings.Contains(err.Error(), "s390x") {
		t.Errorf("an s390x image: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.tar")
	f, _ := os.Create(bad)
	tw := tar.NewWriter(f)
	_ = tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	_ = f.Close()
	if _, _, err := openArchive(bad); err == nil || !strings.Contains(err.Error(), "leaves the archive") {
		t.Errorf("an archive with ../escape: %v", err)
	}
}

func TestECRToken(t *testing.T) {
	a, err := basicFromToken(base64.StdEncoding.EncodeToString([]byte("AWS:secret-password")))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := a.Authorization()
	if cfg.Username != "AWS" || cfg.Password != "secret-password" {
		t.Errorf("credentials %+v", cfg)
	}
	for _, bad := range []string{"not base64!", base64.StdEncoding.EncodeToString([]byte("nocolon"))} {
		if _, err := basicFromToken(bad); err == nil {
			t.Errorf("token %q accepted", bad)
		}
	}
}
