package functions_test

import (
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/rie"
)

// BenchmarkColdStart starts each bootstrap under a fresh emulator and
// invokes it once, reporting the init phase's duration the emulator
// measured (from starting the process until its runtime asked for the
// first event): on average (init-ms/op) and the least of the runs
// (min-init-ms). Init reads no peer (clients connect lazily), so the
// endpoints point at a closed port.
func BenchmarkColdStart(b *testing.B) {
	env := map[string]string{
		"BELAY_TABLE": "t", "BELAY_BUCKET": "b", "BELAY_MODEL": testModel,
		"BELAY_AWS_ENDPOINT": "http://127.0.0.1:9", "BELAY_TOKEN": controlToken, "BELAY_SIGNING_KEY": signingKey,
		"BELAY_MODEL_API_KEY": "sk-bench", "BELAY_MODEL_API_URL": "https://127.0.0.1:9/v1/chat/completions",
		"BELAY_STATE_MACHINE_ARN": stateMachine, "BELAY_CLUSTER_ARN": clusterARN,
	}
	events := map[string][]byte{
		"api":        []byte(`{"httpMethod":"GET","path":"/nowhere","requestContext":{"requestId":"bench"}}`),
		"stream":     []byte(`{"httpMethod":"GET","path":"/nowhere","requestContext":{"requestId":"bench"}}`),
		"modelproxy": []byte(`{"httpMethod":"GET","path":"/nowhere","requestContext":{"requestId":"bench"}}`),
		"sandboxapi": []byte(`{"httpMethod":"GET","path":"/nowhere","requestContext":{"requestId":"bench"}}`),
		"steps":      []byte(`{"step":"none","runId":"run_bench"}`),
		"cleanup":    []byte(`{"source":"aws.events","detail-type":"Scheduled Event","detail":{}}`),
	}
	for _, name := range []string{"api", "stream", "modelproxy", "sandboxapi", "steps", "cleanup"} {
		b.Run(name, func(b *testing.B) {
			rie.Bootstrap(b, name) // build before the clock runs
			var total, least time.Duration
			for b.Loop() {
				fn := rie.Start(b, name, env)
				fn.Invoke(b, events[name])
				d, ok := fn.InitDuration()
				if !ok {
					b.Fatalf("%s: no init duration in the log:\n%s", name, fn.Logs())
				}
				total += d
				if least == 0 || d < least {
					least = d
				}
				fn.Stop()
			}
			b.ReportMetric(float64(total)/float64(time.Millisecond)/float64(b.N), "init-ms/op")
			// The least is the one least disturbed by whatever else the
			// machine was doing.
			b.ReportMetric(float64(least)/float64(time.Millisecond), "min-init-ms")
		})
	}
}
