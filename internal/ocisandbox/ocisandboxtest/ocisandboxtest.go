// Package ocisandboxtest finds what tests of the OCI launcher need: root,
// runc, and the sandbox image that scripts/test.sh builds once per
// `make test` and names in BELAY_TEST_SANDBOX_IMAGE. Outside CI a test
// without them skips, saying how to get them; under CI=true it fails.
package ocisandboxtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The variables scripts/test.sh sets.
const (
	// EnvImage is the path of the sandbox image (an OCI archive).
	EnvImage = "BELAY_TEST_SANDBOX_IMAGE"
	// EnvCache is a root-owned folder where launchers in tests share the
	// unpacked image, so each test binary unpacks it at most once.
	EnvCache = "BELAY_TEST_SANDBOX_CACHE"
)

// missing skips the test outside CI and fails it under CI.
func missing(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatal(why)
	}
	tb.Skip(why)
}

// Image returns the sandbox image to run, after checking that this test
// can run it: as root, with runc on PATH.
func Image(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		missing(tb, "the OCI launcher needs root (runc makes namespaces, mounts and cgroups); run the test as root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		missing(tb, "the OCI launcher needs runc: apt-get install runc")
	}
	img := os.Getenv(EnvImage)
	if img == "" {
		missing(tb, "no sandbox image: build it with make image and set "+EnvImage+"=$PWD/bin/belay-sandbox.oci.tar (make test does both)")
	}
	abs, err := filepath.Abs(img)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		tb.Fatalf("%s=%s: %v (build it with make image)", EnvImage, img, err)
	}
	return abs
}

// Cache returns the folder to unpack images into: EnvCache when set, else
// a temporary folder of the test's (the image is then unpacked again),
// searchable by others as the launcher needs (each sandbox's user
// namespace root must reach the image); t.TempDir's folders are not.
func Cache(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv(EnvCache); dir != "" {
		return dir
	}
	dir, err := os.MkdirTemp("", "belay-image-cache-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(dir, "images")
}
