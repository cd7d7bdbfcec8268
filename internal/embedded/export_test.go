package embedded

// FindSandboxBin exposes the sandbox lookup with its os functions passed in.
var FindSandboxBin = findSandboxBin

// DefaultDataDirAs is DefaultDataDir for a process of effective uid euid.
var DefaultDataDirAs = defaultDataDir

// ChooseLauncher exposes the launcher choice with the machine's facts
// passed in: the effective uid, the executable's path, and runc's lookup.
func ChooseLauncher(cfg Config, euid int, exe string, runtimeErr error) (kind, why, image string, err error) {
	c, err := chooseLauncher(cfg, machine{
		euid:       euid,
		executable: func() (string, error) { return exe, nil },
		runtime:    func() error { return runtimeErr },
	})
	return c.kind, c.why, c.image, err
}
