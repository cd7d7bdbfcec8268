package belay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Caps on what a sandbox may report. They bound what the control plane
// parses and stores from an untrusted source; MaxArtifactBytes caps the
// patch and the transcript.
const (
	// MaxResultJSONBytes caps result.json.
	MaxResultJSONBytes = 1 << 20
	// MaxOutputTailBytes caps one check's outputTail.
	MaxOutputTailBytes = 16 << 10
	// MaxSummaryBytes caps the agent's summary.
	MaxSummaryBytes = 8 << 10
	// MaxResultReasonBytes caps the bundle's reason, which becomes the run's
	// reason and is shown to people as one line.
	MaxResultReasonBytes = 1 << 10
)

// The artifact names ValidateResult reads.
const (
	resultFile     = "result.json"
	patchFile      = "patch.diff"
	transcriptFile = "transcript.jsonl"
)

// ValidateResult decides whether a sandbox's output can be believed. The
// control plane, not the sandbox, decides a run's outcome, so everything in
// files is treated as hostile: files holds what the sandbox uploaded
// (result.json, patch.diff, transcript.jsonl; other names are ignored).
//
// result.json must be present, at most MaxResultJSONBytes, and exactly one
// JSON object of the ResultBundle shape: names matched exactly (not
// case-insensitively), no unknown or repeated name at any level. Then:
//   - version is ResultBundleVersion and runId is runID;
//   - status is completed or failed; completed means exitCode 0 and every
//     check exited 0; failed means a non-zero exitCode and a reason, which
//     is a failing check or an agent that did not finish (max_steps,
//     budget_exhausted, ...) even though its checks pass;
//   - checks lists exactly req.Checks: same count, same order, each argv
//     equal element-wise; outputTail at most MaxOutputTailBytes;
//   - changedFiles holds each path once, each a clean relative path
//     (CheckPath) inside req.AllowedPaths (PathAllowed);
//   - patch.diff (absent means empty) is at most MaxArtifactBytes and is a
//     git diff whose touched paths (both sides of each file header, renames
//     and copies included, and the ---/+++ names) are all clean and allowed
//     and equal changedFiles as a set; it may only create regular files
//     (mode 100644 or 100755), never a symlink or a submodule;
//   - transcript.jsonl is at most MaxArtifactBytes; summary at most
//     MaxSummaryBytes; reason at most MaxResultReasonBytes, one line without
//     control characters;
//   - baseCommit and headCommit are hex object names (40 or 64 digits).
//
// It returns the decoded bundle, or an *Error with code invalid whose Field
// names the file and whose message names what was wrong. Messages quote at
// most a (truncated) path, never file content.
func ValidateResult(runID string, req RunRequest, files map[string][]byte) (ResultBundle, error) {
	raw, ok := files[resultFile]
	if !ok {
		return ResultBundle{}, resultErrorf(resultFile, "is missing; the sandbox wrote no result")
	}
	if len(raw) > MaxResultJSONBytes {
		return ResultBundle{}, resultErrorf(resultFile, "is %d bytes; at most %d bytes are allowed", len(raw), MaxResultJSONBytes)
	}
	b, err := decodeBundle(raw)
	if err != nil {
		return ResultBundle{}, err
	}
	if err := checkBundle(runID, req, b); err != nil {
		return ResultBundle{}, err
	}
	if n := len(files[transcriptFile]); n > MaxArtifactBytes {
		return ResultBundle{}, resultErrorf(transcriptFile, "is %d bytes; at most %d bytes are allowed", n, MaxArtifactBytes)
	}
	patch := files[patchFile]
	if len(patch) > MaxArtifactBytes {
		return ResultBundle{}, resultErrorf(patchFile, "is %d bytes; at most %d bytes are allowed", len(patch), MaxArtifactBytes)
	}
	touched, err := patchPaths(patch)
	if err != nil {
		return ResultBundle{}, err
	}
	listed := make(map[string]bool, len(b.ChangedFiles))
	for _, p := range b.ChangedFiles {
		listed[p] = true
	}
	for _, p := range touched.order {
		if err := checkChangedPath(req.AllowedPaths, p); err != nil {
			return ResultBundle{}, resultErrorf(patchFile, "%v", err)
		}
		if !listed[p] {
			return ResultBundle{}, resultErrorf(patchFile, "changes %s, which changedFiles does not list", quote(p))
		}
	}
	for _, p := range b.ChangedFiles {
		if !touched.set[p] {
			return ResultBundle{}, resultErrorf(resultFile, "changedFiles lists %s, which patch.diff does not change", quote(p))
		}
	}
	return b, nil
}

func resultErrorf(file, format string, args ...any) *Error {
	return FieldErrorf(CodeInvalid, file, format, args...)
}

// checkBundle holds a decoded bundle to the run it claims to be about.
func checkBundle(runID string, req RunRequest, b ResultBundle) error {
	switch {
	case b.Version != ResultBundleVersion:
		return resultErrorf(resultFile, "version is %d; this control plane reads version %d", b.Version, ResultBundleVersion)
	case b.RunID != runID:
		return resultErrorf(resultFile, "runId is not this run's id")
	case b.Status != StatusCompleted && b.Status != StatusFailed:
		return resultErrorf(resultFile, "status is %s; a sandbox reports completed or failed", quote(string(b.Status)))
	}

	if len(b.Checks) != len(req.Checks) {
		return resultErrorf(resultFile, "checks has %d entries; the run asked for %d checks", len(b.Checks), len(req.Checks))
	}
	failing := -1
	for i, c := range b.Checks {
		switch {
		case !slices.Equal(c.Argv, req.Checks[i]):
			return resultErrorf(resultFile, "checks[%d].argv is %s; the run asked for %s", i, quoteArgv(c.Argv), quoteArgv(req.Checks[i]))
		case len(c.OutputTail) > MaxOutputTailBytes:
			return resultErrorf(resultFile, "checks[%d].outputTail is %d bytes; at most %d bytes are allowed", i, len(c.OutputTail), MaxOutputTailBytes)
		case c.DurationMs < 0:
			return resultErrorf(resultFile, "checks[%d].durationMs is negative", i)
		}
		if c.ExitCode != 0 && failing < 0 {
			failing = i
		}
	}
	switch b.Status {
	case StatusCompleted:
		if b.ExitCode != 0 {
			return resultErrorf(resultFile, "status is completed but exitCode is %d", b.ExitCode)
		}
		if failing >= 0 {
			return resultErrorf(resultFile, "status is completed but checks[%d] exited with code %d", failing, b.Checks[failing].ExitCode)
		}
	case StatusFailed:
		if b.ExitCode == 0 {
			return resultErrorf(resultFile, "status is failed but exitCode is 0")
		}
		if failing < 0 && strings.TrimSpace(b.Reason) == "" {
			return resultErrorf(resultFile, "status is failed with every check passing but gives no reason")
		}
	}

	switch {
	case len(b.Summary) > MaxSummaryBytes:
		return resultErrorf(resultFile, "summary is %d bytes; at most %d bytes are allowed", len(b.Summary), MaxSummaryBytes)
	case len(b.Reason) > MaxResultReasonBytes:
		return resultErrorf(resultFile, "reason is %d bytes; at most %d bytes are allowed", len(b.Reason), MaxResultReasonBytes)
	case strings.IndexFunc(b.Reason, unicode.IsControl) >= 0:
		return resultErrorf(resultFile, "reason contains a control character; it must be one line of text")
	case b.Usage.ModelRequests < 0 || b.Usage.PromptTokens < 0 || b.Usage.CompletionTokens < 0:
		return resultErrorf(resultFile, "usage has a negative count")
	case !isObjectName(b.BaseCommit):
		return resultErrorf(resultFile, "baseCommit is not a hex commit id (40 or 64 lowercase hex digits)")
	case !isObjectName(b.HeadCommit):
		return resultErrorf(resultFile, "headCommit is not a hex commit id (40 or 64 lowercase hex digits)")
	}

	seen := make(map[string]int, len(b.ChangedFiles))
	for i, p := range b.ChangedFiles {
		if err := checkChangedPath(req.AllowedPaths, p); err != nil {
			return resultErrorf(resultFile, "changedFiles[%d]: %v", i, err)
		}
		if j, ok := seen[p]; ok {
			return resultErrorf(resultFile, "changedFiles[%d] repeats changedFiles[%d]", i, j)
		}
		seen[p] = i
	}
	return nil
}

// checkChangedPath says why p may not be changed by the run, or nil.
func checkChangedPath(allowedPaths []string, p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if !PathAllowed(allowedPaths, p) {
		return fmt.Errorf("path %s is outside allowedPaths", quote(p))
	}
	return nil
}

// isObjectName reports whether s looks like a git object name: SHA-1 (40)
// or SHA-256 (64) lowercase hex digits.
func isObjectName(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// bundleNames is every JSON member name a result bundle may hold, at any
// level, spelled exactly. It is read from the struct tags so that it cannot
// drift from the types.
var bundleNames = jsonNames(reflect.TypeFor[ResultBundle](), reflect.TypeFor[CheckResult](), reflect.TypeFor[BundleUsage]())

func jsonNames(types ...reflect.Type) map[string]bool {
	names := make(map[string]bool)
	for _, t := range types {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			names[name] = true
		}
	}
	return names
}

// decodeBundle decodes result.json strictly. encoding/json alone matches
// names case-insensitively and keeps the last of repeated names, so a token
// pass first holds every name to its exact spelling and refuses repeats;
// the decoder then refuses unknown names at each level, nulls aside.
func decodeBundle(raw []byte) (ResultBundle, error) {
	if !utf8.Valid(raw) {
		return ResultBundle{}, resultErrorf(resultFile, "is not valid UTF-8")
	}
	if err := checkMemberNames(raw); err != nil {
		return ResultBundle{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var b ResultBundle
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return ResultBundle{}, resultErrorf(resultFile, "%s must be %s", te.Field, te.Type)
		}
		if strings.HasPrefix(err.Error(), "json: unknown field") {
			return ResultBundle{}, resultErrorf(resultFile, "has a member name where it does not belong (at byte %d)", dec.InputOffset())
		}
		// Other decoder messages can quote input, so they are not passed on.
		return ResultBundle{}, resultErrorf(resultFile, "is not a result bundle object (at byte %d)", dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		return ResultBundle{}, resultErrorf(resultFile, "has data after the JSON object")
	}
	return b, nil
}

// checkMemberNames walks raw token by token and refuses a member name that
// is not exactly one of bundleNames, or that repeats within its object.
func checkMemberNames(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var stack []map[string]bool // one set of seen names per open object, nil for arrays
	expectKey := func() bool { return len(stack) > 0 && stack[len(stack)-1] != nil }
	inKey := false // the next string token is a member name
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return resultErrorf(resultFile, "is not valid JSON (at byte %d)", dec.InputOffset())
		}
		// Inside an object Token alternates name and value; the
		// delimiters keep the rhythm, so track whether a name is due.
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, map[string]bool{})
				inKey = true
				continue
			case '[':
				stack = append(stack, nil)
				inKey = false
				continue
			default:
				stack = stack[:len(stack)-1]
				inKey = expectKey()
				continue
			}
		}
		if inKey {
			name, _ := tok.(string)
			if !bundleNames[name] {
				return resultErrorf(resultFile, "has the unknown member name %s", quote(name))
			}
			seen := stack[len(stack)-1]
			if seen[name] {
				return resultErrorf(resultFile, "has %s more than once", quote(name))
			}
			seen[name] = true
			inKey = false
			continue
		}
		// A scalar value: in an object the next token is a name again.
		inKey = expectKey()
	}
}

// pathSet is a set of paths that remembers the order they were added in, so
// that messages name the first offender.
type pathSet struct {
	set   map[string]bool
	order []string
}

// patchPaths returns the paths a git diff touches, each once, in the order
// met: both sides of every "diff --git" header, rename and copy sources and
// targets, and the names on ---/+++ lines (not /dev/null). It follows hunk
// line counts, so a removed line that reads "--- x" inside a hunk is
// content, not a header. It refuses anything that is not git diff output,
// and a file mode other than a regular file's.
func patchPaths(patch []byte) (pathSet, error) {
	paths := pathSet{set: make(map[string]bool)}
	add := func(p string) {
		if !paths.set[p] {
			paths.set[p] = true
			paths.order = append(paths.order, p)
		}
	}
	bad := func(line int, format string, args ...any) error {
		return resultErrorf(patchFile, "line %d: "+format, append([]any{line}, args...)...)
	}

	sc := bufio.NewScanner(bytes.NewReader(patch))
	sc.Buffer(make([]byte, 0, 64<<10), MaxArtifactBytes+1)
	const (
		before    = iota // no file section yet
		header           // extended header lines of a file section
		hunk             // inside a hunk, counting lines
		afterHunk        // a hunk just ended: another hunk or file follows
		binary           // a "GIT binary patch" body
	)
	state := before
	var oldLeft, newLeft int
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if state == hunk {
			if strings.HasPrefix(line, `\`) { // "\ No newline at end of file"
				continue
			}
			if oldLeft > 0 || newLeft > 0 {
				switch {
				case strings.HasPrefix(line, " ") || line == "":
					// git writes an empty context line as " ", some tools as "".
					oldLeft--
					newLeft--
				case strings.HasPrefix(line, "-"):
					oldLeft--
				case strings.HasPrefix(line, "+"):
					newLeft--
				default:
					return pathSet{}, bad(n, "a hunk ends before its line counts say")
				}
				if oldLeft < 0 || newLeft < 0 {
					return pathSet{}, bad(n, "a hunk has more lines than its header says")
				}
				continue
			}
			state = afterHunk
		}

		if rest, ok := strings.CutPrefix(line, "diff --git "); ok {
			a, b, err := parseDiffHeader(rest)
			if err != nil {
				return pathSet{}, bad(n, "%v", err)
			}
			add(a)
			add(b)
			state = header
			continue
		}
		switch state {
		case before:
			return pathSet{}, bad(n, "expected a \"diff --git\" line; the patch must be git diff output")
		case afterHunk:
			if !strings.HasPrefix(line, "@@ ") {
				return pathSet{}, bad(n, "is neither a hunk nor a \"diff --git\" line after a hunk")
			}
		case binary:
			continue
		}

		switch {
		case strings.HasPrefix(line, "@@ "):
			var err error
			if oldLeft, newLeft, err = parseHunkHeader(line); err != nil {
				return pathSet{}, bad(n, "%v", err)
			}
			state = hunk
		case strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "+++ "):
			name := strings.TrimSuffix(line[4:], "\t") // git adds a tab after a name with a space
			if name == "/dev/null" {
				continue
			}
			side := "a/"
			if line[0] == '+' {
				side = "b/"
			}
			p, err := unquoteDiffPath(name)
			if err != nil {
				return pathSet{}, bad(n, "%v", err)
			}
			p, ok := strings.CutPrefix(p, side)
			if !ok {
				return pathSet{}, bad(n, "a %s name does not start with %s", line[:3], side)
			}
			add(p)
		case hasAnyPrefix(line, "rename from ", "rename to ", "copy from ", "copy to "):
			_, name, _ := strings.Cut(line, " ")
			_, name, _ = strings.Cut(name, " ")
			p, err := unquoteDiffPath(name)
			if err != nil {
				return pathSet{}, bad(n, "%v", err)
			}
			add(p)
		case hasAnyPrefix(line, "old mode ", "new mode ", "deleted file mode ", "new file mode "):
			mode := line[strings.LastIndexByte(line, ' ')+1:]
			if err := checkFileMode(mode); err != nil {
				return pathSet{}, bad(n, "%v", err)
			}
		case strings.HasPrefix(line, "index "):
			// "index abc..def" or "index abc..def 100644"
			if f := strings.Fields(line); len(f) == 3 {
				if err := checkFileMode(f[2]); err != nil {
					return pathSet{}, bad(n, "%v", err)
				}
			}
		case hasAnyPrefix(line, "similarity index ", "dissimilarity index "):
		case strings.HasPrefix(line, "Binary files ") && strings.HasSuffix(line, " differ"):
		case line == "GIT binary patch":
			state = binary
		default:
			return pathSet{}, bad(n, "is not a line of git diff output")
		}
	}
	if err := sc.Err(); err != nil {
		return pathSet{}, resultErrorf(patchFile, "cannot be read: %v", err)
	}
	if state == hunk && (oldLeft > 0 || newLeft > 0) {
		return pathSet{}, resultErrorf(patchFile, "ends inside a hunk")
	}
	return paths, nil
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// checkFileMode refuses every git file mode but a regular file's: a patch
// that makes a symlink (120000) could point an allowed path anywhere once
// applied, and a gitlink (160000) names another repository.
func checkFileMode(mode string) error {
	switch mode {
	case "100644", "100755":
		return nil
	case "120000":
		return errors.New("the patch makes a symbolic link; only regular files may be changed")
	case "160000":
		return errors.New("the patch changes a submodule; only regular files may be changed")
	}
	return fmt.Errorf("file mode %s is not a regular file's", quote(mode))
}

// parseDiffHeader splits the rest of a "diff --git " line into the two
// paths, without their a/ and b/ prefixes. Git quotes a name holding
// unusual bytes; an unquoted pair is split at " b/", and when that is
// ambiguous (a name holding " b/") only the same name on both sides is
// accepted.
func parseDiffHeader(rest string) (a, b string, err error) {
	switch {
	case strings.HasPrefix(rest, `"`):
		a, tail, err := cutQuoted(rest)
		if err != nil {
			return "", "", err
		}
		tail, ok := strings.CutPrefix(tail, " ")
		if !ok {
			return "", "", errors.New("a \"diff --git\" line names one path")
		}
		b, err := unquoteDiffPath(tail)
		if err != nil {
			return "", "", err
		}
		return stripSides(a, b)
	case strings.HasSuffix(rest, `"`):
		// Only the second name is quoted. A quoted name escapes its quotes,
		// so the last ` "` starts it.
		i := strings.LastIndex(rest, ` "`)
		if i < 0 {
			return "", "", errors.New("a quoted path has no opening quote")
		}
		b, err := unquoteDiffPath(rest[i+1:])
		if err != nil {
			return "", "", err
		}
		return stripSides(rest[:i], b)
	}
	var splits []int
	for i := 0; ; {
		j := strings.Index(rest[i:], " b/")
		if j < 0 {
			break
		}
		splits = append(splits, i+j)
		i += j + 1
	}
	switch len(splits) {
	case 0:
		return "", "", errors.New("a \"diff --git\" line does not name a/ and b/ paths")
	case 1:
		return stripSides(rest[:splits[0]], rest[splits[0]+1:])
	}
	for _, s := range splits {
		if a, b, err := stripSides(rest[:s], rest[s+1:]); err == nil && a == b {
			return a, b, nil
		}
	}
	return "", "", errors.New("a \"diff --git\" line has ambiguous paths")
}

// cutQuoted takes the quoted name that s starts with and returns it
// unquoted and the rest of s.
func cutQuoted(s string) (name, rest string, err error) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			name, err := unquoteDiffPath(s[:i+1])
			return name, s[i+1:], err
		}
	}
	return "", "", errors.New("a quoted path has no closing quote")
}

func stripSides(a, b string) (string, string, error) {
	a, okA := strings.CutPrefix(a, "a/")
	b, okB := strings.CutPrefix(b, "b/")
	if !okA || !okB {
		return "", "", errors.New("a \"diff --git\" line does not name a/ and b/ paths")
	}
	return a, b, nil
}

// unquoteDiffPath undoes git's C-style quoting of a name ("\t", "\"",
// "\\", octal bytes); an unquoted name is returned as is.
func unquoteDiffPath(s string) (string, error) {
	if !strings.HasPrefix(s, `"`) {
		return s, nil
	}
	p, err := strconv.Unquote(s)
	if err != nil {
		return "", errors.New("a quoted path is not valid")
	}
	return p, nil
}

// parseHunkHeader reads "@@ -l[,s] +l[,s] @@..." and returns the old and
// new line counts (a missing count is 1).
func parseHunkHeader(line string) (oldCount, newCount int, err error) {
	f := strings.Fields(line)
	if len(f) < 4 || f[3] != "@@" || !strings.HasPrefix(f[1], "-") || !strings.HasPrefix(f[2], "+") {
		return 0, 0, errors.New("a hunk header is malformed")
	}
	count := func(r string) (int, error) {
		start, n, ok := strings.Cut(r, ",")
		if _, err := strconv.ParseUint(start, 10, 31); err != nil {
			return 0, errors.New("a hunk header is malformed")
		}
		if !ok {
			return 1, nil
		}
		c, err := strconv.ParseUint(n, 10, 31)
		if err != nil {
			return 0, errors.New("a hunk header is malformed")
		}
		return int(c), nil
	}
	if oldCount, err = count(f[1][1:]); err != nil {
		return 0, 0, err
	}
	if newCount, err = count(f[2][1:]); err != nil {
		return 0, 0, err
	}
	return oldCount, newCount, nil
}
