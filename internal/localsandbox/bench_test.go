//go:build linux

package localsandbox_test

import (
	"testing"
)

// BenchmarkLaunchWaitCleanup measures one sandbox's whole life with the
// test entry: workspace, socket server, start in the isolation this machine
// allows, exit, output read, cleanup.
func BenchmarkLaunchWaitCleanup(b *testing.B) {
	api, _ := recordingAPI(b)
	l, _, _ := newLauncher(b, "", api)
	spec := testSpec(b, "run_bench", "report 127.0.0.1:1")
	b.ReportAllocs()
	for b.Loop() {
		sb, err := l.Launch(b.Context(), spec)
		if err != nil {
			b.Fatal(err)
		}
		exit, err := sb.Wait(b.Context())
		if err != nil || exit.ExitCode != 0 {
			b.Fatalf("exit %d, %v", exit.ExitCode, err)
		}
		if err := sb.Cleanup(); err != nil {
			b.Fatal(err)
		}
	}
}
