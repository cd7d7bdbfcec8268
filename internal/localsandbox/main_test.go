//go:build linux

package localsandbox_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// testEntry is the test entry program (testdata/testentry), built once.
var testEntry string

// realEntry is the sandbox entry built from ./sandbox-task, and
// realEntryErr why it could not be built.
var (
	realEntry    string
	realEntryErr error
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	dir, err := os.MkdirTemp("", "lsb-entry")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		// Searchable by everyone: a helper test runs it as another user.
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		testEntry = filepath.Join(dir, "testentry")
		if err := goBuild(testEntry, "./testdata/testentry"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// Only the test that runs it fails when it does not build.
		realEntry = filepath.Join(dir, "belay-sandbox")
		realEntryErr = goBuild(realEntry, realEntryPkg)
		return m.Run()
	}()
	os.Exit(code)
}

// goBuild builds pkg into out, as a static binary.
func goBuild(out, pkg string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goTool, "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
