package ocisandbox_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/belay-dev/belay/internal/hardening"
	"github.com/belay-dev/belay/internal/ocisandbox"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
)

// entry is one file of a synthetic layer.
type entry struct {
	name, link, body string
	typ              byte
	mode             int64
	uid              int
}

func layerTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// writeArchive packs layers (uncompressed tars, gzipped here) into an OCI
// archive whose config says diffIDs (nil: the true ones).
func writeArchive(t *testing.T, layers [][]byte, diffIDs []string) string {
	t.Helper()
	blobs := map[string][]byte{}
	var descs []map[string]any
	var ids []string
	for _, l := range layers {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(l)
		zw.Close()
		blobs[digest(z.Bytes())] = z.Bytes()
		descs = append(descs, map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(z.Bytes()), "size": z.Len()})
		ids = append(ids, digest(l))
	}
	if diffIDs != nil {
		ids = diffIDs
	}
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"User": "10001:10001", "Entrypoint": hardening.Sandbox.Entrypoint},
		"rootfs": map[string]any{"type": "layers", "diff_ids": ids},
	})
	blobs[digest(config)] = config
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
		"layers": descs,
	})
	blobs[digest(manifest)] = manifest
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{
		map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest)},
	}})
	path := filepath.Join(t.TempDir(), "image.oci.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	add := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	for d, b := range blobs {
		add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b)
	}
	tw.Close()
	f.Close()
	return path
}

func TestUnpack(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("unpacking sets owners (CI runs the tests as root)")
		}
		t.Skip("unpacking sets owners: run as root")
	}
	base := layerTar(t, []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "./usr/", typ: tar.TypeDir, mode: 0o755},
		{name: "./usr/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "./usr/bin/tool", typ: tar.TypeReg, mode: 0o755, body: "tool"},
		{name: "./usr/bin/su", typ: tar.TypeReg, mode: 0o4755, body: "setuid"},
		{name: "./usr/bin/alias", typ: tar.TypeLink, link: "./usr/bin/tool"},
		{name: "./bin", typ: tar.TypeSymlink, link: "usr/bin"},
		{name: "./etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "./etc/gone", typ: tar.TypeReg, body: "x"},
		{name: "./opt/", typ: tar.TypeDir, mode: 0o755},
		{name: "./opt/a", typ: tar.TypeReg, body: "a"},
		{name: "./home/", typ: tar.TypeDir, mode: 0o700, uid: 10001},
		{name: "./dev/", typ: tar.TypeDir, mode: 0o755},
		{name: "./dev/null", typ: tar.TypeChar},
	})
	top := layerTar(t, []entry{
		{name: "etc/.wh.gone", typ: tar.TypeReg},
		{name: "opt/.wh..wh..opq", typ: tar.TypeReg},
		{name: "opt/b", typ: tar.TypeReg, body: "b"},
	})
	img, err := ocisandbox.OpenImage(writeArchive(t, [][]byte{base, top}, nil))
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := img.Unpack(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "bin", "tool")); err != nil || string(b) != "tool" {
		t.Errorf("bin/tool through the symlink: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "usr/bin/su")); err != nil || fi.Mode()&os.ModeSetuid != 0 {
		t.Errorf("usr/bin/su: %v %v, want it without its setuid bit", fi.Mode(), err)
	}
	a, _ := os.Stat(filepath.Join(rootfs, "usr/bin/alias"))
	b, _ := os.Stat(filepath.Join(rootfs, "usr/bin/tool"))
	if !os.SameFile(a, b) {
		t.Error("the hard link is not one")
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "etc/gone")); !os.IsNotExist(err) {
		t.Errorf("etc/gone survived its whiteout: %v", err)
	}
	names, _ := filepath.Glob(filepath.Join(rootfs, "opt", "*"))
	if len(names) != 1 || filepath.Base(names[0]) != "b" {
		t.Errorf("opt after the opaque whiteout: %v, want only b", names)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "dev/null")); !os.IsNotExist(err) {
		t.Errorf("a device node was made: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "home")); err != nil || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != 10001 {
		t.Errorf("home: %v %v; want mode 0700, owned by 10001 as the layer says", fi, err)
	}
	// Unpacked once: a second call finds it.
	again, err := img.Unpack(filepath.Dir(filepath.Dir(rootfs)))
	if err != nil || again != rootfs {
		t.Errorf("second Unpack = %q, %v; want %q from the cache", again, err, rootfs)
	}
}

// TestUnpackRefuses feeds layers that try to write outside the root or do
// not match their digests: nothing is unpacked.
func TestUnpackRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("unpacking sets owners (CI runs the tests as root)")
		}
		t.Skip("unpacking sets owners: run as root")
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		entries []entry
		diffIDs []string
	}{
		"dot dot":  {entries: []entry{{name: "../escape", typ: tar.TypeReg, body: "x"}}},
		"absolute": {entries: []entry{{name: "/etc/escape", typ: tar.TypeReg, body: "x"}}},
		"through a symlink": {entries: []entry{
			{name: "link", typ: tar.TypeSymlink, link: outside},
			{name: "link/escape", typ: tar.TypeReg, body: "x"},
		}},
		"relative symlink out": {entries: []entry{
			{name: "up", typ: tar.TypeSymlink, link: "../../../../../../../../" + strings.TrimPrefix(outside, "/")},
			{name: "up/escape", typ: tar.TypeReg, body: "x"},
		}},
		"hard link out": {entries: []entry{{name: "passwd", typ: tar.TypeLink, link: "../../../../etc/passwd"}}},
		"wrong diff id": {entries: []entry{{name: "a", typ: tar.TypeReg, body: "x"}}, diffIDs: []string{digest([]byte("other"))}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			img, err := ocisandbox.OpenImage(writeArchive(t, [][]byte{layerTar(t, tt.entries)}, tt.diffIDs))
			if err != nil {
				t.Fatal(err)
			}
			cache := t.TempDir()
			if rootfs, err := img.Unpack(cache); err == nil {
				t.Errorf("Unpack = %s, want a refusal", rootfs)
			}
			if _, err := os.Stat(filepath.Join(outside, "escape")); err == nil {
				t.Fatal("a file was written outside the root")
			}
			if ents, _ := os.ReadDir(cache); len(ents) != 0 {
				t.Errorf("the cache holds %v after a refusal", ents)
			}
		})
	}
}

// TestTheImage checks the real image (scripts/image.sh) against the
// hardening profile, without running it: its user, entrypoint (no
// default arguments), architecture and version label; the entry static,
// root's and 0555; the user in /etc/passwd with its home in the
// workspace; no setuid or setgid file; no docs or manuals.
func TestTheImage(t *testing.T) {
	path := ocisandboxtest.Image(t)
	img, err := ocisandbox.OpenImage(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ocisandbox.CheckImage(img, hardening.Sandbox); err != nil {
		t.Error(err)
	}
	c := img.Config.Config
	if c.Labels["org.opencontainers.image.version"] == "" || c.Labels["org.opencontainers.image.title"] != "belay-sandbox" {
		t.Errorf("labels %v, want a title and a version", c.Labels)
	}
	if c.WorkingDir != hardening.Sandbox.WorkspaceDir {
		t.Errorf("working dir %q, want %q", c.WorkingDir, hardening.Sandbox.WorkspaceDir)
	}
	rootfs, err := img.Unpack(ocisandboxtest.Cache(t))
	if err != nil {
		t.Fatal(err)
	}
	// The layer itself, not the unpacked tree (which drops such bits):
	// walk the archive's entries.
	var setid []string
	var entry *tar.Header
	var docs int
	walkLayer(t, path, img, func(h *tar.Header) {
		name := strings.TrimPrefix(h.Name, "./")
		if h.Mode&(0o4000|0o2000) != 0 {
			setid = append(setid, name)
		}
		if "/"+name == hardening.Sandbox.Entrypoint[0] {
			entry = h
		}
		isDoc := strings.HasPrefix(name, "usr/share/man/") || strings.HasPrefix(name, "usr/share/info/") ||
			(strings.HasPrefix(name, "usr/share/doc/") && !strings.HasSuffix(name, "/copyright"))
		if isDoc && h.Typeflag == tar.TypeReg {
			docs++
		}
	})
	if len(setid) > 0 {
		t.Errorf("setuid or setgid entries in the image: %v", setid)
	}
	if entry == nil {
		t.Fatalf("no %s in the image", hardening.Sandbox.Entrypoint[0])
	}
	if entry.Uid != 0 || entry.Gid != 0 || entry.Mode&0o7777 != 0o555 || entry.Typeflag != tar.TypeReg {
		t.Errorf("the entry is %d:%d mode %o; want root's, 0555", entry.Uid, entry.Gid, entry.Mode)
	}
	if docs > 0 {
		t.Errorf("%d documentation files in the image", docs)
	}
	bin, err := os.ReadFile(filepath.Join(rootfs, hardening.Sandbox.Entrypoint[0]))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(bin, []byte("/lib64/ld-linux")) || bytes.Contains(bin, []byte("/lib/ld-linux")) {
		t.Error("the entry names a dynamic loader: it must be static (CGO_ENABLED=0)")
	}
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	want := "sandbox:x:10001:10001:belay sandbox:" + hardening.Sandbox.WorkspaceDir + "/home:/usr/sbin/nologin"
	if !slices.Contains(strings.Split(string(passwd), "\n"), want) {
		t.Errorf("/etc/passwd has no line %q:\n%s", want, passwd)
	}
	for _, f := range []string{"usr/bin/git", "usr/bin/python3", "usr/lib/python3/dist-packages/pytest/__init__.py", "etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("the image lacks %s: %v", f, err)
		}
	}
}

// walkLayer calls fn for each entry of the image's (single) layer.
func walkLayer(t *testing.T, archive string, img *ocisandbox.Image, fn func(*tar.Header)) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatal("the layer is not in the archive")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Size < 1<<20 {
			continue // the layer is the large blob
		}
		zr, err := gzip.NewReader(tr)
		if err != nil {
			t.Fatal(err)
		}
		lr := tar.NewReader(zr)
		for {
			h, err := lr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fn(h)
		}
	}
}
