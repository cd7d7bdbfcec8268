package embedded

// FindSandboxBin exposes the sandbox lookup with its os functions passed in.
var FindSandboxBin = findSandboxBin
