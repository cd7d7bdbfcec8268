package belay_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
)

// fuzzLimits are small enough that the fuzzer reaches every size limit with
// short inputs; the rules are the same as with the reference numbers.
func fuzzLimits() belay.Limits {
	lim := belay.DefaultLimits("m")
	lim.AllowedChecks = append(lim.AllowedChecks, []string{"go", "test", "./..."})
	lim.MaxInstructionChars = 64
	lim.MaxFiles = 4
	lim.MaxFileBytes = 64
	lim.MaxTreeBytes = 128
	lim.MaxBodyBytes = 1024
	lim.MaxSteps = 5
	lim.DefaultMaxSteps = 3
	lim.MaxWallTimeSeconds = 50
	lim.DefaultWallTimeSeconds = 30
	return lim
}

// FuzzParseRunRequest holds ParseRunRequest to its contract on any input:
// it never panics; it refuses with invalid or too_large and a bounded
// message; and whatever it accepts obeys every limit and path rule and is a
// fixed point, both of Validate and of a JSON round trip.
func FuzzParseRunRequest(f *testing.F) {
	lim := fuzzLimits()
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := belay.ParseRunRequest(body, lim)
		if err != nil {
			var e *belay.Error
			if !errors.As(err, &e) || (e.Code != belay.CodeInvalid && e.Code != belay.CodeTooLarge) {
				t.Fatalf("refusal %v (%T) is not invalid or too_large", err, err)
			}
			if len(err.Error()) > 2048 {
				t.Fatalf("message of %d bytes: %.200s...", len(err.Error()), err)
			}
			return
		}
		checkAccepted(t, lim, len(body), req)

		again, err := lim.Validate(req)
		if err != nil {
			t.Fatalf("Validate(canonical): %v", err)
		}
		if !reflect.DeepEqual(again, req) {
			t.Fatalf("Validate(canonical) changed it:\n got %#v\nwant %#v", again, req)
		}
		canon, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("marshal canonical: %v", err)
		}
		// HTML escaping can make the canonical JSON longer than the body.
		if len(canon) <= lim.MaxBodyBytes {
			reparsed, err := belay.ParseRunRequest(canon, lim)
			if err != nil {
				t.Fatalf("ParseRunRequest(json(canonical)): %v\n%s", err, canon)
			}
			if !reflect.DeepEqual(reparsed, req) || belay.RequestHash(reparsed) != belay.RequestHash(req) {
				t.Fatalf("JSON round trip changed the request:\n got %#v\nwant %#v", reparsed, req)
			}
		}
	})
}

// checkAccepted asserts the rules every accepted request obeys, stated
// independently of the validator's own code.
func checkAccepted(tb testing.TB, lim belay.Limits, bodyLen int, req belay.RunRequest) {
	tb.Helper()
	if bodyLen > lim.MaxBodyBytes {
		tb.Fatalf("accepted a body of %d bytes", bodyLen)
	}
	if strings.TrimSpace(req.Instruction) == "" || strings.ContainsRune(req.Instruction, 0) ||
		!utf8.ValidString(req.Instruction) || utf8.RuneCountInString(req.Instruction) > lim.MaxInstructionChars {
		tb.Fatalf("accepted instruction %q", req.Instruction)
	}
	if req.Model != lim.Model {
		tb.Fatalf("accepted model %q", req.Model)
	}
	if len(req.Files) < 1 || len(req.Files) > lim.MaxFiles {
		tb.Fatalf("accepted %d files", len(req.Files))
	}
	total := 0
	paths := make(map[string]bool)
	for _, f := range req.Files {
		if err := belay.CheckPath(f.Path); err != nil || !lim.ExtensionAllowed(f.Path) {
			tb.Fatalf("accepted path %q: %v", f.Path, err)
		}
		for _, seg := range strings.Split(f.Path, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.EqualFold(seg, ".git") {
				tb.Fatalf("accepted path %q with segment %q", f.Path, seg)
			}
		}
		if strings.HasPrefix(f.Path, "/") || strings.ContainsAny(f.Path, "\\\x00") {
			tb.Fatalf("accepted path %q", f.Path)
		}
		if paths[f.Path] {
			tb.Fatalf("accepted duplicate path %q", f.Path)
		}
		paths[f.Path] = true
		if len(f.Content) > lim.MaxFileBytes || !utf8.ValidString(f.Content) || strings.ContainsRune(f.Content, 0) {
			tb.Fatalf("accepted content of %d bytes for %q", len(f.Content), f.Path)
		}
		total += len(f.Content)
	}
	if total > lim.MaxTreeBytes {
		tb.Fatalf("accepted a tree of %d bytes", total)
	}
	for p := range paths {
		for dir := p; strings.Contains(dir, "/"); {
			dir = dir[:strings.LastIndex(dir, "/")]
			if paths[dir] {
				tb.Fatalf("accepted %q as both a file and a directory", dir)
			}
		}
	}
	if len(req.AllowedPaths) == 0 {
		tb.Fatal("accepted no allowedPaths")
	}
	for _, a := range req.AllowedPaths {
		bound := false
		for p := range paths {
			bound = bound || belay.PathAllowed([]string{a}, p)
		}
		if !bound || strings.ContainsAny(strings.TrimSuffix(a, "/**"), "*?[") {
			tb.Fatalf("accepted allowedPaths entry %q that binds to no uploaded file exactly", a)
		}
	}
	if len(req.Checks) < 1 || len(req.Checks) > lim.MaxChecks {
		tb.Fatalf("accepted %d checks", len(req.Checks))
	}
	for _, c := range req.Checks {
		if !slices.ContainsFunc(lim.AllowedChecks, func(a []string) bool { return slices.Equal(a, c) }) {
			tb.Fatalf("accepted check %q", c)
		}
	}
	if req.MaxSteps < 1 || req.MaxSteps > lim.MaxSteps || req.WallTimeSeconds < 1 || req.WallTimeSeconds > lim.MaxWallTimeSeconds {
		tb.Fatalf("accepted maxSteps %d wallTimeSeconds %d", req.MaxSteps, req.WallTimeSeconds)
	}
	a := req.Approval
	if !a.Policy.Valid() || a.TimeoutSeconds < 1 || a.TimeoutSeconds > lim.MaxApprovalTimeoutSeconds {
		tb.Fatalf("accepted approval %#v", a)
	}
	for _, name := range a.Allow {
		if !slices.Contains(belay.AgentToolNames(), name) {
			tb.Fatalf("accepted tool %q in approval.allow", name)
		}
	}
}

// TestFuzzSeeds keeps the seed corpus meaningful: seeds named valid* are
// accepted and every other seed is a near miss that is refused.
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParseRunRequest")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read seed corpus: %v", err)
	}
	if len(entries) < 5 {
		t.Fatalf("seed corpus has %d files, want at least 5", len(entries))
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			header, value, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
			quoted, ok := strings.CutPrefix(value, "[]byte(")
			quoted, ok2 := strings.CutSuffix(quoted, ")")
			body, err := strconv.Unquote(quoted)
			if header != "go test fuzz v1" || !ok || !ok2 || err != nil {
				t.Fatalf("not a go test fuzz v1 []byte seed: %q", data)
			}
			_, err = belay.ParseRunRequest([]byte(body), fuzzLimits())
			if want := strings.HasPrefix(e.Name(), "valid"); (err == nil) != want {
				t.Fatalf("accepted = %v, want %v (%v)", err == nil, want, err)
			}
		})
	}
}
