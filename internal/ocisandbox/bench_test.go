package ocisandbox_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/ocisandbox"
	"github.com/belay-dev/belay/internal/ocisandbox/ocisandboxtest"
)

// fargatePullMBps is the download rate the pull-time estimate assumes for
// a Fargate task pulling from ECR in its region (through the VPC
// endpoint): a conservative figure; AWS does not publish one, and it
// varies with the task's size.
const fargatePullMBps = 50.0

// BenchmarkImage reports the sandbox image's size and what pulling it
// costs: compressed-MB (what a pull moves), unpacked-MB, unpack-s and
// unpack-cpu-s (read, verify, gunzip and write the layers here, as a
// runtime does after the download: wall time, and the CPU time it took,
// which a loaded machine inflates less) and fargate-pull-est-s, an
// estimate of Fargate's pull time: the download at fargatePullMBps plus
// the unpack's CPU time.
func BenchmarkImage(b *testing.B) {
	path := ocisandboxtest.Image(b)
	img, err := ocisandbox.OpenImage(path)
	if err != nil {
		b.Fatal(err)
	}
	var unpacked int64
	var total, cpu time.Duration
	for i := 0; i < b.N; i++ {
		cache := b.TempDir()
		start, startCPU := time.Now(), cpuTime(b)
		rootfs, err := img.Unpack(cache)
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		cpu += cpuTime(b) - startCPU
		if unpacked == 0 {
			_ = filepath.Walk(rootfs, func(_ string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					unpacked += fi.Size()
				}
				return nil
			})
		}
		b.StopTimer()
		_ = os.RemoveAll(cache)
		b.StartTimer()
	}
	unpackCPU := cpu.Seconds() / float64(b.N)
	mb := float64(img.CompressedBytes()) / 1e6
	b.ReportMetric(mb, "compressed-MB")
	b.ReportMetric(float64(unpacked)/1e6, "unpacked-MB")
	b.ReportMetric(total.Seconds()/float64(b.N), "unpack-s")
	b.ReportMetric(unpackCPU, "unpack-cpu-s")
	b.ReportMetric(mb/fargatePullMBps+unpackCPU, "fargate-pull-est-s")
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
