package sandbox_test

import (
	"fmt"
	"os"
	"testing"
)

// helperEnv names the environment variable that turns the test binary into
// a helper process: the test re-executes itself, as a non-root user, to run
// code that must not run inside the test process (Harden, the entry).
const helperEnv = "BELAY_SANDBOX_TEST_HELPER"

// helpers are the helper modes, by the value of helperEnv.
var helpers = map[string]func() int{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		h, ok := helpers[mode]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
			os.Exit(2)
		}
		os.Exit(h())
	}
	os.Exit(m.Run())
}
