package belay_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/belay"
)

func TestParseOperatorLimits(t *testing.T) {
	o := belay.ParseOperatorLimits(" .kt, ,.KTS,", "gradle test; ;go  test ./...;")
	if !slices.Equal(o.Extensions, []string{".kt", ".KTS"}) {
		t.Errorf("extensions %q", o.Extensions)
	}
	if len(o.Checks) != 2 || !slices.Equal(o.Checks[0], []string{"gradle", "test"}) || !slices.Equal(o.Checks[1], []string{"go", "test", "./..."}) {
		t.Errorf("checks %q", o.Checks)
	}
	if empty := belay.ParseOperatorLimits("", ""); empty.Extensions != nil || empty.Checks != nil {
		t.Errorf("nothing written: %+v", empty)
	}
	if argv := belay.ParseCheck("  "); len(argv) != 0 {
		t.Errorf("ParseCheck of a blank command = %q", argv)
	}
}

func TestOperatorLimitsApply(t *testing.T) {
	def := belay.DefaultLimits("m")
	o := belay.OperatorLimits{
		Extensions: []string{".kt", ".PY"}, // .py is already allowed, in any case
		Checks:     [][]string{{"go", "test", "./..."}, def.AllowedChecks[0]},
	}
	lim, err := o.Apply(def, "EXT", "CHK")
	if err != nil {
		t.Fatal(err)
	}
	if len(lim.Extensions) != len(def.Extensions)+1 || !lim.ExtensionAllowed("Main.kt") {
		t.Errorf("extensions %q: want the defaults and .kt once", lim.Extensions)
	}
	if len(lim.AllowedChecks) != len(def.AllowedChecks)+1 || !slices.Equal(lim.AllowedChecks[len(lim.AllowedChecks)-1], []string{"go", "test", "./..."}) {
		t.Errorf("checks %q: want the defaults and go test once", lim.AllowedChecks)
	}
	if again := belay.DefaultLimits("m"); len(again.Extensions) != len(def.Extensions) || len(def.AllowedChecks) != len(again.AllowedChecks) {
		t.Error("Apply changed the limits it was given")
	}

	for name, tt := range map[string]struct {
		o    belay.OperatorLimits
		want string
	}{
		"no dot":       {belay.OperatorLimits{Extensions: []string{"kt"}}, `EXT "kt" is not an extension`},
		"too long":     {belay.OperatorLimits{Extensions: []string{"." + strings.Repeat("a", 17)}}, "is not an extension"},
		"a slash":      {belay.OperatorLimits{Extensions: []string{".k/t"}}, "is not an extension"},
		"empty check":  {belay.OperatorLimits{Checks: [][]string{{}}}, "CHK has an empty command or argument"},
		"empty argv[]": {belay.OperatorLimits{Checks: [][]string{{"go", ""}}}, "CHK has an empty command or argument"},
	} {
		if _, err := tt.o.Apply(def, "EXT", "CHK"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tt.want)
		}
	}
}
