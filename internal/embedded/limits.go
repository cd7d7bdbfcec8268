package embedded

import (
	"fmt"
	"slices"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
)

// The environment variables of the operator's additions to the run limits.
const (
	// EnvExtensions adds allowed file extensions, comma-separated
	// (".kt,.swift").
	EnvExtensions = "BELAY_EXTENSIONS"
	// EnvChecks adds allowlisted checks, separated by ";", each split on
	// spaces into an argv ("go test ./...;cargo test").
	EnvChecks = "BELAY_CHECKS"
)

// LimitsConfig is what the operator adds to belay.DefaultLimits: more file
// extensions a run may upload and more check commands it may ask for
// (DESIGN.md: "the operator may add more"). GET /v1/config tells clients.
type LimitsConfig struct {
	// Extensions are extra allowed file extensions, each a dot and up to
	// 16 letters, digits, "_" or "-" (".kt").
	Extensions []string
	// Checks are extra allowlisted argv arrays.
	Checks [][]string
}

// limitsConfigFromEnv reads EnvExtensions and EnvChecks through get.
func limitsConfigFromEnv(get func(string) string) LimitsConfig {
	var c LimitsConfig
	for e := range strings.SplitSeq(get(EnvExtensions), ",") {
		if e = strings.TrimSpace(e); e != "" {
			c.Extensions = append(c.Extensions, e)
		}
	}
	for cmd := range strings.SplitSeq(get(EnvChecks), ";") {
		if argv := strings.Fields(cmd); len(argv) > 0 {
			c.Checks = append(c.Checks, argv)
		}
	}
	return c
}

// runLimits returns the reference limits for model with the operator's
// additions. Returns an error naming the setting for an extension or a
// check that is not well formed.
func (c LimitsConfig) runLimits(model string) (belay.Limits, error) {
	lim := belay.DefaultLimits(model)
	for _, e := range c.Extensions {
		if !validExtension(e) {
			return belay.Limits{}, fmt.Errorf("%s (--allow-extension) %q is not an extension: write a dot and up to 16 letters, digits, _ or -, such as .kt", EnvExtensions, e)
		}
		if !lim.ExtensionAllowed("x" + e) {
			lim.Extensions = append(lim.Extensions, e)
		}
	}
	for _, argv := range c.Checks {
		if len(argv) == 0 || slices.Contains(argv, "") {
			return belay.Limits{}, fmt.Errorf("%s (--allow-check) has an empty command or argument", EnvChecks)
		}
		if !slices.ContainsFunc(lim.AllowedChecks, func(a []string) bool { return slices.Equal(a, argv) }) {
			lim.AllowedChecks = append(lim.AllowedChecks, slices.Clone(argv))
		}
	}
	return lim, nil
}

func validExtension(e string) bool {
	if len(e) < 2 || len(e) > 17 || e[0] != '.' {
		return false
	}
	for _, r := range e[1:] {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
