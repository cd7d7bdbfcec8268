// Package secrets supplies the control plane's long-lived secrets (the model
// provider key, the control-plane token) from wherever the deployment keeps
// them: AWS Secrets Manager on AWS, an owner-only file or an environment
// variable on one machine. A Cache in front of any Source keeps the value in
// memory for a while, shares one fetch among concurrent callers, and can be
// told to drop the value early when the upstream refuses it (401), so a
// rotated key is picked up at once.
//
// A secret's value never appears in an error, a log line or a formatted
// Source or Cache: errors name the secret (its id or path), never its
// content.
package secrets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Source fetches a secret's current value. It may be slow (a network call,
// a file read); put a Cache in front of it.
type Source interface {
	Fetch(ctx context.Context) (string, error)
}

// StaticSource serves a value fixed at start, such as one taken from an
// environment variable. It formats as "StaticSource(redacted)".
type StaticSource struct{ value string }

// NewStaticSource returns a Source that always answers value.
func NewStaticSource(value string) *StaticSource { return &StaticSource{value: value} }

// Fetch returns the value. It fails when the value is empty, so a missing
// environment variable is reported rather than sent upstream.
func (s *StaticSource) Fetch(ctx context.Context) (string, error) {
	if strings.TrimSpace(s.value) == "" {
		return "", errors.New("secrets: the configured secret is empty")
	}
	return s.value, nil
}

// String keeps the value out of anything that formats the source.
func (s StaticSource) String() string { return "StaticSource(redacted)" }

// GoString keeps the value out of %#v.
func (s StaticSource) GoString() string { return s.String() }

// maxFileBytes bounds a key file: keys and tokens are short, and a large
// file is a mistake worth reporting.
const maxFileBytes = 64 << 10

// FileSource reads a secret from a file on each Fetch, so a key replaced on
// disk is picked up at the next refresh. The file must be a regular file
// (not a symlink) with no permissions for group or others (0600 or
// stricter); anything else is refused with an error saying how to fix it.
// Surrounding whitespace, such as a trailing newline, is trimmed.
type FileSource struct{ path string }

// NewFileSource returns a Source reading the file at path.
func NewFileSource(path string) *FileSource { return &FileSource{path: path} }

// Fetch reads and checks the file.
func (s *FileSource) Fetch(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("secrets: read key file %s: %w", s.path, err)
	}
	// Lstat first so a symlink is refused rather than followed; the open
	// file is then checked to be that same file, so a swap in between is
	// caught too.
	li, err := os.Lstat(s.path)
	if err != nil {
		return "", fmt.Errorf("secrets: key file: %w", err)
	}
	if err := checkKeyFile(s.path, li); err != nil {
		return "", err
	}
	f, err := os.Open(s.path)
	if err != nil {
		return "", fmt.Errorf("secrets: key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("secrets: key file %s: %w", s.path, err)
	}
	if !os.SameFile(li, fi) {
		return "", fmt.Errorf("secrets: key file %s changed while it was opened; try again", s.path)
	}
	if err := checkKeyFile(s.path, fi); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("secrets: read key file %s: %w", s.path, err)
	}
	if len(b) > maxFileBytes {
		return "", fmt.Errorf("secrets: key file %s is larger than %d bytes; it should hold only the key", s.path, maxFileBytes)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("secrets: key file %s is empty", s.path)
	}
	return v, nil
}

// String names the file, which is not secret.
func (s *FileSource) String() string { return "FileSource(" + s.path + ")" }

func checkKeyFile(path string, fi os.FileInfo) error {
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("secrets: key file %s is a symlink; point belay at the file itself", path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("secrets: key file %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("secrets: key file %s has mode %04o, readable beyond its owner; run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	return nil
}
