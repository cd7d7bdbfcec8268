package embedded

// FindSandboxBin exposes the sandbox lookup with its os functions passed in.
var FindSandboxBin = findSandboxBin

// DefaultDataDirAs is DefaultDataDir for a process of effective uid euid.
var DefaultDataDirAs = defaultDataDir
