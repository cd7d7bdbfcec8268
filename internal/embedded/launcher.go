package embedded

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/localsandbox"
	"github.com/belay-dev/belay/internal/ocisandbox"
)

// The launcher settings' environment variables.
const (
	// EnvLauncher chooses the sandbox launcher: LauncherOCI or
	// LauncherProcess (--launcher); empty picks LauncherOCI when it can
	// run here.
	EnvLauncher = "BELAY_LAUNCHER"
	// EnvAllowWeakIsolation, set to 1 (or true), accepts the process
	// launcher's weaker isolation (--allow-weak-isolation).
	EnvAllowWeakIsolation = "BELAY_ALLOW_WEAK_ISOLATION"
	// EnvSandboxImage is the sandbox image of the OCI launcher, an OCI
	// archive (--sandbox-image).
	EnvSandboxImage = "BELAY_SANDBOX_IMAGE"
	// EnvImageCache is where the OCI launcher unpacks the image
	// (--image-cache; Config.ImageCache).
	EnvImageCache = "BELAY_IMAGE_CACHE"
)

// The launchers `belay serve` can run sandboxes with.
const (
	// LauncherOCI runs each sandbox as the sandbox image under runc, with
	// the Fargate task definition's hardening (internal/ocisandbox).
	LauncherOCI = "oci"
	// LauncherProcess runs the sandbox entry as a namespaced host
	// subprocess (internal/localsandbox): weaker isolation, accepted only
	// with AllowWeakIsolation.
	LauncherProcess = "process"
)

// SandboxImageName is the sandbox image's file name, looked up beside the
// running executable (make image writes bin/belay-sandbox.oci.tar beside
// bin/belay).
const SandboxImageName = "belay-sandbox.oci.tar"

// WeakIsolation says plainly what running sandboxes with the process
// launcher accepts; `belay serve` prints it when it does.
const WeakIsolation = "the process launcher runs each sandbox as a host subprocess: " +
	"it shares the host's file system and /tmp (what its uid may read or write there), " +
	"sees the host's /proc (every process's command line), has no seccomp filter, " +
	"and can connect to the host's Unix sockets"

// howToGetOCI is what an operator does to get the OCI launcher.
const howToGetOCI = "build the image with make image (it writes bin/" + SandboxImageName + " beside bin/belay; or set " +
	EnvSandboxImage + " / --sandbox-image), install runc (Debian: apt-get install runc), and run belay serve as root"

// howToAcceptWeak is what an operator does to accept the process launcher.
const howToAcceptWeak = "pass --allow-weak-isolation (" + EnvAllowWeakIsolation + "=1) to accept it"

// launcherChoice is the launcher Main runs sandboxes with, and why.
type launcherChoice struct {
	kind  string
	why   string
	image string // LauncherOCI: the image archive
}

// machine is what chooseLauncher asks of the machine, passed in for tests.
type machine struct {
	euid       int
	executable func() (string, error)
	runtime    func() error // nil when runc is there
}

func thisMachine() machine {
	return machine{
		euid:       os.Geteuid(),
		executable: os.Executable,
		runtime: func() error {
			_, err := ocisandbox.FindRuntime("")
			return err
		},
	}
}

// chooseLauncher picks the launcher for cfg: the one cfg.Launcher names,
// or LauncherOCI when runc, the image and root are there; the process
// launcher only when cfg.AllowWeakIsolation accepts it. An error says
// what is missing and how to get it, or how to accept weaker isolation.
func chooseLauncher(cfg Config, m machine) (launcherChoice, error) {
	image, ociErr := ociAvailable(cfg, m)
	switch cfg.Launcher {
	case LauncherOCI:
		if ociErr != nil {
			return launcherChoice{}, fmt.Errorf("%s (--launcher) is %s, and the OCI launcher cannot run here: %w; %s",
				EnvLauncher, LauncherOCI, ociErr, howToGetOCI)
		}
		return launcherChoice{kind: LauncherOCI, image: image, why: "chosen by " + EnvLauncher + " (--launcher)"}, nil
	case LauncherProcess:
		if !cfg.AllowWeakIsolation {
			return launcherChoice{}, fmt.Errorf("%s (--launcher) is %s, which gives weaker isolation (%s); %s, or use the OCI launcher: %s",
				EnvLauncher, LauncherProcess, WeakIsolation, howToAcceptWeak, howToGetOCI)
		}
		return launcherChoice{kind: LauncherProcess, why: "chosen by " + EnvLauncher + " (--launcher), weaker isolation accepted by " + EnvAllowWeakIsolation}, nil
	case "":
		if ociErr == nil {
			return launcherChoice{kind: LauncherOCI, image: image, why: "runc and the sandbox image are here"}, nil
		}
		if cfg.AllowWeakIsolation {
			return launcherChoice{kind: LauncherProcess,
				why: fmt.Sprintf("the OCI launcher cannot run here (%v), and %s accepts weaker isolation", ociErr, EnvAllowWeakIsolation)}, nil
		}
		return launcherChoice{}, fmt.Errorf("no sandbox launcher: the OCI launcher cannot run here: %w. To get it, %s. "+
			"Or accept the process launcher's weaker isolation (%s): %s", ociErr, howToGetOCI, WeakIsolation, howToAcceptWeak)
	default:
		return launcherChoice{}, fmt.Errorf("%s (--launcher) %q is neither %s nor %s", EnvLauncher, cfg.Launcher, LauncherOCI, LauncherProcess)
	}
}

// ociAvailable finds the sandbox image and checks that runc is there and
// that this process runs as root.
func ociAvailable(cfg Config, m machine) (string, error) {
	var problems []string
	image, err := findSandboxImage(cfg.SandboxImage, m.executable)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if err := m.runtime(); err != nil {
		problems = append(problems, err.Error())
	}
	if m.euid != 0 {
		problems = append(problems, fmt.Sprintf("it needs root to make namespaces, mounts and cgroups, and this process runs as uid %d", m.euid))
	}
	if len(problems) > 0 {
		return "", errors.New(strings.Join(problems, "; "))
	}
	return image, nil
}

// findSandboxImage returns the configured image, else belay-sandbox.oci.tar
// beside the running executable.
func findSandboxImage(configured string, executable func() (string, error)) (string, error) {
	if configured != "" {
		abs, err := filepath.Abs(configured)
		if err != nil {
			return "", fmt.Errorf("%s (--sandbox-image) %s: %w", EnvSandboxImage, configured, err)
		}
		if err := checkRegular(abs); err != nil {
			return "", fmt.Errorf("%s (--sandbox-image): %w", EnvSandboxImage, err)
		}
		return abs, nil
	}
	exe, err := executable()
	if err != nil {
		return "", fmt.Errorf("no sandbox image: %s is not set and the executable's folder is unknown: %w", EnvSandboxImage, err)
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	beside := filepath.Join(filepath.Dir(exe), SandboxImageName)
	if err := checkRegular(beside); err != nil {
		return "", fmt.Errorf("no sandbox image at %s (%s is not set)", beside, EnvSandboxImage)
	}
	return beside, nil
}

func checkRegular(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// parseBool reads a boolean environment value: 1, true, yes or on.
func parseBool(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// isolatingLauncher is a launcher that says how it isolates sandboxes,
// and what it could not apply.
type isolatingLauncher interface {
	belay.Launcher
	Isolation() []string
	NotApplied() []string
}

// newLauncher builds the chosen launcher, serving internal to each
// sandbox, and says so in the log, with the weaker isolation spelled out
// when it is the process launcher. The returned function releases it.
func (m *Main) newLauncher(internal http.Handler) (isolatingLauncher, func() error, error) {
	switch m.launcher.kind {
	case LauncherOCI:
		l, err := ocisandbox.New(ocisandbox.Config{
			Image:      m.launcher.image,
			ImageCache: m.cfg.ImageCache,
			StateDir:   filepath.Join(m.cfg.DataDir, ociDir),
			WorkRoot:   m.cfg.SandboxDir,
			Internal:   internal,
			Logger:     m.log,
			Now:        m.now,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("OCI launcher: %w", err)
		}
		m.log.Info("sandbox launcher: oci", "why", m.launcher.why, "image", m.launcher.image, "digest", l.Image().Digest)
		return l, l.Close, nil
	default:
		l, err := localsandbox.New(localsandbox.Config{
			EntryPath: m.sandboxBin,
			WorkRoot:  m.cfg.SandboxDir,
			Internal:  internal,
			Isolation: m.cfg.Isolation,
			Logger:    m.log,
			Now:       m.now,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w (set %s or --sandbox-dir to move the sandbox workspaces)", err, EnvSandboxDir)
		}
		m.log.Warn("sandbox launcher: process, with weaker isolation: "+WeakIsolation, "why", m.launcher.why)
		return l, func() error { return nil }, nil
	}
}
