package belay

import "strings"

// RunRequest is what a caller asks for: an instruction, a source tree, the
// paths the agent may change and the checks that prove the change. It is the
// canonical form after validation (see Limits.Validate): defaults filled in,
// the model set to the operator's, allowed paths and checks as given.
type RunRequest struct {
	Instruction string `json:"instruction"`
	Model       string `json:"model"`
	// Files is the uploaded tree; Source a repository the control plane
	// fetches instead. A request has exactly one of them.
	Files           []File         `json:"files"`
	Source          *Source        `json:"source,omitempty"`
	AllowedPaths    []string       `json:"allowedPaths"`
	Checks          [][]string     `json:"checks"`
	MaxSteps        int            `json:"maxSteps"`
	WallTimeSeconds int            `json:"wallTimeSeconds"`
	Approval        ApprovalConfig `json:"approval"`
	// Trigger records the repository event that started the run. Only the
	// dispatcher sets it; a body of POST /v1/runs cannot.
	Trigger *Trigger `json:"trigger,omitempty"`
	// Turn makes the run a turn of a session: the conversation so far and
	// the session's skills. Only the session service sets it; a body of
	// POST /v1/runs cannot.
	Turn *TurnContext `json:"turn,omitempty"`
}

// GitSource returns the request's git source, or nil for an uploaded tree.
func (r RunRequest) GitSource() *GitSource {
	if r.Source == nil {
		return nil
	}
	return r.Source.Git
}

// File is one uploaded source file. Path is POSIX-relative; Content is text.
type File struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// ApprovalConfig is a run's policy for tool calls that need approval
// (today: shell). Allow lists tool names for the allow_list policy.
type ApprovalConfig struct {
	Policy         ApprovalPolicy `json:"policy"`
	Allow          []string       `json:"allow,omitempty"`
	TimeoutSeconds int            `json:"timeoutSeconds,omitempty"`
}

// MaxRequests is the model-call budget of a run: its steps plus two, so the
// agent can still summarise after its last step.
func (r RunRequest) MaxRequests() int { return r.MaxSteps + 2 }

// Limits is the operator's configuration of run creation. DefaultLimits gives
// the reference numbers; an operator may tighten them, add allowlisted checks
// and extensions, and raise MaxWallTimeSeconds (for Fargate).
type Limits struct {
	// Model is the only model a run may use; a request naming another is invalid.
	Model string
	// AllowedChecks are the argv arrays a check must equal element-wise.
	AllowedChecks [][]string
	// Extensions are the allowed file extensions, with the dot (".py").
	// Names listed in ExtensionlessNames (for example "Makefile") are allowed too.
	Extensions         []string
	ExtensionlessNames []string

	MaxInstructionChars int
	MaxFiles            int
	MaxFileBytes        int
	MaxTreeBytes        int
	MaxBodyBytes        int
	MaxChecks           int
	MaxSteps            int
	MaxWallTimeSeconds  int

	DefaultMaxSteps        int
	DefaultWallTimeSeconds int
	// DefaultApprovalTimeoutSeconds applies when a request sets none;
	// MaxApprovalTimeoutSeconds bounds what a request may set.
	DefaultApprovalTimeoutSeconds int
	MaxApprovalTimeoutSeconds     int

	// RepoMaxFiles and RepoMaxBytes bound a git source: the files of the
	// fetched commit's tree, their bytes, and the bundle's bytes.
	RepoMaxFiles int
	RepoMaxBytes int64
	// GitURLs says which git source URLs a caller may give.
	GitURLs GitURLPolicy
}

// DefaultAllowedChecks is the reference allowlist of checks.
func DefaultAllowedChecks() [][]string {
	return [][]string{
		{"git", "diff", "--check"},
		{"python3", "-m", "pytest", "-q"},
		{"python3", "-m", "compileall", "-q", "."},
		{"python3", "-m", "unittest", "discover"},
	}
}

// DefaultExtensions is the reference list of text extensions a file may have.
func DefaultExtensions() []string {
	return []string{
		".py", ".pyi", ".txt", ".md", ".rst", ".toml", ".cfg", ".ini", ".json",
		".yaml", ".yml", ".go", ".mod", ".sum", ".js", ".mjs", ".cjs", ".ts",
		".tsx", ".jsx", ".css", ".html", ".sh", ".c", ".h", ".rs", ".java",
		".rb", ".csv", ".sql", ".xml",
	}
}

// DefaultLimits returns the reference limits for the given operator model.
func DefaultLimits(model string) Limits {
	return Limits{
		Model:                         model,
		AllowedChecks:                 DefaultAllowedChecks(),
		Extensions:                    DefaultExtensions(),
		ExtensionlessNames:            []string{"Makefile", "Dockerfile", "LICENSE", "README"},
		MaxInstructionChars:           32000,
		MaxFiles:                      32,
		MaxFileBytes:                  64 << 10,
		MaxTreeBytes:                  512 << 10,
		MaxBodyBytes:                  768 << 10,
		MaxChecks:                     4,
		MaxSteps:                      20,
		MaxWallTimeSeconds:            220,
		DefaultMaxSteps:               12,
		DefaultWallTimeSeconds:        180,
		DefaultApprovalTimeoutSeconds: 120,
		MaxApprovalTimeoutSeconds:     3600,
		RepoMaxFiles:                  DefaultRepoMaxFiles,
		RepoMaxBytes:                  DefaultRepoMaxBytes,
	}
}

// PathAllowed reports whether the relative path p lies inside allowedPaths:
// equal to an entry, or under an entry's subtree when it ends in "/**".
// p must already be a clean relative path (see CheckPath).
func PathAllowed(allowedPaths []string, p string) bool {
	for _, a := range allowedPaths {
		if dir, ok := strings.CutSuffix(a, "/**"); ok {
			if strings.HasPrefix(p, dir+"/") {
				return true
			}
			continue
		}
		if p == a {
			return true
		}
	}
	return false
}
