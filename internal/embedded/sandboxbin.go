package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// findSandboxBin returns the sandbox entry to launch: the configured path,
// else belay-sandbox beside the running executable (where `make build`
// puts both), else belay-sandbox on PATH. executable and lookPath are
// os.Executable and exec.LookPath, passed in for tests.
func findSandboxBin(configured string, executable func() (string, error), lookPath func(string) (string, error)) (string, error) {
	if configured != "" {
		abs, err := filepath.Abs(configured)
		if err != nil {
			return "", fmt.Errorf("%s (--sandbox-bin) %s: %w", EnvSandboxBin, configured, err)
		}
		if err := checkExecutable(abs); err != nil {
			return "", fmt.Errorf("%s (--sandbox-bin): %w", EnvSandboxBin, err)
		}
		return abs, nil
	}
	var tried []string
	if exe, err := executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		beside := filepath.Join(filepath.Dir(exe), SandboxBinName)
		if checkExecutable(beside) == nil {
			return beside, nil
		}
		tried = append(tried, beside)
	}
	if p, err := lookPath(SandboxBinName); err == nil {
		if abs, err := filepath.Abs(p); err == nil && checkExecutable(abs) == nil {
			return abs, nil
		}
	}
	tried = append(tried, SandboxBinName+" on PATH")
	return "", fmt.Errorf("no sandbox binary: looked for %v; build it (make build puts bin/belay-sandbox beside bin/belay) or set %s (--sandbox-bin)",
		tried, EnvSandboxBin)
}

// checkExecutable reports why path is not a regular executable file.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return errors.New(path + " is not executable")
	}
	return nil
}
