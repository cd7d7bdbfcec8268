package localsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/belay-dev/belay/internal/hardening"
)

// prlimitPaths are where util-linux installs prlimit(1).
var prlimitPaths = []string{"/usr/bin/prlimit", "/bin/prlimit"}

// rlimit is one resource limit every sandbox process gets.
type rlimit struct {
	resource int
	option   string // prlimit(1)'s option
	value    uint64
}

// The limits are applied by starting the entry through prlimit(1), which
// lowers its own limits and then executes the entry, so the entry starts
// with them and everything it starts inherits them. Go cannot set a child's
// limits between fork and exec, and belay cannot lower another uid's limits
// from outside (prlimit(2) on a process of another uid needs
// CAP_SYS_RESOURCE, which containers often lack); lowering one's own limits
// needs no privilege.

// findPrlimit returns prlimit(1)'s path: a root-owned file in a root-owned
// folder that only root can write, since it runs before the entry.
func findPrlimit() (string, error) {
	for _, p := range prlimitPaths {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		for _, check := range []string{p, filepath.Dir(p)} {
			ci, err := os.Stat(check)
			if err != nil {
				return "", err
			}
			if st := ci.Sys().(*syscall.Stat_t); st.Uid != 0 || ci.Mode().Perm()&0o022 != 0 {
				return "", fmt.Errorf("%s is not root's alone (owner uid %d, mode %04o)", check, st.Uid, ci.Mode().Perm())
			}
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o001 == 0 {
			return "", fmt.Errorf("%s is not a program every user may run", p)
		}
		return p, nil
	}
	return "", errors.New("prlimit (util-linux) is not installed")
}

// sandboxLimits turns p into the limits every sandbox process gets, each
// at most this process's own hard limit (the entry starts from belay's
// limits and may only lower them). The process limit counts every process
// and thread of the real uid on the host, so it is applied only when each
// sandbox has a uid of its own (perUID); otherwise it would count the
// user's other processes too.
func sandboxLimits(p hardening.Profile, perUID bool) ([]rlimit, string) {
	want := []struct {
		resource int
		option   string
		value    uint64
		what     string
	}{
		{unix.RLIMIT_NPROC, "nproc", uint64(p.Processes), "%d processes and threads for its uid (RLIMIT_NPROC)"},
		{unix.RLIMIT_FSIZE, "fsize", uint64(p.FileSizeMiB) << 20, "files of at most %s (RLIMIT_FSIZE)"},
		{unix.RLIMIT_DATA, "data", uint64(p.MemoryMiB) << 20, "%s of data memory per process (RLIMIT_DATA)"},
		{unix.RLIMIT_NOFILE, "nofile", uint64(p.OpenFiles), "%d open files per process (RLIMIT_NOFILE)"},
		{unix.RLIMIT_CORE, "core", 0, "no core dumps (RLIMIT_CORE)"},
	}
	var lims []rlimit
	var parts []string
	for _, w := range want {
		if w.resource == unix.RLIMIT_NPROC && !perUID {
			continue
		}
		if w.value == 0 && w.resource != unix.RLIMIT_CORE {
			continue // not set in the profile
		}
		v := w.value
		var own unix.Rlimit
		capped := ""
		if err := unix.Getrlimit(w.resource, &own); err == nil && own.Max < v {
			v, capped = own.Max, " (belay's own hard limit)"
		}
		lims = append(lims, rlimit{resource: w.resource, option: w.option, value: v})
		var part string
		switch {
		case w.resource == unix.RLIMIT_CORE:
			part = w.what
		case strings.Contains(w.what, "%s"):
			part = fmt.Sprintf(w.what, mib(v))
		default:
			part = fmt.Sprintf(w.what, v)
		}
		parts = append(parts, part+capped)
	}
	return lims, "limits on every sandbox process: " + strings.Join(parts, ", ")
}

func mib(b uint64) string { return strconv.FormatUint(b>>20, 10) + " MiB" }

// prlimitArgs is the argv that starts argv under lims through prlimit.
func prlimitArgs(prlimit string, lims []rlimit, argv []string) []string {
	args := []string{prlimit}
	for _, l := range lims {
		v := strconv.FormatUint(l.value, 10)
		args = append(args, "--"+l.option+"="+v+":"+v)
	}
	return append(append(args, "--"), argv...)
}
