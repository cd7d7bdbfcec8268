package belay

// ResultBundle is what a sandbox reports in result.json. It is untrusted: the
// control plane validates it against the run before believing any of it.
type ResultBundle struct {
	Version      int           `json:"version"`
	RunID        string        `json:"runId"`
	Status       RunStatus     `json:"status"`
	ExitCode     int           `json:"exitCode"`
	Reason       string        `json:"reason,omitempty"`
	Summary      string        `json:"summary"`
	ChangedFiles []string      `json:"changedFiles"`
	Checks       []CheckResult `json:"checks"`
	Usage        BundleUsage   `json:"usage"`
	BaseCommit   string        `json:"baseCommit"`
	HeadCommit   string        `json:"headCommit"`
}

// BundleUsage is the sandbox's own count of what it spent; the control plane
// keeps its own and trusts that one.
type BundleUsage struct {
	ModelRequests    int   `json:"modelRequests"`
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// ResultBundleVersion is the version of ResultBundle this code writes and reads.
const ResultBundleVersion = 1
