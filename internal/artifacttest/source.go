package artifacttest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// RunSource runs the suite of belay.SourceStore: a bundle streams in and
// back byte for byte with its size and SHA-256, a put replaces, one past
// its cap is too_large and leaves what was there, a missing one is
// not_found, a bad run id is invalid. open returns a fresh, empty store.
func RunSource(t *testing.T, open func(tb testing.TB) belay.SourceStore) {
	t.Run("round_trip", func(t *testing.T) {
		s := open(t)
		content := binaryContent(300<<10, 7)
		info, err := s.PutSource(t.Context(), "run_src", bytes.NewReader(content), int64(len(content)))
		if err != nil {
			t.Fatalf("PutSource: %v", err)
		}
		sum := sha256.Sum256(content)
		if info.Size != int64(len(content)) || info.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("PutSource = %+v, want size %d and the content's SHA-256", info, len(content))
		}
		if got, size := mustOpenSource(t, s, "run_src"); !bytes.Equal(got, content) || size != int64(len(content)) {
			t.Errorf("OpenSource gave %d bytes (size %d), not what was put (%d)", len(got), size, len(content))
		}
		// A put replaces the bundle.
		if _, err := s.PutSource(t.Context(), "run_src", bytes.NewReader([]byte("second")), 100); err != nil {
			t.Fatalf("PutSource again: %v", err)
		}
		if got, _ := mustOpenSource(t, s, "run_src"); string(got) != "second" {
			t.Errorf("after a second put: %q", got)
		}
	})
	t.Run("too_large", func(t *testing.T) {
		s := open(t)
		if _, err := s.PutSource(t.Context(), "run_big", bytes.NewReader([]byte("kept")), 10); err != nil {
			t.Fatal(err)
		}
		_, err := s.PutSource(t.Context(), "run_big", bytes.NewReader(make([]byte, 11)), 10)
		if !belay.IsCode(err, belay.CodeTooLarge) {
			t.Errorf("PutSource past the cap: %v, want too_large", err)
		}
		if got, _ := mustOpenSource(t, s, "run_big"); string(got) != "kept" {
			t.Errorf("a refused put changed the bundle to %q", got)
		}
		if _, err := s.PutSource(t.Context(), "run_none", bytes.NewReader(make([]byte, 11)), 10); !belay.IsCode(err, belay.CodeTooLarge) {
			t.Errorf("PutSource past the cap on a new run: %v, want too_large", err)
		}
		if _, _, err := s.OpenSource(t.Context(), "run_none"); !belay.IsCode(err, belay.CodeNotFound) {
			t.Errorf("a refused put stored something: OpenSource = %v", err)
		}
	})
	t.Run("missing_and_bad_ids", func(t *testing.T) {
		s := open(t)
		if _, _, err := s.OpenSource(t.Context(), "run_missing"); !belay.IsCode(err, belay.CodeNotFound) {
			t.Errorf("OpenSource(missing) = %v, want not_found", err)
		}
		for _, id := range []string{"", "../x", "a/b", "run.1"} {
			if _, err := s.PutSource(t.Context(), id, bytes.NewReader(nil), 10); !belay.IsCode(err, belay.CodeInvalid) {
				t.Errorf("PutSource(%q) = %v, want invalid", id, err)
			}
			if _, _, err := s.OpenSource(t.Context(), id); !belay.IsCode(err, belay.CodeInvalid) {
				t.Errorf("OpenSource(%q) = %v, want invalid", id, err)
			}
		}
	})
}

func mustOpenSource(tb testing.TB, s belay.SourceStore, runID string) ([]byte, int64) {
	tb.Helper()
	rc, size, err := s.OpenSource(tb.Context(), runID)
	if err != nil {
		tb.Fatalf("OpenSource(%s): %v", runID, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		tb.Fatalf("read source of %s: %v", runID, err)
	}
	return b, size
}
