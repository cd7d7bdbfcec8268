package ocisandbox

import (
	"archive/tar"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The media types this launcher reads (OCI image spec 1.x).
const (
	mediaTypeManifest  = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip"
	mediaTypeLayerTar  = "application/vnd.oci.image.layer.v1.tar"
)

// maxJSONBlob bounds the index, a manifest or a config read from an
// archive: they are a few hundred bytes.
const maxJSONBlob = 1 << 20

// Image is a sandbox image read from an OCI archive (an OCI image layout
// packed as one tar, what scripts/image.sh writes).
type Image struct {
	// Archive is the archive's path.
	Archive string
	// Digest is the manifest's digest, "sha256:<hex>": what the image is.
	Digest string
	// Config is the image's configuration.
	Config ImageConfig
	layers []descriptor
}

// ImageConfig is the part of an OCI image configuration the launcher
// uses and checks.
type ImageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User"`
		Env        []string          `json:"Env"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		WorkingDir string            `json:"WorkingDir"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

// OpenImage reads the index, manifest and config of the OCI archive at
// path and checks their digests. The archive must hold one image.
func OpenImage(archive string) (*Image, error) {
	small := map[string][]byte{}
	err := walkArchive(archive, func(h *tar.Header, r io.Reader) (bool, error) {
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if h.Typeflag != tar.TypeReg || h.Size > maxJSONBlob {
			return false, nil
		}
		b, err := io.ReadAll(r)
		if err != nil {
			return false, err
		}
		small[name] = b
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox image %s: %w", archive, err)
	}
	blob := func(d descriptor) ([]byte, error) {
		hexd, ok := strings.CutPrefix(d.Digest, "sha256:")
		if !ok || len(hexd) != 64 {
			return nil, fmt.Errorf("digest %q is not sha256", d.Digest)
		}
		b, ok := small["blobs/sha256/"+hexd]
		if !ok {
			return nil, fmt.Errorf("blob %s is missing", d.Digest)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexd {
			return nil, fmt.Errorf("blob %s does not match its digest", d.Digest)
		}
		return b, nil
	}
	var idx index
	b, ok := small["index.json"]
	if !ok {
		return nil, fmt.Errorf("sandbox image %s: no index.json: not an OCI archive (build one with make image)", archive)
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("sandbox image %s: index.json: %w", archive, err)
	}
	if len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("sandbox image %s: the archive holds %d images; it must hold one", archive, len(idx.Manifests))
	}
	if mt := idx.Manifests[0].MediaType; mt != mediaTypeManifest {
		return nil, fmt.Errorf("sandbox image %s: manifest media type %q, want %q", archive, mt, mediaTypeManifest)
	}
	b, err = blob(idx.Manifests[0])
	if err != nil {
		return nil, fmt.Errorf("sandbox image %s: manifest: %w", archive, err)
	}
	var man manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("sandbox image %s: manifest: %w", archive, err)
	}
	b, err = blob(man.Config)
	if err != nil {
		return nil, fmt.Errorf("sandbox image %s: config: %w", archive, err)
	}
	img := &Image{Archive: archive, Digest: idx.Manifests[0].Digest, layers: man.Layers}
	if err := json.Unmarshal(b, &img.Config); err != nil {
		return nil, fmt.Errorf("sandbox image %s: config: %w", archive, err)
	}
	if len(man.Layers) == 0 || len(man.Layers) != len(img.Config.RootFS.DiffIDs) {
		return nil, fmt.Errorf("sandbox image %s: %d layers and %d diff ids", archive, len(man.Layers), len(img.Config.RootFS.DiffIDs))
	}
	for _, l := range man.Layers {
		if l.MediaType != mediaTypeLayerGzip && l.MediaType != mediaTypeLayerTar {
			return nil, fmt.Errorf("sandbox image %s: layer media type %q is not supported", archive, l.MediaType)
		}
	}
	return img, nil
}

// CompressedBytes is what pulling the image moves: its layers as stored
// (gzip-compressed) and its config.
func (img *Image) CompressedBytes() int64 {
	var n int64
	for _, l := range img.layers {
		n += l.Size
	}
	return n
}

// walkArchive calls fn for every entry of the tar file at path until fn
// says it is done.
func walkArchive(archive string, fn func(h *tar.Header, r io.Reader) (done bool, err error)) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		done, err := fn(h, tr)
		if err != nil || done {
			return err
		}
	}
}

// rootfsComplete marks an unpacked root file system as whole.
const rootfsComplete = ".belay-unpacked"

// Unpack returns the image's root file system unpacked under cacheDir
// (cacheDir/<digest hex>/rootfs), unpacking it first when it is not
// there yet: each image is unpacked once, and a sandbox start only mounts
// it. Unpacking writes into a temporary folder that is renamed into place
// when whole, so a crash or a concurrent unpack leaves no half-written
// tree behind. Each layer's digest and diff id are checked while it is
// read; entries that would land outside the root (absolute or .. paths,
// through a symbolic link) are refused, setuid and setgid bits are
// dropped, and device files and extended attributes (file capabilities)
// are not created.
func (img *Image) Unpack(cacheDir string) (string, error) {
	hexd := strings.TrimPrefix(img.Digest, "sha256:")
	dir := filepath.Join(cacheDir, hexd)
	rootfs := filepath.Join(dir, "rootfs")
	if _, err := os.Stat(filepath.Join(dir, rootfsComplete)); err == nil {
		return rootfs, nil
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tmp := filepath.Join(cacheDir, fmt.Sprintf(".unpack-%s-%x", hexd[:12], b))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", fmt.Errorf("unpack sandbox image: %w", err)
	}
	defer os.RemoveAll(tmp)
	tmpRoot := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(tmpRoot, 0o755); err != nil {
		return "", fmt.Errorf("unpack sandbox image: %w", err)
	}
	for i, l := range img.layers {
		if err := img.unpackLayer(l, img.Config.RootFS.DiffIDs[i], tmpRoot); err != nil {
			return "", fmt.Errorf("unpack sandbox image %s, layer %d: %w", img.Archive, i+1, err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, rootfsComplete), []byte(img.Digest+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("unpack sandbox image: %w", err)
	}
	// The folder above the root is root's and only searchable by others:
	// each sandbox's user namespace root (an unprivileged host id) passes
	// through it to mount the tree read-only; nobody can list it.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return "", fmt.Errorf("unpack sandbox image: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, rootfsComplete)); serr == nil {
			// Another launcher unpacked the same image meanwhile.
			return rootfs, nil
		}
		return "", fmt.Errorf("unpack sandbox image: %w", err)
	}
	return rootfs, nil
}

// unpackLayer finds layer l in the archive and extracts it into dst.
func (img *Image) unpackLayer(l descriptor, diffID, dst string) error {
	hexd, ok := strings.CutPrefix(l.Digest, "sha256:")
	if !ok {
		return fmt.Errorf("digest %q is not sha256", l.Digest)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	found := false
	err = walkArchive(img.Archive, func(h *tar.Header, r io.Reader) (bool, error) {
		if path.Clean(strings.TrimPrefix(h.Name, "./")) != "blobs/sha256/"+hexd {
			return false, nil
		}
		found = true
		compressed := sha256.New()
		r = io.TeeReader(r, compressed)
		if l.MediaType == mediaTypeLayerGzip {
			zr, err := gzip.NewReader(r)
			if err != nil {
				return true, err
			}
			defer zr.Close()
			r = zr
		}
		uncompressed := sha256.New()
		if err := extract(io.TeeReader(r, uncompressed), root); err != nil {
			return true, err
		}
		// Read what the tar reader left (its end-of-archive padding) so
		// both digests cover the whole blob.
		if _, err := io.Copy(uncompressed, r); err != nil {
			return true, err
		}
		if got := "sha256:" + hex.EncodeToString(compressed.Sum(nil)); got != l.Digest {
			return true, fmt.Errorf("layer digest is %s, the manifest says %s", got, l.Digest)
		}
		if got := "sha256:" + hex.EncodeToString(uncompressed.Sum(nil)); got != diffID {
			return true, fmt.Errorf("layer diff id is %s, the config says %s", got, diffID)
		}
		return true, nil
	})
	if err == nil && !found {
		err = fmt.Errorf("blob %s is missing", l.Digest)
	}
	return err
}

// extract writes the layer tar r into root, applying OCI whiteouts.
func extract(r io.Reader, root *os.Root) error {
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name, err := entryName(h.Name)
		if err != nil {
			return err
		}
		if name == "." {
			if h.Typeflag == tar.TypeDir {
				if err := setAttrs(root, ".", h); err != nil {
					return err
				}
				dirs = append(dirs, dirTime{".", h.ModTime})
			}
			continue
		}
		base := path.Base(name)
		if strings.HasPrefix(base, ".wh.") {
			if err := whiteout(root, name); err != nil {
				return err
			}
			continue
		}
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		// A later layer replaces what an earlier one had, except a
		// directory, whose contents stay.
		if fi, err := root.Lstat(name); err == nil && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
			if err := root.RemoveAll(name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := setAttrs(root, name, h); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{name, h.ModTime})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := setAttrs(root, name, h); err != nil {
				return err
			}
			if err := root.Chtimes(name, h.ModTime, h.ModTime); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeLink:
			target, err := entryName(h.Linkname)
			if err != nil {
				return err
			}
			if err := root.Link(target, name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		default:
			// Devices, FIFOs: the runtime makes /dev; nothing else in a
			// sandbox needs them.
		}
	}
	// Directory times last: creating their entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t); err != nil {
			return fmt.Errorf("%s: %w", dirs[i].name, err)
		}
	}
	return nil
}

// entryName cleans a tar entry's name into a path relative to the root
// ("." for the root itself), refusing one that is absolute or climbs out
// with "..".
func entryName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("entry %q is absolute", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." {
			return "", fmt.Errorf("entry %q leaves the root", name)
		}
	}
	return path.Clean(name), nil
}

// setAttrs gives name the entry's owner and mode, without setuid or setgid.
func setAttrs(root *os.Root, name string, h *tar.Header) error {
	if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	mode := fs.FileMode(h.Mode).Perm()
	if h.Mode&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	if err := root.Chmod(name, mode); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// whiteout applies an OCI whiteout entry: .wh..wh..opq empties its
// directory, .wh.NAME removes NAME.
func whiteout(root *os.Root, name string) error {
	dir, base := path.Split(name)
	dir = path.Clean("/" + dir)[1:]
	if dir == "" {
		dir = "."
	}
	if base == ".wh..wh..opq" {
		f, err := root.Open(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, n := range names {
			if err := root.RemoveAll(path.Join(dir, n)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	}
	if err := root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, ".wh."))); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
