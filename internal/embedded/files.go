package embedded

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// secretBytes is the entropy of a generated token or signing key.
const secretBytes = 32

// maxSecretFile bounds a token or key file; they hold one hex line.
const maxSecretFile = 4 << 10

// prepareDataDir creates dir (and its parents) and gives it mode perm: 0700,
// or 0711 when the sandbox user must pass through it to reach its
// workspace. The directory must belong to this user.
func prepareDataDir(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("data directory %s is not a directory (a symbolic link is not accepted)", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("data directory %s belongs to uid %d, not to this user (uid %d)", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != perm {
		if err := os.Chmod(dir, perm); err != nil {
			return fmt.Errorf("restrict data directory %s to its owner: %w", dir, err)
		}
	}
	return nil
}

// ReadControlToken reads the control-plane token that `belay serve` wrote
// to <dataDir>/control-token. The file must be a regular file (not a
// symbolic link), owned by this user, with no access for group or others.
// The error names the file and says how to fix it, never the content.
func ReadControlToken(dataDir string) (string, error) {
	return readSecretFile(filepath.Join(dataDir, ControlTokenFile))
}

// readSecretFile reads a secret file written by writeSecretFile, checking
// it the same way whoever wrote it.
func readSecretFile(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return "", fmt.Errorf("%s is a symbolic link; it must be a regular file", path)
		}
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	switch st, _ := fi.Sys().(*syscall.Stat_t); {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("%s has mode %04o; it must be readable by its owner only (chmod 600 %s)", path, fi.Mode().Perm(), path)
	case st != nil && int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("%s belongs to uid %d, not to this user (uid %d)", path, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes; it should hold one line", path, maxSecretFile)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s is empty; remove it to have a new one written", path)
	}
	return v, nil
}

// loadOrCreateSecret returns the secret in path, writing a new one first
// (secretBytes from entropy, hex, mode 0600) when the file does not exist.
func loadOrCreateSecret(path string, entropy io.Reader) (value string, created bool, err error) {
	v, err := readSecretFile(path)
	if err == nil {
		return v, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	if entropy == nil {
		entropy = rand.Reader
	}
	b := make([]byte, secretBytes)
	if _, err := io.ReadFull(entropy, b); err != nil {
		return "", false, fmt.Errorf("generate %s: %w", path, err)
	}
	v = hex.EncodeToString(b)
	switch err := writeSecretFile(path, v); {
	case errors.Is(err, fs.ErrExist):
		// Another belay wrote it first; use theirs.
		v, err := readSecretFile(path)
		return v, false, err
	case err != nil:
		return "", false, err
	}
	return v, true, nil
}

// writeSecretFile creates path (which must not exist) with mode 0600 and
// the value, durably: the file and its directory are synced, so a crash
// cannot leave an empty token behind.
func writeSecretFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(value + "\n")
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(path)
		return fmt.Errorf("write %s: %w", path, werr)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	return nil
}
