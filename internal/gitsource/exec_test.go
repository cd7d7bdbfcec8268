package gitsource_test

import (
	osexec "os/exec"
)

func exec(dir string, args ...string) *osexec.Cmd {
	cmd := osexec.Command("git", args...)
	cmd.Dir = dir
	return cmd
}
