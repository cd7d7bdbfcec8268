package wire

import (
	"slices"

	"github.com/belay-dev/belay/internal/belay"
)

// ServerConfig answers GET /v1/config: what this control plane accepts in
// a run, so that a client can choose what to send (the CLI picks the files
// it uploads with Extensions and ExtensionlessNames) instead of guessing
// from the reference defaults. It holds the operator's settings, never a
// secret or the upstream's address.
type ServerConfig struct {
	// Model is the one model runs use.
	Model string `json:"model"`
	// Extensions are the file extensions a file may have, with the dot
	// (".py"), compared without regard to case.
	Extensions []string `json:"extensions"`
	// ExtensionlessNames are whole file names allowed without an
	// extension ("Makefile").
	ExtensionlessNames []string `json:"extensionlessNames"`
	// AllowedChecks are the argv arrays a run's check must equal.
	AllowedChecks [][]string `json:"allowedChecks"`
	Limits        RunLimits  `json:"limits"`
	// GitSources says whether the server fetches a run's tree from a git
	// repository (source.git) instead of uploaded files.
	GitSources bool `json:"gitSources"`
}

// RunLimits are the numeric bounds of a run request (DESIGN.md "Reference
// behaviour").
type RunLimits struct {
	MaxInstructionChars           int `json:"maxInstructionChars"`
	MaxFiles                      int `json:"maxFiles"`
	MaxFileBytes                  int `json:"maxFileBytes"`
	MaxTreeBytes                  int `json:"maxTreeBytes"`
	MaxBodyBytes                  int `json:"maxBodyBytes"`
	MaxChecks                     int `json:"maxChecks"`
	MaxSteps                      int `json:"maxSteps"`
	MaxWallTimeSeconds            int `json:"maxWallTimeSeconds"`
	DefaultMaxSteps               int `json:"defaultMaxSteps"`
	DefaultWallTimeSeconds        int `json:"defaultWallTimeSeconds"`
	DefaultApprovalTimeoutSeconds int `json:"defaultApprovalTimeoutSeconds"`
	MaxApprovalTimeoutSeconds     int `json:"maxApprovalTimeoutSeconds"`
	// RepoMaxFiles and RepoMaxBytes bound a git source's fetched commit;
	// GitLoopbackHTTP says whether a git URL may be plain http to a
	// loopback host.
	RepoMaxFiles    int   `json:"repoMaxFiles"`
	RepoMaxBytes    int64 `json:"repoMaxBytes"`
	GitLoopbackHTTP bool  `json:"gitLoopbackHttp,omitempty"`
}

// ConfigOf is the public view of the operator's limits.
func ConfigOf(l belay.Limits) ServerConfig {
	checks := make([][]string, len(l.AllowedChecks))
	for i, c := range l.AllowedChecks {
		checks[i] = slices.Clone(c)
	}
	return ServerConfig{
		Model:              l.Model,
		Extensions:         NonNil(slices.Clone(l.Extensions)),
		ExtensionlessNames: NonNil(slices.Clone(l.ExtensionlessNames)),
		AllowedChecks:      checks,
		Limits: RunLimits{
			MaxInstructionChars:           l.MaxInstructionChars,
			MaxFiles:                      l.MaxFiles,
			MaxFileBytes:                  l.MaxFileBytes,
			MaxTreeBytes:                  l.MaxTreeBytes,
			MaxBodyBytes:                  l.MaxBodyBytes,
			MaxChecks:                     l.MaxChecks,
			MaxSteps:                      l.MaxSteps,
			MaxWallTimeSeconds:            l.MaxWallTimeSeconds,
			DefaultMaxSteps:               l.DefaultMaxSteps,
			DefaultWallTimeSeconds:        l.DefaultWallTimeSeconds,
			DefaultApprovalTimeoutSeconds: l.DefaultApprovalTimeoutSeconds,
			MaxApprovalTimeoutSeconds:     l.MaxApprovalTimeoutSeconds,
			RepoMaxFiles:                  l.RepoMaxFiles,
			RepoMaxBytes:                  l.RepoMaxBytes,
			GitLoopbackHTTP:               l.GitURLs.AllowLoopbackHTTP,
		},
	}
}

// RunLimits turns the answer back into belay.Limits, for a client to hold
// its request to what the server takes (Limits.ExtensionAllowed, the size
// bounds) before sending it.
func (c ServerConfig) RunLimits() belay.Limits {
	return belay.Limits{
		Model:                         c.Model,
		AllowedChecks:                 c.AllowedChecks,
		Extensions:                    c.Extensions,
		ExtensionlessNames:            c.ExtensionlessNames,
		MaxInstructionChars:           c.Limits.MaxInstructionChars,
		MaxFiles:                      c.Limits.MaxFiles,
		MaxFileBytes:                  c.Limits.MaxFileBytes,
		MaxTreeBytes:                  c.Limits.MaxTreeBytes,
		MaxBodyBytes:                  c.Limits.MaxBodyBytes,
		MaxChecks:                     c.Limits.MaxChecks,
		MaxSteps:                      c.Limits.MaxSteps,
		MaxWallTimeSeconds:            c.Limits.MaxWallTimeSeconds,
		DefaultMaxSteps:               c.Limits.DefaultMaxSteps,
		DefaultWallTimeSeconds:        c.Limits.DefaultWallTimeSeconds,
		DefaultApprovalTimeoutSeconds: c.Limits.DefaultApprovalTimeoutSeconds,
		MaxApprovalTimeoutSeconds:     c.Limits.MaxApprovalTimeoutSeconds,
		RepoMaxFiles:                  c.Limits.RepoMaxFiles,
		RepoMaxBytes:                  c.Limits.RepoMaxBytes,
		GitURLs:                       belay.GitURLPolicy{AllowLoopbackHTTP: c.Limits.GitLoopbackHTTP},
	}
}
