// Command imagespec prints the sandbox image's user, entrypoint, writable
// folders and Fargate's architecture as shell assignments, from
// hardening.Sandbox, for scripts/image.sh and the Makefile to build the
// image with: the numbers live once, in Go, and the image, the runc config
// and the Fargate task definition all follow them.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/belay-dev/belay/internal/hardening"
)

func main() {
	s := hardening.Sandbox
	if len(s.Entrypoint) != 1 {
		fmt.Fprintln(os.Stderr, "imagespec: hardening.Sandbox.Entrypoint must be one path (the entry takes no arguments in claim mode)")
		os.Exit(1)
	}
	for _, kv := range [][2]string{
		{"IMAGE_UID", strconv.Itoa(s.UID)},
		{"IMAGE_GID", strconv.Itoa(s.GID)},
		{"IMAGE_ENTRYPOINT", s.Entrypoint[0]},
		{"IMAGE_WORKSPACE", s.WorkspaceDir},
		{"IMAGE_TMP", s.TmpDir},
		{"IMAGE_FARGATE_ARCH", s.Architecture},
	} {
		fmt.Printf("%s=%s\n", kv[0], quote(kv[1]))
	}
}

// quote makes v one shell word.
func quote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
