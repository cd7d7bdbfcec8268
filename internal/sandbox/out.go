package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"
)

// createOutFile creates (or truncates) a file the entry writes as it goes,
// refusing to follow a symbolic link planted in its place.
func createOutFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	return f, nil
}

// writeOutFile writes a whole output file: to a temporary file in the same
// folder, synced, then renamed over the name. A reader never sees half a
// file, and a symbolic link planted at the name is replaced, not followed.
func writeOutFile(path string, data []byte) error {
	name := filepath.Base(path)
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+name+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// writeTranscriptLine appends one JSON line to the transcript; v gets a
// time field when it is a map without one.
func writeTranscriptLine(w io.Writer, now func() time.Time, v any) {
	if m, ok := v.(map[string]any); ok {
		if _, has := m["time"]; !has {
			m["time"] = now().UTC().Format(time.RFC3339Nano)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = w.Write(append(b, '\n'))
}

// truncateBytes cuts s to at most n bytes on a rune boundary.
func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
