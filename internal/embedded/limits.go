package embedded

import "github.com/belay-dev/belay/internal/belay"

// The environment variables of the operator's additions to the run limits
// (belay.OperatorLimits; the Lambda functions read the same two).
const (
	// EnvExtensions adds allowed file extensions, comma-separated
	// (".kt,.swift").
	EnvExtensions = "BELAY_EXTENSIONS"
	// EnvChecks adds allowlisted checks, separated by ";", each split on
	// spaces into an argv ("go test ./...;cargo test").
	EnvChecks = "BELAY_CHECKS"
)

// runLimits returns the reference limits for model with the operator's
// additions. Returns an error naming the setting for an extension or a
// check that is not well formed.
func runLimits(o belay.OperatorLimits, model string) (belay.Limits, error) {
	return o.Apply(belay.DefaultLimits(model), EnvExtensions+" (--allow-extension)", EnvChecks+" (--allow-check)")
}
