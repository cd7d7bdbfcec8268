// Package artifacttest is the conformance suite for belay.ArtifactStore. The
// embedded folder adapter (internal/localdir) and the S3 adapter
// (internal/s3) both call Run from their tests, so an artifact written on one
// machine or on AWS reads back, lists and fails the same way.
//
// The contract it holds adapters to:
//   - a run id is 1–128 characters of [A-Za-z0-9_-]; anything else (such as
//     "../" or "/") is invalid, for every call;
//   - a name is 1–128 characters of [A-Za-z0-9._-] that does not start with
//     "."; anything else (such as "../x", "a/b", ".hidden" or a NUL) is
//     invalid, for every call;
//   - content is opaque bytes, empty allowed, at most belay.MaxArtifactBytes;
//     more is too_large and stores nothing (an earlier artifact of that name
//     stays as it was);
//   - a put replaces the whole artifact atomically: a reader sees the old or
//     the new content, never a mix;
//   - GetArtifact of a missing artifact is not_found; ListArtifacts of a run
//     with none is an empty list, not an error, sorted by name with sizes;
//   - DeleteArtifact removes one artifact and nothing else, and succeeds for
//     one that does not exist.
//
// The suite never sleeps and asserts only what a caller of the port would
// notice.
package artifacttest

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

// Run runs the whole suite. open returns a fresh, empty store; it registers
// its own cleanup with tb.Cleanup.
func Run(t *testing.T, open func(tb testing.TB) belay.ArtifactStore) {
	t.Run("round_trip", func(t *testing.T) { testRoundTrip(t, open(t)) })
	t.Run("replace", func(t *testing.T) { testReplace(t, open(t)) })
	t.Run("list", func(t *testing.T) { testList(t, open(t)) })
	t.Run("missing", func(t *testing.T) { testMissing(t, open(t)) })
	t.Run("bad_names", func(t *testing.T) { testBadNames(t, open(t)) })
	t.Run("bad_run_ids", func(t *testing.T) { testBadRunIDs(t, open(t)) })
	t.Run("too_large", func(t *testing.T) { testTooLarge(t, open(t)) })
	t.Run("isolation", func(t *testing.T) { testIsolation(t, open(t)) })
	t.Run("concurrent_puts", func(t *testing.T) { testConcurrentPuts(t, open(t)) })
	t.Run("concurrent_replace", func(t *testing.T) { testConcurrentReplace(t, open(t)) })
	t.Run("delete", func(t *testing.T) { testDelete(t, open(t)) })
}

func testDelete(t *testing.T, s belay.ArtifactStore) {
	const run = "run_delete"
	MustPut(t, s, run, "checkpoint-1.json", binaryContent(300, 3))
	MustPut(t, s, run, "checkpoint-2.json", binaryContent(200, 4))
	MustPut(t, s, "run_delete_other", "checkpoint-1.json", []byte("other"))
	if err := s.DeleteArtifact(t.Context(), run, "checkpoint-1.json"); err != nil {
		t.Fatalf("DeleteArtifact: %v", err)
	}
	_, err := s.GetArtifact(t.Context(), run, "checkpoint-1.json")
	wantCode(t, "GetArtifact after DeleteArtifact", err, belay.CodeNotFound)
	wantList(t, s, run, []belay.ArtifactInfo{{Name: "checkpoint-2.json", Size: 200}})
	if got := MustGet(t, s, "run_delete_other", "checkpoint-1.json"); string(got) != "other" {
		t.Fatalf("another run's artifact of the same name reads %q after the delete", got)
	}
	for _, tt := range []struct{ run, name string }{{run, "checkpoint-1.json"}, {run, "never.json"}, {"run_never_seen", "x"}} {
		if err := s.DeleteArtifact(t.Context(), tt.run, tt.name); err != nil {
			t.Fatalf("DeleteArtifact(%q, %q) of nothing = %v, want success", tt.run, tt.name, err)
		}
	}
	for _, bad := range []struct{ run, name string }{{run, "../x"}, {run, ""}, {"../", "x"}, {run, ".hidden"}} {
		err := s.DeleteArtifact(t.Context(), bad.run, bad.name)
		wantCode(t, fmt.Sprintf("DeleteArtifact(%q, %q)", bad.run, bad.name), err, belay.CodeInvalid)
	}
	wantList(t, s, run, []belay.ArtifactInfo{{Name: "checkpoint-2.json", Size: 200}})
}

// binaryContent returns n bytes cycling through every byte value, so NULs,
// invalid UTF-8, CR/LF and high bytes all travel.
func binaryContent(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i) + seed
	}
	return b
}

// MustPut stores content and fails the test on error.
func MustPut(tb testing.TB, s belay.ArtifactStore, runID, name string, content []byte) {
	tb.Helper()
	if err := s.PutArtifact(tb.Context(), runID, name, content); err != nil {
		tb.Fatalf("PutArtifact(%q, %q, %d bytes): %v", runID, name, len(content), err)
	}
}

// MustGet returns the content and fails the test on error.
func MustGet(tb testing.TB, s belay.ArtifactStore, runID, name string) []byte {
	tb.Helper()
	got, err := s.GetArtifact(tb.Context(), runID, name)
	if err != nil {
		tb.Fatalf("GetArtifact(%q, %q): %v", runID, name, err)
	}
	return got
}

// MustList returns the run's artifacts and fails the test on error.
func MustList(tb testing.TB, s belay.ArtifactStore, runID string) []belay.ArtifactInfo {
	tb.Helper()
	got, err := s.ListArtifacts(tb.Context(), runID)
	if err != nil {
		tb.Fatalf("ListArtifacts(%q): %v", runID, err)
	}
	return got
}

func wantCode(tb testing.TB, what string, err error, code belay.Code) {
	tb.Helper()
	if got := belay.ErrorCode(err); got != code {
		tb.Fatalf("%s: error %v (code %q), want code %q", what, err, got, code)
	}
}

func wantList(tb testing.TB, s belay.ArtifactStore, runID string, want []belay.ArtifactInfo) {
	tb.Helper()
	got := MustList(tb, s, runID)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		tb.Fatalf("ListArtifacts(%q) = %v, want %v", runID, got, want)
	}
}

func testRoundTrip(t *testing.T, s belay.ArtifactStore) {
	const run = "run_roundtrip"
	tests := []struct {
		name    string
		content []byte
	}{
		{"result.json", []byte(`{"version":1,"runId":"run_roundtrip"}`)},
		{"patch.diff", []byte("--- a/calc.py\r\n+++ b/calc.py\n\x00\xff\xfe")},
		{"transcript.jsonl", binaryContent(70_000, 7)},
		{"empty.bin", []byte{}},
		{"every-byte", binaryContent(256, 0)},
		{"A_z-0.9", []byte("x")},
		{strings.Repeat("n", 128), []byte("longest name allowed")},
	}
	for _, tt := range tests {
		t.Run(tt.name[:min(len(tt.name), 20)], func(t *testing.T) {
			MustPut(t, s, run, tt.name, tt.content)
			got := MustGet(t, s, run, tt.name)
			if !bytes.Equal(got, tt.content) {
				t.Fatalf("GetArtifact returned %d bytes differing from the %d put", len(got), len(tt.content))
			}
		})
	}
}

func testReplace(t *testing.T, s belay.ArtifactStore) {
	const run, name = "run_replace", "patch.diff"
	first := binaryContent(5000, 1)
	second := []byte("shorter")
	MustPut(t, s, run, name, first)
	MustPut(t, s, run, name, second)
	if got := MustGet(t, s, run, name); !bytes.Equal(got, second) {
		t.Fatalf("after replace GetArtifact = %q, want %q", got, second)
	}
	wantList(t, s, run, []belay.ArtifactInfo{{Name: name, Size: int64(len(second))}})
}

func testList(t *testing.T, s belay.ArtifactStore) {
	const run = "run_list"
	wantList(t, s, run, nil)
	got, err := s.ListArtifacts(t.Context(), "run_never_seen")
	if err != nil {
		t.Fatalf("ListArtifacts of an unknown run: %v, want an empty list", err)
	}
	if len(got) != 0 {
		t.Fatalf("ListArtifacts of an unknown run = %v, want empty", got)
	}

	puts := []belay.ArtifactInfo{
		{Name: "transcript.jsonl", Size: 300},
		{Name: "A.txt", Size: 1},
		{Name: "result.json", Size: 0},
		{Name: "patch.diff", Size: 4097},
		{Name: "b-2", Size: 2},
		{Name: "b-10", Size: 10},
	}
	for i, p := range puts {
		MustPut(t, s, run, p.Name, binaryContent(int(p.Size), byte(i)))
	}
	want := slices.Clone(puts)
	slices.SortFunc(want, func(a, b belay.ArtifactInfo) int { return strings.Compare(a.Name, b.Name) })
	wantList(t, s, run, want)
}

func testMissing(t *testing.T, s belay.ArtifactStore) {
	MustPut(t, s, "run_missing", "result.json", []byte("{}"))
	tests := []struct{ run, name string }{
		{"run_missing", "patch.diff"},
		{"run_missing", "result.jso"},
		{"run_other", "result.json"},
	}
	for _, tt := range tests {
		_, err := s.GetArtifact(t.Context(), tt.run, tt.name)
		wantCode(t, fmt.Sprintf("GetArtifact(%q, %q)", tt.run, tt.name), err, belay.CodeNotFound)
	}
}

func testBadNames(t *testing.T, s belay.ArtifactStore) {
	const run = "run_badnames"
	bad := []string{
		"",
		"../x",
		"..",
		".",
		"a/b",
		"/abs",
		`a\b`,
		".hidden",
		"nul\x00byte",
		"new\nline",
		"sp ace",
		"colon:x",
		"é.txt",
		strings.Repeat("n", 129),
	}
	for _, name := range bad {
		err := s.PutArtifact(t.Context(), run, name, []byte("x"))
		wantCode(t, fmt.Sprintf("PutArtifact(name %q)", name), err, belay.CodeInvalid)
		_, err = s.GetArtifact(t.Context(), run, name)
		wantCode(t, fmt.Sprintf("GetArtifact(name %q)", name), err, belay.CodeInvalid)
	}
	wantList(t, s, run, nil)
	// "../x" under a sibling run must not have reached run_x either.
	wantList(t, s, "x", nil)
}

func testBadRunIDs(t *testing.T, s belay.ArtifactStore) {
	bad := []string{"", "../", "..", ".", "/", "a/b", "/run", `run\x`, "run\x00", "run id", strings.Repeat("r", 129)}
	for _, run := range bad {
		err := s.PutArtifact(t.Context(), run, "result.json", []byte("{}"))
		wantCode(t, fmt.Sprintf("PutArtifact(run %q)", run), err, belay.CodeInvalid)
		_, err = s.GetArtifact(t.Context(), run, "result.json")
		wantCode(t, fmt.Sprintf("GetArtifact(run %q)", run), err, belay.CodeInvalid)
		_, err = s.ListArtifacts(t.Context(), run)
		wantCode(t, fmt.Sprintf("ListArtifacts(run %q)", run), err, belay.CodeInvalid)
	}
	// The longest allowed run id works.
	long := strings.Repeat("r", 128)
	MustPut(t, s, long, "result.json", []byte("{}"))
	wantList(t, s, long, []belay.ArtifactInfo{{Name: "result.json", Size: 2}})
}

func testTooLarge(t *testing.T, s belay.ArtifactStore) {
	const run = "run_toolarge"
	err := s.PutArtifact(t.Context(), run, "transcript.jsonl", make([]byte, belay.MaxArtifactBytes+1))
	wantCode(t, "PutArtifact over the cap", err, belay.CodeTooLarge)
	_, err = s.GetArtifact(t.Context(), run, "transcript.jsonl")
	wantCode(t, "GetArtifact after a refused put", err, belay.CodeNotFound)
	wantList(t, s, run, nil)

	// A refused replacement leaves the earlier artifact as it was.
	old := []byte("kept")
	MustPut(t, s, run, "patch.diff", old)
	err = s.PutArtifact(t.Context(), run, "patch.diff", make([]byte, belay.MaxArtifactBytes+1))
	wantCode(t, "PutArtifact replacing over the cap", err, belay.CodeTooLarge)
	if got := MustGet(t, s, run, "patch.diff"); !bytes.Equal(got, old) {
		t.Fatalf("refused replacement changed the artifact to %d bytes", len(got))
	}

	// Exactly the cap is allowed.
	full := binaryContent(belay.MaxArtifactBytes, 3)
	MustPut(t, s, run, "full.bin", full)
	if got := MustGet(t, s, run, "full.bin"); !bytes.Equal(got, full) {
		t.Fatalf("artifact of exactly MaxArtifactBytes read back as %d differing bytes", len(got))
	}
}

func testIsolation(t *testing.T, s belay.ArtifactStore) {
	// run_1 is a string prefix of run_10: a store keying by prefix must
	// still keep them apart.
	runs := []string{"run_1", "run_10", "run-1"}
	for i, run := range runs {
		MustPut(t, s, run, "result.json", []byte(run))
		if i == 0 {
			MustPut(t, s, run, "patch.diff", []byte("only in run_1"))
		}
	}
	for _, run := range runs {
		if got := MustGet(t, s, run, "result.json"); string(got) != run {
			t.Fatalf("GetArtifact(%q, result.json) = %q, want %q", run, got, run)
		}
	}
	wantList(t, s, "run_1", []belay.ArtifactInfo{{Name: "patch.diff", Size: 13}, {Name: "result.json", Size: 5}})
	wantList(t, s, "run_10", []belay.ArtifactInfo{{Name: "result.json", Size: 6}})
	_, err := s.GetArtifact(t.Context(), "run_10", "patch.diff")
	wantCode(t, "GetArtifact of another run's artifact", err, belay.CodeNotFound)
}

func testConcurrentPuts(t *testing.T, s belay.ArtifactStore) {
	const run, n = "run_concurrent", 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = s.PutArtifact(t.Context(), run, fmt.Sprintf("part-%02d", i), binaryContent(1000+i, byte(i)))
		})
	}
	wg.Wait()
	var want []belay.ArtifactInfo
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent PutArtifact %d: %v", i, err)
		}
		want = append(want, belay.ArtifactInfo{Name: fmt.Sprintf("part-%02d", i), Size: int64(1000 + i)})
	}
	wantList(t, s, run, want)
	for i := range n {
		if got := MustGet(t, s, run, fmt.Sprintf("part-%02d", i)); !bytes.Equal(got, binaryContent(1000+i, byte(i))) {
			t.Fatalf("part-%02d read back wrong after concurrent puts", i)
		}
	}
}

func testConcurrentReplace(t *testing.T, s belay.ArtifactStore) {
	const run, name, n = "run_replace_race", "transcript.jsonl", 8
	contents := make([][]byte, n)
	for i := range contents {
		contents[i] = bytes.Repeat([]byte{byte('a' + i)}, 64<<10+i)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = s.PutArtifact(t.Context(), run, name, contents[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent PutArtifact %d: %v", i, err)
		}
	}
	got := MustGet(t, s, run, name)
	i := slices.IndexFunc(contents, func(c []byte) bool { return bytes.Equal(c, got) })
	if i < 0 {
		t.Fatalf("after concurrent replaces the artifact is %d bytes matching none of the puts (torn write)", len(got))
	}
	wantList(t, s, run, []belay.ArtifactInfo{{Name: name, Size: int64(len(contents[i]))}})
}
