package embedded_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/belay-dev/belay/internal/embedded"
)

// TestChooseLauncher: the OCI launcher whenever it can run; the process
// launcher only when weaker isolation is accepted; otherwise a refusal
// that says how to get the one or accept the other.
func TestChooseLauncher(t *testing.T) {
	bin := t.TempDir()
	exe := filepath.Join(bin, "belay")
	image := filepath.Join(bin, embedded.SandboxImageName)
	if err := os.WriteFile(image, []byte("archive"), 0o644); err != nil {
		t.Fatal(err)
	}
	noImage := filepath.Join(t.TempDir(), "belay")
	noRunc := errors.New("the OCI launcher needs runc, and runc was not found (Debian: apt-get install runc)")
	tests := []struct {
		name       string
		cfg        embedded.Config
		euid       int
		exe        string
		runtimeErr error
		kind       string
		image      string
		err        []string // parts of the error, in order
	}{
		{name: "everything here", euid: 0, exe: exe, kind: embedded.LauncherOCI, image: image},
		{name: "an image named", cfg: embedded.Config{SandboxImage: image}, euid: 0, exe: noImage, kind: embedded.LauncherOCI, image: image},
		{name: "oci even when weak is accepted", cfg: embedded.Config{AllowWeakIsolation: true}, euid: 0, exe: exe, kind: embedded.LauncherOCI, image: image},
		{name: "no image", euid: 0, exe: noImage,
			err: []string{"no sandbox launcher", "no sandbox image at", "make image", "apt-get install runc", "shares the host's file system and /tmp", "host's /proc", "no seccomp", "Unix sockets", "--allow-weak-isolation (BELAY_ALLOW_WEAK_ISOLATION=1)"}},
		{name: "no runc", euid: 0, exe: exe, runtimeErr: noRunc, err: []string{"no sandbox launcher", "apt-get install runc", "--allow-weak-isolation"}},
		{name: "not root", euid: 1000, exe: exe, err: []string{"needs root", "uid 1000", "--allow-weak-isolation"}},
		{name: "no image, weak accepted", cfg: embedded.Config{AllowWeakIsolation: true}, euid: 0, exe: noImage, kind: embedded.LauncherProcess},
		{name: "oci asked, no runc", cfg: embedded.Config{Launcher: "oci", AllowWeakIsolation: true}, euid: 0, exe: exe, runtimeErr: noRunc,
			err: []string{"BELAY_LAUNCHER (--launcher) is oci", "runc was not found", "make image"}},
		{name: "process asked, not accepted", cfg: embedded.Config{Launcher: "process"}, euid: 0, exe: exe,
			err: []string{"is process, which gives weaker isolation", "--allow-weak-isolation", "make image"}},
		{name: "process asked and accepted", cfg: embedded.Config{Launcher: "process", AllowWeakIsolation: true}, euid: 0, exe: exe, kind: embedded.LauncherProcess},
		{name: "unknown", cfg: embedded.Config{Launcher: "docker", AllowWeakIsolation: true}, euid: 0, exe: exe, err: []string{`"docker" is neither oci nor process`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, why, img, err := embedded.ChooseLauncher(tt.cfg, tt.euid, tt.exe, tt.runtimeErr)
			if len(tt.err) > 0 {
				if err == nil {
					t.Fatalf("chose %s (%s), want an error", kind, why)
				}
				rest := err.Error()
				for _, part := range tt.err {
					i := strings.Index(rest, part)
					if i < 0 {
						t.Fatalf("error %q lacks %q (in order)", err, part)
					}
					rest = rest[i+len(part):]
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v, want %s", err, tt.kind)
			}
			if kind != tt.kind || img != tt.image || why == "" {
				t.Errorf("chose %s (%s) image %q; want %s image %q", kind, why, img, tt.kind, tt.image)
			}
		})
	}
}

func TestConfigFromEnvLauncher(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, "yes": true, "0": false, "": false, "no": false} {
		env := map[string]string{embedded.EnvLauncher: "oci", embedded.EnvSandboxImage: "/srv/img.tar", embedded.EnvAllowWeakIsolation: v}
		cfg := embedded.ConfigFromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if cfg.Launcher != "oci" || cfg.SandboxImage != "/srv/img.tar" || cfg.AllowWeakIsolation != want {
			t.Errorf("%s=%q: launcher %q image %q weak %v; want oci, /srv/img.tar, %v", embedded.EnvAllowWeakIsolation, v, cfg.Launcher, cfg.SandboxImage, cfg.AllowWeakIsolation, want)
		}
	}
}
