package belay

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Source is where a run's tree comes from when it is not uploaded: a git
// repository the control plane fetches (never the sandbox). It is the
// alternative to RunRequest.Files.
type Source struct {
	Git *GitSource `json:"git,omitempty"`
}

// GitSource is a git repository and the revision to run on. A caller
// gives URL and Ref; the control plane sets the rest when it fetches:
// Commit (exactly the one fetched, which becomes the sandbox's base
// commit), the tree's size and the bundle the sandbox builds its
// repository from.
type GitSource struct {
	URL string `json:"url"`
	// Ref is a branch, a tag, a full ref (refs/heads/main) or a full commit
	// id; empty means the repository's default branch.
	Ref string `json:"ref,omitempty"`
	// Commit is the commit to fetch, when an event names it; after the
	// fetch, the commit fetched.
	Commit string        `json:"commit,omitempty"`
	Tree   *SourceTree   `json:"tree,omitempty"`
	Bundle *SourceBundle `json:"bundle,omitempty"`
}

// SourceTree is what a fetched commit's tree holds: regular files (and
// symbolic links) and their total size in bytes.
type SourceTree struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// SourceBundle describes the git bundle stored for a run (SourceStore):
// its size and the hex SHA-256 of its bytes, which the sandbox checks
// after downloading it.
type SourceBundle struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// SourceFetcher fetches a run's git source with the control plane's
// credentials (never the sandbox's), under the repository limits of lim
// (RepoMaxFiles, RepoMaxBytes; the reference ones where unset). The git
// adapter implements it; the run-creation path depends only on this, so a
// program that never fetches links no git code.
type SourceFetcher interface {
	FetchSource(ctx context.Context, src GitSource, lim Limits) (*FetchedSource, error)
}

// FetchedSource is a fetched git source: the ref and commit fetched, the
// paths of the commit's tree (regular files and symbolic links, in git's
// order), its size, and the bundle of its history, which Data opens until
// Data.Close removes it.
type FetchedSource struct {
	Ref    string
	Commit string
	Paths  []string
	Tree   SourceTree
	Bundle SourceBundle
	Data   interface {
		OpenBundle() (io.ReadCloser, error)
		Close() error
	}
}

// RepoMaxBytes is lim's cap on a git source's bytes (and its bundle's),
// the reference one where unset.
func RepoMaxBytes(lim Limits) int64 {
	if lim.RepoMaxBytes > 0 {
		return lim.RepoMaxBytes
	}
	return DefaultRepoMaxBytes
}

// The reference repository limits (DESIGN.md "Repository events"): a
// fetched commit may hold at most this many files and bytes, and its
// bundle at most DefaultRepoMaxBytes.
const (
	DefaultRepoMaxFiles = 20000
	DefaultRepoMaxBytes = 100 << 20
)

// Trigger records what started a run that a repository event started:
// shown in the run's view and carried on its status events, and what the
// publisher writes the run's safe outputs from. Only the control plane
// sets it; a caller of POST /v1/runs cannot.
type Trigger struct {
	Provider   string `json:"provider"`
	Event      string `json:"event"`
	Action     string `json:"action,omitempty"`
	Delivery   string `json:"delivery"`
	Repository string `json:"repository"`
	// Commit is the commit the run ran on; Ref the ref the event
	// concerned.
	Commit string `json:"commit,omitempty"`
	Ref    string `json:"ref,omitempty"`
	Actor  string `json:"actor"`
	URL    string `json:"url,omitempty"`
	// Issue is the issue or pull request number the event is about (the
	// outcome comment goes there); PullRequest is set when it is a pull
	// request.
	Issue       int  `json:"issue,omitempty"`
	PullRequest bool `json:"pullRequest,omitempty"`
	// BaseBranch is the branch a pull request of the run's change would
	// merge into; empty when it must be looked up (a comment on a pull
	// request: its head branch).
	BaseBranch string `json:"baseBranch,omitempty"`
	// Outputs are the safe outputs the trigger asks for.
	Outputs TriggerOutputs `json:"outputs"`
}

// TriggerOutputs are the safe outputs the control plane writes after a run
// (the sandbox never holds repository credentials): the validated patch as
// one commit on branch belay/<runId>, a pull request of it, and a comment
// with the outcome on the issue or pull request.
type TriggerOutputs struct {
	Branch      bool `json:"branch"`
	PullRequest bool `json:"pullRequest"`
	Comment     bool `json:"comment"`
}

// CheckTrigger returns invalid for a trigger record without its provider,
// event, delivery, repository or actor.
func CheckTrigger(t Trigger) error {
	switch {
	case t.Provider != ProviderGitHub && t.Provider != ProviderCodeCommit:
		return FieldErrorf(CodeInvalid, "trigger.provider", "is %q; it must be %q or %q", t.Provider, ProviderGitHub, ProviderCodeCommit)
	case !isRepoEventType(t.Event):
		return FieldErrorf(CodeInvalid, "trigger.event", "is %q; it must be one of %v", t.Event, RepoEventTypes)
	case t.Delivery == "":
		return FieldErrorf(CodeInvalid, "trigger.delivery", "is empty")
	case t.Repository == "":
		return FieldErrorf(CodeInvalid, "trigger.repository", "is empty")
	case t.Actor == "":
		return FieldErrorf(CodeInvalid, "trigger.actor", "is empty")
	case t.Commit != "" && !IsObjectName(t.Commit):
		return FieldErrorf(CodeInvalid, "trigger.commit", "%q is not a full commit id", t.Commit)
	}
	return nil
}

// BranchFor is the branch a run's change is pushed to: belay/<runId>.
// Nothing else is ever pushed.
func BranchFor(runID string) string { return "belay/" + runID }

// IsObjectName reports whether s is a full git object name: 40 (SHA-1) or
// 64 (SHA-256) lower-case hex digits.
func IsObjectName(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// GitURLPolicy says which git URLs may be fetched. A caller of the API gets
// https only (plain http to a loopback host where the operator allows it);
// the operator's own triggers file may also name file:// mirrors.
type GitURLPolicy struct {
	AllowFile         bool
	AllowLoopbackHTTP bool
}

// maxGitURLLen bounds a git URL.
const maxGitURLLen = 2048

// CheckGitURL returns invalid for a URL git should not fetch for belay:
// not absolute, a scheme the policy does not allow, credentials in it (they
// belong in BELAY_GIT_CREDENTIALS, never in a URL a run records), a query
// or fragment, no host (or a link-local one, which reaches cloud metadata
// services), or no path.
func CheckGitURL(raw string, p GitURLPolicy) error {
	bad := func(format string, args ...any) error {
		return FieldErrorf(CodeInvalid, "source.git.url", format, args...)
	}
	if raw == "" {
		return bad("is required: the repository's URL, for example https://github.com/octo-org/octo-repo.git")
	}
	if len(raw) > maxGitURLLen || !utf8.ValidString(raw) || strings.ContainsFunc(raw, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ' ' }) {
		return bad("must be at most %d characters of text without spaces or control characters", maxGitURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() {
		return bad("%s is not an absolute URL", quote(raw))
	}
	if u.User != nil {
		return bad("holds credentials; give the URL without them (the control plane's git credentials are configured separately)")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return bad("%s has a query or fragment; give the repository's plain URL", quote(raw))
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !p.AllowLoopbackHTTP || !isLoopbackName(u.Hostname()) {
			return bad("%s uses plain http; use https", quote(raw))
		}
	case "file":
		if !p.AllowFile {
			return bad("%s is a file URL; only the operator's triggers file may name local mirrors", quote(raw))
		}
		if u.Host != "" || u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return bad("%s must be file:///absolute/path", quote(raw))
		}
		return nil
	default:
		return bad("%s has scheme %q; allowed is https", quote(raw), u.Scheme)
	}
	host := u.Hostname()
	if host == "" {
		return bad("%s has no host", quote(raw))
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified()) {
		return bad("%s names a link-local or unspecified address", quote(raw))
	}
	if strings.Trim(u.Path, "/") == "" {
		return bad("%s names no repository path", quote(raw))
	}
	return nil
}

func isLoopbackName(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// maxRefLen bounds a ref.
const maxRefLen = 255

// CheckGitRef returns invalid for a ref git would refuse or that could be
// read as an option or a revision expression: it follows
// git-check-ref-format (no "..", "@{", "//", control characters, space,
// ~ ^ : ? * [ \, no segment starting with "." or ending with ".lock", no
// leading "-" or "/", no trailing "/" or "."), at most 255 bytes. A full
// commit id passes too. Empty is allowed (the default branch).
func CheckGitRef(ref string) error {
	bad := func(format string, args ...any) error {
		return FieldErrorf(CodeInvalid, "source.git.ref", format, args...)
	}
	if ref == "" || IsObjectName(ref) {
		return nil
	}
	switch {
	case len(ref) > maxRefLen:
		return bad("is %d bytes; at most %d are allowed", len(ref), maxRefLen)
	case !utf8.ValidString(ref):
		return bad("is not valid UTF-8")
	case strings.HasPrefix(ref, "-"), strings.HasPrefix(ref, "/"):
		return bad("%s may not start with - or /", quote(ref))
	case strings.HasSuffix(ref, "/"), strings.HasSuffix(ref, "."):
		return bad("%s may not end with / or .", quote(ref))
	case strings.Contains(ref, ".."), strings.Contains(ref, "@{"), strings.Contains(ref, "//"), ref == "@":
		return bad("%s holds .., @{ or //, which git does not allow in a ref", quote(ref))
	case strings.ContainsFunc(ref, func(r rune) bool { return r < 0x20 || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) }):
		return bad("%s holds a space, a control character or one of ~ ^ : ? * [ \\", quote(ref))
	}
	for seg := range strings.SplitSeq(ref, "/") {
		if strings.HasPrefix(seg, ".") || strings.HasSuffix(seg, ".lock") {
			return bad("%s has a part that starts with . or ends with .lock", quote(ref))
		}
	}
	return nil
}

// Delivery is one webhook delivery (or bus event) as belay answered it: the
// run it started, or why it was ignored. A redelivery (same Provider and
// ID) is answered the same way and starts nothing.
type Delivery struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	// RunID is the run the delivery started (or will: the dispatcher
	// creates it with this id); Ignored says why it started none. Exactly
	// one is set.
	RunID      string    `json:"runId,omitempty"`
	Ignored    string    `json:"ignored,omitempty"`
	ReceivedAt time.Time `json:"receivedAt"`
}

// MaxDeliveryIgnoredLen bounds the reason a delivery was ignored.
const MaxDeliveryIgnoredLen = 1000

// CheckDelivery returns invalid for a delivery a store must not keep:
// without a provider, an id of 1–128 printable characters, a time, or
// exactly one of RunID and Ignored.
func CheckDelivery(d Delivery) error {
	switch {
	case d.Provider == "" || len(d.Provider) > 32 || !isPrintableText(d.Provider):
		return FieldErrorf(CodeInvalid, "provider", "must be 1 to 32 printable characters")
	case d.ID == "" || len(d.ID) > 128 || !isPrintableText(d.ID):
		return FieldErrorf(CodeInvalid, "id", "must be 1 to 128 printable characters")
	case d.ReceivedAt.IsZero():
		return FieldErrorf(CodeInvalid, "receivedAt", "is unset")
	case (d.RunID == "") == (d.Ignored == ""):
		return FieldErrorf(CodeInvalid, "runId", "exactly one of runId and ignored must be set")
	case d.RunID != "" && CheckArtifactRunID(d.RunID) != nil:
		return FieldErrorf(CodeInvalid, "runId", "is not a run id")
	case len(d.Ignored) > MaxDeliveryIgnoredLen:
		return FieldErrorf(CodeInvalid, "ignored", "is longer than %d bytes", MaxDeliveryIgnoredLen)
	}
	return nil
}

// DeliveryStore remembers webhook deliveries, so a redelivery is answered
// as the first delivery was and starts nothing.
type DeliveryStore interface {
	// RecordDelivery stores d unless a delivery with its Provider and ID
	// is stored; it returns the stored delivery and recorded=true when it
	// stored d, or the earlier one, unchanged, and false. Of any number of
	// concurrent calls with one Provider and ID, exactly one records.
	// Returns invalid for a delivery CheckDelivery refuses.
	RecordDelivery(ctx context.Context, d Delivery) (stored Delivery, recorded bool, err error)
}
