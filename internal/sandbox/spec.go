package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/sandbox/workspace"
)

// Workspace is the sandbox's folder, laid out by the launcher with the
// names in package workspace.
type Workspace string

// SpecPath is spec.json: the run's belay.SandboxSpec, without secrets.
func (w Workspace) SpecPath() string { return filepath.Join(string(w), workspace.SpecFile) }

// TokensDir holds model.token, events.token and approvals.token.
func (w Workspace) TokensDir() string { return filepath.Join(string(w), workspace.TokensDir) }

// RepoDir is the repository the entry builds from the spec's files.
func (w Workspace) RepoDir() string { return filepath.Join(string(w), workspace.RepoDir) }

// OutDir is the workspace's out/ folder. The entry writes nothing there
// any more (it uploads its outputs); launchers may stop creating it.
func (w Workspace) OutDir() string { return filepath.Join(string(w), workspace.OutDir) }

// HomeDir is HOME for git, checks and shell commands; the entry empties
// it before the final checks.
func (w Workspace) HomeDir() string { return filepath.Join(string(w), workspace.HomeDir) }

// MaxSpecBytes caps spec.json: a run's tree is at most 512 KiB by default,
// and JSON escaping can grow it several times over.
const MaxSpecBytes = 8 << 20

// ReadSpec reads and checks spec.json. The entry does not take the spec on
// trust: every field it relies on is checked here, and every file path is
// checked again when the repository is built.
func ReadSpec(path string) (belay.SandboxSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return belay.SandboxSpec{}, fmt.Errorf("read spec: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSpecBytes+1))
	if err != nil {
		return belay.SandboxSpec{}, fmt.Errorf("read spec %s: %w", path, err)
	}
	if len(b) > MaxSpecBytes {
		return belay.SandboxSpec{}, fmt.Errorf("read spec %s: larger than %d bytes", path, MaxSpecBytes)
	}
	var spec belay.SandboxSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return belay.SandboxSpec{}, fmt.Errorf("read spec %s: %w", path, err)
	}
	if err := checkSpec(spec); err != nil {
		return belay.SandboxSpec{}, fmt.Errorf("read spec %s: %w", path, err)
	}
	return spec, nil
}

func checkSpec(s belay.SandboxSpec) error {
	switch {
	case s.RunID == "":
		return errors.New("runId is empty")
	case s.Model == "":
		return errors.New("model is empty")
	case s.Instruction == "":
		return errors.New("instruction is empty")
	case len(s.Files) == 0 && s.Source == nil:
		return errors.New("files is empty")
	case len(s.Files) > 0 && s.Source != nil:
		return errors.New("both files and source are set")
	case len(s.AllowedPaths) == 0:
		return errors.New("allowedPaths is empty")
	case len(s.Checks) == 0:
		return errors.New("checks is empty")
	case s.MaxSteps < 1:
		return fmt.Errorf("maxSteps is %d; it must be at least 1", s.MaxSteps)
	case s.WallTimeSeconds < 1:
		return fmt.Errorf("wallTimeSeconds is %d; it must be at least 1", s.WallTimeSeconds)
	case s.Deadline.IsZero():
		// The entry keeps to the run's deadline, never to its own start.
		return errors.New("deadline is missing")
	}
	for i, c := range s.Checks {
		if len(c) == 0 || c[0] == "" {
			return fmt.Errorf("checks[%d] is an empty argv", i)
		}
	}
	for i, f := range s.Files {
		if err := belay.CheckPath(f.Path); err != nil {
			return fmt.Errorf("files[%d].path: %w", i, err)
		}
	}
	if src := s.Source; src != nil {
		g := src.Git
		switch {
		case g == nil:
			return errors.New("source has no git source")
		case !belay.IsObjectName(g.Commit):
			return fmt.Errorf("source.git.commit %q is not a full commit id", g.Commit)
		case g.Bundle == nil || g.Bundle.Size <= 0 || len(g.Bundle.SHA256) != 64:
			return errors.New("source.git.bundle must give the bundle's size and SHA-256")
		}
	}
	u, err := url.Parse(s.APIBaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("apiBaseUrl %q is not an http(s) URL without query or fragment", s.APIBaseURL)
	}
	if u.Scheme == "http" && s.APISocket == "" && !isLoopbackHost(u.Hostname()) {
		// Tokens travel in its headers: plain HTTP only over the local
		// socket or loopback.
		return fmt.Errorf("apiBaseUrl %q is plain http to a remote host; use https, or apiSocket", s.APIBaseURL)
	}
	return nil
}
