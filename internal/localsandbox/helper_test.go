package localsandbox_test

// helperEnv names the environment variable that turns the test binary into
// a helper process (see TestMain).
const helperEnv = "BELAY_LOCALSANDBOX_TEST_HELPER"

func runHelper(mode string) int { return 2 }
