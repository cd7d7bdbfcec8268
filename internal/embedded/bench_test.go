package embedded_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/scriptedmodel"
)

// minStartSamples is the fewest runs BenchmarkRunStart measures, so its
// p95 means something even when the benchmark runs once.
const minStartSamples = 20

// BenchmarkRunStart measures what a caller waits for before the agent is
// at work: from POST /v1/runs until a streaming client sees the run's
// sandbox.ready event, through Main with the real launcher and entry (as
// root: its own uid and namespaces). Each run then finishes (one scripted
// finish, the git diff --check check) before the next one starts. It
// reports the p50 and p95 of the waits in milliseconds, over b.N runs and
// at least minStartSamples, and ns/op as their mean. The stream polls the
// store (httpapi.DefaultEventsPollInterval), so the waits include up to
// one poll; p50-stamped-ms and p95-stamped-ms are the same from the time
// the sandbox stamped on the event, which leaves the poll out.
//
// It runs once per launcher, in the same benchmark run so the two compare
// on the same machine at the same time: launcher=process (the entry as a
// namespaced subprocess) and launcher=oci (the image under runc, the
// entry in claim mode; skipped outside CI without the image).
func BenchmarkRunStart(b *testing.B) {
	script := scriptedmodel.Script{Name: "finish at once", Steps: []scriptedmodel.Step{finish("Nothing to do.")}}
	b.Run("launcher=process", func(b *testing.B) {
		benchmarkRunStart(b, startWith(b, newProvider(b, script, 0), nil, ""))
	})
	b.Run("launcher=oci", func(b *testing.B) {
		benchmarkRunStart(b, startOCI(b, newProvider(b, script, 0), nil))
	})
}

func benchmarkRunStart(b *testing.B, pl plane) {
	req := calcRequest(b)
	req.Checks = [][]string{{"git", "diff", "--check"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	n := max(b.N, minStartSamples)
	waits := make([]time.Duration, 0, n)
	stamped := make([]time.Duration, 0, n)
	b.ResetTimer()
	for range n {
		start := time.Now()
		created, err := pl.c.CreateRun(ctx, req, "")
		if err != nil {
			b.Fatal(err)
		}
		var ready, readyAt time.Duration
		var last belay.Event
		if err := pl.c.StreamEvents(ctx, created.RunID, 0, func(e belay.Event) error {
			if e.Type == belay.EventSandboxReady && ready == 0 {
				ready = time.Since(start)
				readyAt = e.Time.Sub(start)
			}
			last = e
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if ready == 0 || last.Type != belay.EventRunCompleted {
			b.Fatalf("run %s: sandbox.ready seen: %v; last event %s %s; want run.completed", created.RunID, ready > 0, last.Type, last.Data)
		}
		waits = append(waits, ready)
		stamped = append(stamped, readyAt)
	}
	b.StopTimer()

	var total time.Duration
	for _, w := range waits {
		total += w
	}
	slices.Sort(waits)
	slices.Sort(stamped)
	b.ReportMetric(float64(total.Nanoseconds())/float64(len(waits)), "ns/op")
	b.ReportMetric(millis(percentile(waits, 50)), "p50-ms")
	b.ReportMetric(millis(percentile(waits, 95)), "p95-ms")
	b.ReportMetric(millis(percentile(stamped, 50)), "p50-stamped-ms")
	b.ReportMetric(millis(percentile(stamped, 95)), "p95-stamped-ms")
}

// percentile returns the nearest-rank pth percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
