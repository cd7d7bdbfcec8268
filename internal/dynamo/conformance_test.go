package dynamo_test

import (
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/storetest"
)

// openStore gives the conformance suite a store on a fresh table.
func openStore(tb testing.TB, opts storetest.Options) belay.Store {
	tb.Helper()
	return newPeer(tb, dynamo.Options{EventBufferSize: opts.EventBufferSize}).store
}

func TestConformance(t *testing.T) {
	storetest.Run(t, openStore)
}

func BenchmarkConsume(b *testing.B) {
	storetest.BenchmarkConsume(b, openStore)
}

// BenchmarkConsumeParallel measures consumes from many goroutines on one
// capability: the model proxy under load, where every consume is a
// conditional write to the same item.
func BenchmarkConsumeParallel(b *testing.B) {
	p := newPeer(b, dynamo.Options{})
	ctx := b.Context()
	mustCreate(b, p.store, newRun("run-bench", t0))
	if err := p.store.ActivateCapability(ctx, belay.Capability{RunID: "run-bench", Model: "test-model", ExpiresAt: t0.Add(time.Hour), MaxRequests: 1 << 30}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := p.store.ConsumeModelRequest(ctx, "run-bench", "test-model", t0)
			if err != nil || res.Outcome != belay.ConsumeOK {
				b.Errorf("consume = %+v, %v", res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
