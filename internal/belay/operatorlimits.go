package belay

import (
	"fmt"
	"slices"
	"strings"
)

// OperatorLimits is what an operator adds to DefaultLimits: more file
// extensions a run may upload and more check commands it may ask for
// (DESIGN.md: "the operator may add more"). belay serve reads it from
// BELAY_EXTENSIONS and BELAY_CHECKS (and --allow-extension, --allow-check),
// the Lambda functions from the same variables; GET /v1/config tells
// clients what came of it.
type OperatorLimits struct {
	// Extensions are extra allowed file extensions, each a dot and up to
	// 16 letters, digits, "_" or "-" (".kt").
	Extensions []string
	// Checks are extra allowlisted argv arrays.
	Checks [][]string
}

// ParseOperatorLimits reads the operator's additions in their written
// form: extensions comma-separated (".kt,.swift"), checks separated by
// ";" and each split on spaces (ParseCheck: "go test ./...;cargo test").
// Empty entries are skipped; Apply judges the rest.
func ParseOperatorLimits(extensions, checks string) OperatorLimits {
	var o OperatorLimits
	for e := range strings.SplitSeq(extensions, ",") {
		if e = strings.TrimSpace(e); e != "" {
			o.Extensions = append(o.Extensions, e)
		}
	}
	for cmd := range strings.SplitSeq(checks, ";") {
		if argv := ParseCheck(cmd); len(argv) > 0 {
			o.Checks = append(o.Checks, argv)
		}
	}
	return o
}

// ParseCheck splits one written check command on spaces into its argv
// (no shell, no quoting: an allowlisted check is matched element-wise).
// An empty or blank command gives an empty argv.
func ParseCheck(cmd string) []string { return strings.Fields(cmd) }

// Apply returns lim with the additions (each once). The errors name the
// setting they came from as the caller calls it (extensionsSetting,
// checksSetting: an environment variable, a flag), for an extension that
// is not well formed or a check with an empty command or argument.
func (o OperatorLimits) Apply(lim Limits, extensionsSetting, checksSetting string) (Limits, error) {
	lim.Extensions = slices.Clone(lim.Extensions)
	lim.AllowedChecks = slices.Clone(lim.AllowedChecks)
	for _, e := range o.Extensions {
		if !validExtension(e) {
			return Limits{}, fmt.Errorf("%s %q is not an extension: write a dot and up to 16 letters, digits, _ or -, such as .kt", extensionsSetting, e)
		}
		if !lim.ExtensionAllowed("x" + e) {
			lim.Extensions = append(lim.Extensions, e)
		}
	}
	for _, argv := range o.Checks {
		if len(argv) == 0 || slices.Contains(argv, "") {
			return Limits{}, fmt.Errorf("%s has an empty command or argument", checksSetting)
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
