package belay

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Path length bounds. They are not operator settings: they keep every
// accepted path writable on the Linux filesystems the sandbox uses
// (NAME_MAX is 255 bytes), so a long name is refused here with a clear
// message instead of failing inside the sandbox.
const (
	maxPathBytes    = 1024
	maxSegmentBytes = 255
)

// quoteMax bounds how much of a caller-supplied string an error message
// quotes, so a message stays readable whatever the input.
const quoteMax = 100

// globChars are the characters a caller would read as pattern syntax. An
// allowedPaths entry is a literal path (or a directory plus "/**"), so an
// entry with any of these is refused rather than silently taken literally.
const globChars = "*?[]{}"

// agentTools is the agent's tool set (DESIGN.md "The agent's tools"), the
// only names an approval allow list may hold.
var agentTools = []string{
	"list_files", "read_file", "write_file", "edit_file",
	"search", "run_check", "shell", "finish",
}

// AgentToolNames returns the names of the agent's tools, the only names an
// approval allow list may hold. It returns a fresh slice each call so that no
// caller can change the set for everyone.
func AgentToolNames() []string { return slices.Clone(agentTools) }

// ParseRunRequest decodes the body of POST /v1/runs strictly and validates it
// (see Limits.Validate), returning the canonical request. Strictness is the
// point: what belay accepts is exactly what it stores, hashes for
// idempotency and hands to the sandbox, so nothing is guessed.
//
// A body over lim.MaxBodyBytes is too_large. Everything else wrong is
// invalid, with the field named in JSON terms: a body that is not one JSON
// object (trailing data included), invalid UTF-8 or an escaped lone UTF-16
// surrogate anywhere, an unknown or repeated field at any level (names are
// matched exactly, not case-insensitively), null, or a value of the wrong
// JSON type. Numbers must be JSON integers: "12", 12.5 and 1e1 are refused.
//
// An absent maxSteps, wallTimeSeconds, model, approval, approval.policy or
// approval.timeoutSeconds takes the operator's default. A present one is
// checked as given: maxSteps 0 and "model": "" are invalid.
func ParseRunRequest(body []byte, lim Limits) (RunRequest, error) {
	if len(body) > lim.MaxBodyBytes {
		return RunRequest{}, Errorf(CodeTooLarge,
			"request body is %d bytes; at most %d bytes are allowed", len(body), lim.MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return RunRequest{}, Errorf(CodeInvalid,
			"request body is not valid UTF-8 (first bad byte at offset %d); send UTF-8 text", invalidUTF8Offset(body))
	}
	w, err := decodeWire(body)
	if err != nil {
		return RunRequest{}, err
	}
	// encoding/json turns an escaped lone surrogate into U+FFFD without a
	// word; that would silently change a caller's file, so refuse instead.
	if off := loneSurrogateOffset(body); off >= 0 {
		return RunRequest{}, Errorf(CodeInvalid,
			"request body has a \\u escape of a lone UTF-16 surrogate at byte %d; strings must be valid Unicode", off)
	}

	req := RunRequest{
		Files:           w.files,
		Source:          w.source,
		AllowedPaths:    w.allowedPaths,
		Checks:          w.checks,
		MaxSteps:        lim.DefaultMaxSteps,
		WallTimeSeconds: lim.DefaultWallTimeSeconds,
	}
	if w.instruction != nil {
		req.Instruction = *w.instruction
	}
	if w.model != nil {
		if err := lim.checkModel(*w.model); err != nil {
			return RunRequest{}, err
		}
		req.Model = *w.model
	}
	if w.maxSteps != nil {
		if err := checkRange("maxSteps", *w.maxSteps, 1, lim.MaxSteps); err != nil {
			return RunRequest{}, err
		}
		req.MaxSteps = *w.maxSteps
	}
	if w.wallTimeSeconds != nil {
		if err := checkRange("wallTimeSeconds", *w.wallTimeSeconds, 1, lim.MaxWallTimeSeconds); err != nil {
			return RunRequest{}, err
		}
		req.WallTimeSeconds = *w.wallTimeSeconds
	}
	if a := w.approval; a != nil {
		if a.policy != nil {
			if err := checkPolicy(ApprovalPolicy(*a.policy)); err != nil {
				return RunRequest{}, err
			}
			req.Approval.Policy = ApprovalPolicy(*a.policy)
		}
		req.Approval.Allow = a.allow
		if a.timeoutSeconds != nil {
			if err := checkRange("approval.timeoutSeconds", *a.timeoutSeconds, 1, lim.MaxApprovalTimeoutSeconds); err != nil {
				return RunRequest{}, err
			}
			req.Approval.TimeoutSeconds = *a.timeoutSeconds
		}
	}
	return lim.Validate(req)
}

// Validate checks req against every run-creation rule (DESIGN.md "Reference
// behaviour") and returns the canonical request: defaults filled in, the
// model set to the operator's, files, allowed paths and checks in the order
// given, and no slice shared with req. Validating a canonical request
// returns it unchanged.
//
// A Go struct cannot tell an absent field from a zero one, so here a zero
// Model, MaxSteps, WallTimeSeconds, Approval.Policy or Approval.TimeoutSeconds
// means "absent" and takes the default; ParseRunRequest refuses an explicit
// zero in a body before it gets here. An empty Approval.Allow becomes nil.
//
// Duplicates are refused, not removed: a repeated file path, allowedPaths
// entry, check or approval.allow name is invalid, so the canonical request
// is always what the caller wrote. So is approval.allow under deny_all or
// allow_all, where it would have no effect.
//
// Errors are *Error: too_large for a file over MaxFileBytes or a tree over
// MaxTreeBytes, invalid for everything else, with Field naming the field
// ("files[3].path", "checks[0]", "approval.policy"). Messages may quote a
// path or a check (truncated) but never the instruction or file content.
// A Limits without a Model is a configuration fault and yields an error
// without a code (internal).
func (l Limits) Validate(req RunRequest) (RunRequest, error) {
	if l.Model == "" {
		return RunRequest{}, errors.New("validate run request: the operator limits name no model")
	}
	if err := l.checkInstruction(req.Instruction); err != nil {
		return RunRequest{}, err
	}
	out := RunRequest{Instruction: req.Instruction, Model: req.Model}
	if out.Model == "" {
		out.Model = l.Model
	} else if err := l.checkModel(out.Model); err != nil {
		return RunRequest{}, err
	}

	if req.Source != nil {
		if len(req.Files) > 0 {
			return RunRequest{}, FieldErrorf(CodeInvalid, "source", "is given with files; give either files or a source")
		}
		src, err := l.checkSource(*req.Source)
		if err != nil {
			return RunRequest{}, err
		}
		out.Source = &src
		// The tree is not fetched yet: the entries' shape is checked here,
		// and what they name once it is (CheckAllowedPathsInTree).
		if out.AllowedPaths, err = checkAllowedPaths(req.AllowedPaths, nil); err != nil {
			return RunRequest{}, err
		}
	} else {
		files, err := l.checkFiles(req.Files)
		if err != nil {
			return RunRequest{}, err
		}
		out.Files = slices.Clone(req.Files)
		if out.AllowedPaths, err = checkAllowedPaths(req.AllowedPaths, &files); err != nil {
			return RunRequest{}, err
		}
	}
	if req.Trigger != nil {
		if err := CheckTrigger(*req.Trigger); err != nil {
			return RunRequest{}, err
		}
		t := *req.Trigger
		out.Trigger = &t
	}
	if req.Turn != nil {
		if err := CheckTurnContext(*req.Turn); err != nil {
			return RunRequest{}, err
		}
		t := *req.Turn
		t.Conversation = slices.Clone(t.Conversation)
		t.Skills = slices.Clone(t.Skills)
		out.Turn = &t
	}
	var err error
	if out.Checks, err = l.checkChecks(req.Checks); err != nil {
		return RunRequest{}, err
	}

	out.MaxSteps = cmp.Or(req.MaxSteps, l.DefaultMaxSteps)
	if err := checkRange("maxSteps", out.MaxSteps, 1, l.MaxSteps); err != nil {
		return RunRequest{}, err
	}
	out.WallTimeSeconds = cmp.Or(req.WallTimeSeconds, l.DefaultWallTimeSeconds)
	if err := checkRange("wallTimeSeconds", out.WallTimeSeconds, 1, l.MaxWallTimeSeconds); err != nil {
		return RunRequest{}, err
	}
	if out.Approval, err = l.checkApproval(req.Approval); err != nil {
		return RunRequest{}, err
	}
	return out, nil
}

// CheckPath reports whether p is a safe relative path inside a run's tree:
// non-empty, valid UTF-8, no NUL or other control character, no backslash,
// not absolute, and no empty, ".", ".." or ".git" segment (".git" in any
// case, because some filesystems fold case). The sandbox applies it to every
// write, so it states the path-shape rules once; it does not check the
// extension (see Limits.ExtensionAllowed). The error describes the problem
// in plain words and quotes p, truncated.
func CheckPath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case len(p) > maxPathBytes:
		return fmt.Errorf("path %s is %d bytes long; at most %d bytes are allowed", quote(p), len(p), maxPathBytes)
	case !utf8.ValidString(p):
		return fmt.Errorf("path %s is not valid UTF-8", quote(p))
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path %s contains a NUL byte", quote(p))
	case strings.IndexByte(p, '\\') >= 0:
		return fmt.Errorf("path %s contains a backslash; use / to separate directories", quote(p))
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %s is absolute; paths are relative to the root of the tree", quote(p))
	}
	if i := strings.IndexFunc(p, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(p[i:])
		return fmt.Errorf("path %s contains the control character %U", quote(p), r)
	}
	for seg := range strings.SplitSeq(p, "/") {
		switch {
		case seg == "":
			return fmt.Errorf("path %s has an empty segment (a // or a trailing /)", quote(p))
		case seg == ".":
			return fmt.Errorf("path %s has a \".\" segment; write the path without it", quote(p))
		case seg == "..":
			return fmt.Errorf("path %s has a \"..\" segment; paths may not leave the tree", quote(p))
		case strings.EqualFold(seg, ".git"):
			return fmt.Errorf("path %s has a .git segment; git metadata cannot be uploaded or changed", quote(p))
		case len(seg) > maxSegmentBytes:
			return fmt.Errorf("path %s has a segment of %d bytes; at most %d bytes are allowed", quote(p), len(seg), maxSegmentBytes)
		}
	}
	return nil
}

// ExtensionAllowed reports whether the file at p may be uploaded by its
// name: its extension is one of l.Extensions, or its whole base name is one
// of l.ExtensionlessNames. Both compare without regard to case (".PY" is
// Python too); the content is held to be text separately.
func (l Limits) ExtensionAllowed(p string) bool {
	base := path.Base(p)
	if ext := path.Ext(base); ext != "" {
		for _, e := range l.Extensions {
			if strings.EqualFold(ext, e) {
				return true
			}
		}
	}
	for _, n := range l.ExtensionlessNames {
		if strings.EqualFold(base, n) {
			return true
		}
	}
	return false
}

// RequestHash returns the hex SHA-256 of the canonical request's JSON. The
// idempotency check compares it: the same body, or any body with the same
// canonical form, gives the same hash. req should be canonical (the result
// of Validate or ParseRunRequest).
func RequestHash(req RunRequest) string {
	b, err := json.Marshal(req)
	if err != nil {
		// RunRequest holds only strings, ints and slices of them, which
		// always marshal; a failure means the type changed incompatibly.
		panic("belay: marshal run request for hashing: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (l Limits) checkInstruction(s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return FieldErrorf(CodeInvalid, "instruction", "is required and must not be blank; say what the agent should do")
	case !utf8.ValidString(s):
		return FieldErrorf(CodeInvalid, "instruction", "is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return FieldErrorf(CodeInvalid, "instruction", "contains a NUL character at byte %d; send plain text", strings.IndexByte(s, 0))
	}
	if n := utf8.RuneCountInString(s); n > l.MaxInstructionChars {
		return FieldErrorf(CodeInvalid, "instruction", "is %d characters long; at most %d characters are allowed", n, l.MaxInstructionChars)
	}
	return nil
}

func (l Limits) checkModel(m string) error {
	if m != l.Model {
		return FieldErrorf(CodeInvalid, "model", "%s is not available: this server runs %s; omit model to use it", quote(m), quote(l.Model))
	}
	return nil
}

// fileTree indexes a validated upload: each file path and each directory
// that holds a file, to the index of the first file that names it.
type fileTree struct {
	files map[string]int
	dirs  map[string]int
}

func (l Limits) checkFiles(files []File) (fileTree, error) {
	tree := fileTree{files: make(map[string]int, len(files)), dirs: make(map[string]int)}
	if len(files) == 0 || len(files) > l.MaxFiles {
		return tree, FieldErrorf(CodeInvalid, "files", "has %d files; send 1 to %d files", len(files), l.MaxFiles)
	}
	total := 0
	for i, f := range files {
		field := fmt.Sprintf("files[%d]", i)
		if err := CheckPath(f.Path); err != nil {
			return tree, FieldErrorf(CodeInvalid, field+".path", "%v", err)
		}
		if !l.ExtensionAllowed(f.Path) {
			return tree, FieldErrorf(CodeInvalid, field+".path",
				"%s does not have an allowed text extension; allowed are %s, and files named %s",
				quote(f.Path), strings.Join(l.Extensions, " "), strings.Join(l.ExtensionlessNames, ", "))
		}
		if j, ok := tree.files[f.Path]; ok {
			return tree, FieldErrorf(CodeInvalid, field+".path", "%s is already files[%d].path; give each file once", quote(f.Path), j)
		}
		if j, ok := tree.dirs[f.Path]; ok {
			return tree, FieldErrorf(CodeInvalid, field+".path",
				"%s is a directory of files[%d].path; a path cannot be both a file and a directory", quote(f.Path), j)
		}
		for k := range len(f.Path) {
			if f.Path[k] != '/' {
				continue
			}
			dir := f.Path[:k]
			if j, ok := tree.files[dir]; ok {
				return tree, FieldErrorf(CodeInvalid, field+".path",
					"%s lies under %s, which is files[%d].path; a path cannot be both a file and a directory", quote(f.Path), quote(dir), j)
			}
			if _, ok := tree.dirs[dir]; !ok {
				tree.dirs[dir] = i
			}
		}
		tree.files[f.Path] = i

		if len(f.Content) > l.MaxFileBytes {
			return tree, FieldErrorf(CodeTooLarge, field+".content",
				"is %d bytes; at most %d bytes are allowed per file", len(f.Content), l.MaxFileBytes)
		}
		if !utf8.ValidString(f.Content) {
			return tree, FieldErrorf(CodeInvalid, field+".content",
				"is not valid UTF-8 (first bad byte at offset %d); only text files can be uploaded", invalidUTF8Offset([]byte(f.Content)))
		}
		if k := strings.IndexByte(f.Content, 0); k >= 0 {
			return tree, FieldErrorf(CodeInvalid, field+".content",
				"contains a NUL character at byte %d; only text files can be uploaded", k)
		}
		total += len(f.Content)
	}
	if total > l.MaxTreeBytes {
		return tree, FieldErrorf(CodeTooLarge, "files", "total %d bytes of content; at most %d bytes are allowed in one tree", total, l.MaxTreeBytes)
	}
	return tree, nil
}

// checkSource checks a git source as a caller gives it: its URL by the
// operator's policy, its ref, and a commit when one is set.
func (l Limits) checkSource(src Source) (Source, error) {
	g := src.Git
	if g == nil {
		return Source{}, FieldErrorf(CodeInvalid, "source", `must hold "git": {"url", "ref"}`)
	}
	if err := CheckGitURL(g.URL, l.GitURLs); err != nil {
		return Source{}, err
	}
	if err := CheckGitRef(g.Ref); err != nil {
		return Source{}, err
	}
	if g.Commit != "" && !IsObjectName(g.Commit) {
		return Source{}, FieldErrorf(CodeInvalid, "source.git.commit", "%s is not a full commit id", quote(g.Commit))
	}
	out := *g
	if g.Tree != nil {
		t := *g.Tree
		out.Tree = &t
	}
	if g.Bundle != nil {
		b := *g.Bundle
		out.Bundle = &b
	}
	return Source{Git: &out}, nil
}

// CheckAllowedPathsInTree checks a git source's allowedPaths against the
// fetched commit's files (paths, each a clean relative path), as Validate
// checks them against uploaded files: each entry names a file, or a
// directory holding one when it ends in "/**". Returns invalid.
func CheckAllowedPathsInTree(entries, paths []string) error {
	tree := fileTree{files: make(map[string]int, len(paths)), dirs: make(map[string]int)}
	for i, p := range paths {
		tree.files[p] = i
		for k := range len(p) {
			if p[k] == '/' {
				if _, ok := tree.dirs[p[:k]]; !ok {
					tree.dirs[p[:k]] = i
				}
			}
		}
	}
	_, err := checkAllowedPaths(entries, &tree)
	return err
}

// checkAllowedPaths checks allowedPaths entries; with a tree, also that
// each names one of its files or directories.
func checkAllowedPaths(entries []string, tree *fileTree) ([]string, error) {
	if len(entries) == 0 {
		return nil, FieldErrorf(CodeInvalid, "allowedPaths",
			"is required: list the files, or directories followed by /**, that the agent may change")
	}
	seen := make(map[string]int, len(entries))
	for i, a := range entries {
		field := fmt.Sprintf("allowedPaths[%d]", i)
		if j, ok := seen[a]; ok {
			return nil, FieldErrorf(CodeInvalid, field, "%s is already allowedPaths[%d]; give each entry once", quote(a), j)
		}
		seen[a] = i
		if a == "**" || a == "/**" {
			return nil, FieldErrorf(CodeInvalid, field,
				"%s would allow every path; name uploaded files, or directories followed by /**", quote(a))
		}
		dir, subtree := strings.CutSuffix(a, "/**")
		if strings.ContainsAny(dir, globChars) {
			return nil, FieldErrorf(CodeInvalid, field,
				"%s has pattern characters (%s); an entry is an uploaded file's path, or a directory followed by /**", quote(a), globChars)
		}
		if err := CheckPath(dir); err != nil {
			return nil, FieldErrorf(CodeInvalid, field, "%v", err)
		}
		if tree == nil {
			continue
		}
		if subtree {
			if _, ok := tree.dirs[dir]; !ok {
				return nil, FieldErrorf(CodeInvalid, field, "%s matches no uploaded file: no file lies under %s", quote(a), quote(dir+"/"))
			}
			continue
		}
		if _, ok := tree.files[a]; !ok {
			if _, ok := tree.dirs[a]; ok {
				return nil, FieldErrorf(CodeInvalid, field, "%s is a directory; write %s to allow the files under it", quote(a), quote(a+"/**"))
			}
			return nil, FieldErrorf(CodeInvalid, field, "%s names no uploaded file; entries must name uploaded files or directories followed by /**", quote(a))
		}
	}
	return slices.Clone(entries), nil
}

func (l Limits) checkChecks(checks [][]string) ([][]string, error) {
	if len(checks) == 0 || len(checks) > l.MaxChecks {
		return nil, FieldErrorf(CodeInvalid, "checks", "has %d checks; send 1 to %d checks, each an argv array equal to one of %s",
			len(checks), l.MaxChecks, formatAllowed(l.AllowedChecks))
	}
	out := make([][]string, len(checks))
	for i, argv := range checks {
		field := fmt.Sprintf("checks[%d]", i)
		for j := range i {
			if slices.Equal(checks[j], argv) {
				return nil, FieldErrorf(CodeInvalid, field, "%s is already checks[%d]; give each check once", quoteArgv(argv), j)
			}
		}
		if !slices.ContainsFunc(l.AllowedChecks, func(a []string) bool { return slices.Equal(a, argv) }) {
			hint := ""
			if len(argv) == 1 && strings.ContainsAny(argv[0], " \t") {
				hint = " It looks like one shell command line: there is no shell, so give each argument as its own string."
			}
			return nil, FieldErrorf(CodeInvalid, field, "%s is not an allowed check; a check is an argv array equal to one of %s.%s",
				quoteArgv(argv), formatAllowed(l.AllowedChecks), hint)
		}
		out[i] = slices.Clone(argv)
	}
	return out, nil
}

func (l Limits) checkApproval(a ApprovalConfig) (ApprovalConfig, error) {
	out := ApprovalConfig{Policy: a.Policy, TimeoutSeconds: a.TimeoutSeconds}
	if out.Policy == "" {
		out.Policy = PolicyDenyAll
	}
	if err := checkPolicy(out.Policy); err != nil {
		return ApprovalConfig{}, err
	}
	if len(a.Allow) > 0 && (out.Policy == PolicyDenyAll || out.Policy == PolicyAllowAll) {
		return ApprovalConfig{}, FieldErrorf(CodeInvalid, "approval.allow",
			"has no effect under the %s policy; use allow_list or ask, or leave allow out", out.Policy)
	}
	for i, name := range a.Allow {
		field := fmt.Sprintf("approval.allow[%d]", i)
		if !slices.Contains(agentTools, name) {
			return ApprovalConfig{}, FieldErrorf(CodeInvalid, field, "%s is not one of the agent's tools: %s", quote(name), strings.Join(agentTools, ", "))
		}
		if j := slices.Index(a.Allow[:i], name); j >= 0 {
			return ApprovalConfig{}, FieldErrorf(CodeInvalid, field, "%s is already approval.allow[%d]; give each tool once", quote(name), j)
		}
	}
	if len(a.Allow) > 0 {
		out.Allow = slices.Clone(a.Allow)
	}
	out.TimeoutSeconds = cmp.Or(out.TimeoutSeconds, l.DefaultApprovalTimeoutSeconds)
	if err := checkRange("approval.timeoutSeconds", out.TimeoutSeconds, 1, l.MaxApprovalTimeoutSeconds); err != nil {
		return ApprovalConfig{}, err
	}
	return out, nil
}

func checkPolicy(p ApprovalPolicy) error {
	if !p.Valid() {
		return FieldErrorf(CodeInvalid, "approval.policy", "%s is not a policy; use deny_all, allow_list, allow_all or ask", quote(string(p)))
	}
	return nil
}

func checkRange(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return FieldErrorf(CodeInvalid, field, "is %d; it must be an integer from %d to %d", v, lo, hi)
	}
	return nil
}

// quote renders a caller-supplied string for a message: Go-quoted, so
// control characters cannot forge output, and cut to quoteMax bytes.
func quote(s string) string {
	if len(s) <= quoteMax {
		return strconv.Quote(s)
	}
	cut := quoteMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// quoteArgv renders a check for a message, its arguments quoted and both
// their number and their length bounded.
func quoteArgv(argv []string) string {
	const maxArgs = 8
	parts := make([]string, 0, min(len(argv), maxArgs)+1)
	for i, a := range argv {
		if i == maxArgs {
			parts = append(parts, fmt.Sprintf("... (%d arguments)", len(argv)))
			break
		}
		parts = append(parts, quote(a))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatAllowed(checks [][]string) string {
	parts := make([]string, len(checks))
	for i, c := range checks {
		parts[i] = quoteArgv(c)
	}
	return strings.Join(parts, ", ")
}

func invalidUTF8Offset(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// loneSurrogateOffset returns the byte offset of the first \u escape in a
// JSON string that encodes half of a UTF-16 surrogate pair without the other
// half, or -1. body must be valid JSON.
func loneSurrogateOffset(body []byte) int {
	hex4 := func(b []byte) rune {
		v, err := strconv.ParseUint(string(b), 16, 32)
		if err != nil {
			return -1
		}
		return rune(v)
	}
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(body) && body[i+1] != 'u' {
				i++ // a one-character escape
				continue
			}
			if i+6 > len(body) {
				return i
			}
			r := hex4(body[i+2 : i+6])
			if !utf16.IsSurrogate(r) {
				i += 5
				continue
			}
			if r < 0xdc00 && i+12 <= len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
				if r2 := hex4(body[i+8 : i+12]); r2 >= 0xdc00 && r2 < 0xe000 {
					i += 11
					continue
				}
			}
			return i
		}
	}
	return -1
}

// wireRequest is a run request as decoded from JSON, with pointers where
// ParseRunRequest must tell an absent field from a zero one.
type wireRequest struct {
	instruction     *string
	model           *string
	files           []File
	allowedPaths    []string
	checks          [][]string
	maxSteps        *int
	wallTimeSeconds *int
	approval        *wireApproval
	source          *Source
}

type wireApproval struct {
	policy         *string
	allow          []string
	timeoutSeconds *int
}

var (
	requestFields  = []string{"instruction", "model", "files", "source", "allowedPaths", "checks", "maxSteps", "wallTimeSeconds", "approval"}
	sourceFields   = []string{"git"}
	gitFields      = []string{"url", "ref"}
	fileFields     = []string{"path", "content"}
	approvalFields = []string{"policy", "allow", "timeoutSeconds"}
)

// wireDecoder walks a JSON body token by token against the request's
// schema. encoding/json's Unmarshal cannot do this job: it matches names
// case-insensitively, keeps the last of repeated names, takes a quoted
// number into a json.Number, and names neither the index nor the full path
// of an unknown field.
type wireDecoder struct {
	dec *json.Decoder
}

func decodeWire(body []byte) (wireRequest, error) {
	d := wireDecoder{dec: json.NewDecoder(bytes.NewReader(body))}
	d.dec.UseNumber()
	var w wireRequest
	err := d.object("", func(key, field string) error {
		var err error
		switch key {
		case "instruction":
			w.instruction, err = d.readStringPtr(field)
		case "model":
			w.model, err = d.readStringPtr(field)
		case "files":
			w.files, err = d.readFiles(field)
		case "allowedPaths":
			w.allowedPaths, err = d.readStrings(field)
		case "checks":
			err = d.array(field, func(field string) error {
				argv, err := d.readStrings(field)
				w.checks = append(w.checks, argv)
				return err
			})
		case "maxSteps":
			w.maxSteps, err = d.readIntPtr(field)
		case "wallTimeSeconds":
			w.wallTimeSeconds, err = d.readIntPtr(field)
		case "approval":
			w.approval, err = d.readApproval(field)
		case "source":
			w.source, err = d.readSource(field)
		default:
			err = unknownField(field, requestFields)
		}
		return err
	})
	if err != nil {
		return wireRequest{}, err
	}
	if _, err := d.dec.Token(); err != io.EOF {
		return wireRequest{}, Errorf(CodeInvalid, "request body has data after the JSON object (at byte %d); send exactly one object", d.dec.InputOffset())
	}
	return w, nil
}

func (d *wireDecoder) readFiles(field string) ([]File, error) {
	var files []File
	err := d.array(field, func(field string) error {
		var f File
		var hasPath, hasContent bool
		err := d.object(field, func(key, kf string) error {
			var err error
			switch key {
			case "path":
				f.Path, err = d.readString(kf)
				hasPath = true
			case "content":
				f.Content, err = d.readString(kf)
				hasContent = true
			default:
				err = unknownField(kf, fileFields)
			}
			return err
		})
		switch {
		case err != nil:
			return err
		case !hasPath:
			return FieldErrorf(CodeInvalid, field+".path", "is required")
		case !hasContent:
			return FieldErrorf(CodeInvalid, field+".content", `is required (use "" for an empty file)`)
		}
		files = append(files, f)
		return nil
	})
	return files, err
}

// readSource reads {"git": {"url", "ref"}}: what a caller may say of a git
// source. The commit and what the fetch found are the control plane's.
func (d *wireDecoder) readSource(field string) (*Source, error) {
	var src Source
	err := d.object(field, func(key, kf string) error {
		if key != "git" {
			return unknownField(kf, sourceFields)
		}
		var g GitSource
		hasURL := false
		err := d.object(kf, func(key, gf string) error {
			var err error
			switch key {
			case "url":
				g.URL, err = d.readString(gf)
				hasURL = true
			case "ref":
				g.Ref, err = d.readString(gf)
			default:
				err = unknownField(gf, gitFields)
			}
			return err
		})
		if err == nil && !hasURL {
			err = FieldErrorf(CodeInvalid, kf+".url", "is required")
		}
		src.Git = &g
		return err
	})
	if err == nil && src.Git == nil {
		err = FieldErrorf(CodeInvalid, field, `must hold "git": {"url", "ref"}`)
	}
	return &src, err
}

func (d *wireDecoder) readApproval(field string) (*wireApproval, error) {
	var a wireApproval
	err := d.object(field, func(key, kf string) error {
		var err error
		switch key {
		case "policy":
			a.policy, err = d.readStringPtr(kf)
		case "allow":
			a.allow, err = d.readStrings(kf)
		case "timeoutSeconds":
			a.timeoutSeconds, err = d.readIntPtr(kf)
		default:
			err = unknownField(kf, approvalFields)
		}
		return err
	})
	return &a, err
}

// next returns the next token. Syntax errors are reported by byte offset
// only: the decoder's own message can quote a character of the body.
func (d *wireDecoder) next() (json.Token, error) {
	tok, err := d.dec.Token()
	if err == nil {
		return tok, nil
	}
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return nil, Errorf(CodeInvalid, "request body is not valid JSON: syntax error at byte %d", se.Offset)
	case errors.Is(err, io.EOF) && d.dec.InputOffset() == 0:
		return nil, Errorf(CodeInvalid, "request body is empty; send a JSON object")
	default:
		return nil, Errorf(CodeInvalid, "request body is not valid JSON: it ends at byte %d, before the object is complete", d.dec.InputOffset())
	}
}

// object reads a JSON object at field, calling member for each key, which
// must consume the value. A repeated key is refused: JSON parsers disagree
// on which copy wins, and belay takes no side.
func (d *wireDecoder) object(field string, member func(key, field string) error) error {
	tok, err := d.next()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		if field == "" {
			return Errorf(CodeInvalid, "request body must be a JSON object, not %s", kindOf(tok))
		}
		return FieldErrorf(CodeInvalid, field, "must be an object, not %s", kindOf(tok))
	}
	seen := make(map[string]bool)
	for d.dec.More() {
		tok, err := d.next()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // the decoder yields only strings as keys
		kf := joinField(field, key)
		if seen[key] {
			return FieldErrorf(CodeInvalid, kf, "appears more than once; give each field once")
		}
		seen[key] = true
		if err := member(key, kf); err != nil {
			return err
		}
	}
	_, err = d.next() // the closing brace
	return err
}

// array reads a JSON array at field, calling elem with each element's field
// name; elem must consume the element.
func (d *wireDecoder) array(field string, elem func(field string) error) error {
	tok, err := d.next()
	if err != nil {
		return err
	}
	if tok != json.Delim('[') {
		return FieldErrorf(CodeInvalid, field, "must be an array, not %s", kindOf(tok))
	}
	for i := 0; d.dec.More(); i++ {
		if err := elem(field + "[" + strconv.Itoa(i) + "]"); err != nil {
			return err
		}
	}
	_, err = d.next() // the closing bracket
	return err
}

func (d *wireDecoder) readStrings(field string) ([]string, error) {
	out := []string{}
	err := d.array(field, func(field string) error {
		s, err := d.readString(field)
		out = append(out, s)
		return err
	})
	return out, err
}

func (d *wireDecoder) readString(field string) (string, error) {
	tok, err := d.next()
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", FieldErrorf(CodeInvalid, field, "must be a string, not %s", kindOf(tok))
	}
	return s, nil
}

func (d *wireDecoder) readStringPtr(field string) (*string, error) {
	s, err := d.readString(field)
	return &s, err
}

func (d *wireDecoder) readIntPtr(field string) (*int, error) {
	tok, err := d.next()
	if err != nil {
		return nil, err
	}
	n, ok := tok.(json.Number)
	if !ok {
		return nil, FieldErrorf(CodeInvalid, field, "must be a JSON integer, not %s", kindOf(tok))
	}
	if strings.ContainsAny(string(n), ".eE") {
		return nil, FieldErrorf(CodeInvalid, field, "must be a JSON integer, without a fraction or an exponent")
	}
	v, err := strconv.Atoi(string(n))
	if err != nil {
		return nil, FieldErrorf(CodeInvalid, field, "is out of range")
	}
	return &v, nil
}

func unknownField(field string, known []string) error {
	return FieldErrorf(CodeInvalid, field, "is not a known field; the fields here are %s", strings.Join(known, ", "))
}

// joinField names key inside parent the way a JavaScript reader would:
// parent.key, or parent["odd key"] when the key is not a plain name.
func joinField(parent, key string) string {
	plain := key != "" && len(key) <= quoteMax && strings.IndexFunc(key, func(r rune) bool {
		return !(r == '_' || r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)))
	}) < 0
	switch {
	case !plain:
		return parent + "[" + quote(key) + "]"
	case parent == "":
		return key
	default:
		return parent + "." + key
	}
}

func kindOf(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return "null"
	}
}
