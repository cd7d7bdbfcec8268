package dynamo_test

import (
	"testing"

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
