package ocisandbox_test

import (
	"os"
	"path/filepath"
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
// costs: compressed-MB (what a pull moves), unpacked-MB, unpack-s (read,
// verify, gunzip and write the layers here, as a runtime does after the
// download) and fargate-pull-est-s, an estimate of Fargate's pull time:
// the download at fargatePullMBps plus the unpack measured here.
func BenchmarkImage(b *testing.B) {
	path := ocisandboxtest.Image(b)
	img, err := ocisandbox.OpenImage(path)
	if err != nil {
		b.Fatal(err)
	}
	var unpacked int64
	var total time.Duration
	for i := 0; i < b.N; i++ {
		cache := b.TempDir()
		start := time.Now()
		rootfs, err := img.Unpack(cache)
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
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
	unpack := total.Seconds() / float64(b.N)
	mb := float64(img.CompressedBytes()) / 1e6
	b.ReportMetric(mb, "compressed-MB")
	b.ReportMetric(float64(unpacked)/1e6, "unpacked-MB")
	b.ReportMetric(unpack, "unpack-s")
	b.ReportMetric(mb/fargatePullMBps+unpack, "fargate-pull-est-s")
}
