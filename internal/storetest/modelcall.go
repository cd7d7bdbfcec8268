package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// testCall is the shape of a proxied call the suite records.
var testCall = belay.ModelCall{Model: testModel, Messages: 3, Tools: 8, MaxTokens: 4096}

// spend spends one request with testCall at now and returns the result.
func spend(tb testing.TB, s belay.Store, runID string, call belay.ModelCall, now int) belay.ConsumeResult {
	tb.Helper()
	res, err := s.SpendModelRequest(tb.Context(), runID, call, at(now))
	if err != nil {
		tb.Fatalf("SpendModelRequest(%s): %v", runID, err)
	}
	return res
}

// responseEvent is a model.response event as the proxy writes it.
func responseEvent(sec int) belay.EventInput {
	return belay.EventInput{Time: at(sec), Type: belay.EventModelResponse, Data: json.RawMessage(`{"finishReason":"tool_calls","usage":{"promptTokens":11,"completionTokens":7}}`)}
}

// wantUnchanged fails the test unless the run's log and usage are as before.
func wantUnchanged(tb testing.TB, s belay.Store, what string, before belay.Run, beforeLog belay.EventPage) {
	tb.Helper()
	after := mustGet(tb, s, before.ID)
	if after.LastSeq != before.LastSeq || after.Usage != before.Usage {
		tb.Fatalf("%s: run changed: lastSeq %d → %d, usage %+v → %+v", what, before.LastSeq, after.LastSeq, before.Usage, after.Usage)
	}
	sameEvents(tb, what+": log", allEvents(tb, s, before.ID).Events, beforeLog.Events)
}

func testModelCalls(t *testing.T, open opener) {
	t.Run("spend_appends_model_request", func(t *testing.T) {
		s := open(t, Options{})
		run := createIn(t, s, "run-mc", belay.StatusRunning) // seq 1, 2
		c := newCapability(run.ID, 3, at(600))
		mustActivate(t, s, c)
		for i, want := range []int{2, 1, 0} {
			res := spend(t, s, run.ID, testCall, 20+i)
			if res.Outcome != belay.ConsumeOK || res.Remaining != want {
				t.Fatalf("spend %d = %+v, want ok with %d left", i, res, want)
			}
		}
		wantCapability(t, s, c, belay.CapabilityActive, 3)
		log := allEvents(t, s, run.ID)
		want := slices.Clone(log.Events[:2])
		for i, left := range []int{2, 1, 0} {
			in := belay.ModelRequestEvent(at(20+i), testCall, left)
			want = append(want, belay.Event{Seq: int64(3 + i), Time: in.Time, Type: in.Type, Source: belay.SourceControl, Data: in.Data})
		}
		sameEvents(t, "log after three spends", log.Events, want)
		if got := mustGet(t, s, run.ID); got.LastSeq != 5 {
			t.Fatalf("run lastSeq = %d, want 5", got.LastSeq)
		}

		// The budget is spent: exhausted, and nothing more is written.
		before, beforeLog := mustGet(t, s, run.ID), allEvents(t, s, run.ID)
		if res := spend(t, s, run.ID, testCall, 30); res.Outcome != belay.ConsumeExhausted || res.Remaining != 0 {
			t.Fatalf("spend past the budget = %+v, want exhausted", res)
		}
		wantUnchanged(t, s, "exhausted spend", before, beforeLog)
		wantCapability(t, s, c, belay.CapabilityActive, 3)
	})

	t.Run("spend_refusals_write_nothing", func(t *testing.T) {
		otherModel := testCall
		otherModel.Model = "other-model"
		tests := []struct {
			name    string
			setup   func(tb testing.TB, s belay.Store, id string)
			call    belay.ModelCall
			now     int
			outcome belay.ConsumeOutcome
			left    int
		}{
			{"no capability", func(tb testing.TB, s belay.Store, id string) {}, testCall, 20, belay.ConsumeInactive, 0},
			{"revoked", func(tb testing.TB, s belay.Store, id string) {
				mustActivate(tb, s, newCapability(id, 5, at(600)))
				if err := s.RevokeCapability(tb.Context(), id); err != nil {
					tb.Fatal(err)
				}
			}, testCall, 20, belay.ConsumeInactive, 0},
			{"other model", func(tb testing.TB, s belay.Store, id string) {
				mustActivate(tb, s, newCapability(id, 5, at(600)))
			}, otherModel, 20, belay.ConsumeInactive, 0},
			{"expired", func(tb testing.TB, s belay.Store, id string) {
				mustActivate(tb, s, newCapability(id, 5, at(600)))
			}, testCall, 600, belay.ConsumeExpired, 5},
			{"run ended, capability still active", func(tb testing.TB, s belay.Store, id string) {
				mustActivate(tb, s, newCapability(id, 5, at(600)))
				mustTransition(tb, s, id, belay.StatusCompleted, at(40))
			}, testCall, 50, belay.ConsumeInactive, 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				s := open(t, Options{})
				run := createIn(t, s, "run-mr", belay.StatusRunning)
				tt.setup(t, s, run.ID)
				before, beforeLog := mustGet(t, s, run.ID), allEvents(t, s, run.ID)
				res := spend(t, s, run.ID, tt.call, tt.now)
				if res.Outcome != tt.outcome || res.Remaining != tt.left {
					t.Fatalf("spend = %+v, want %s with %d left", res, tt.outcome, tt.left)
				}
				wantUnchanged(t, s, tt.name, before, beforeLog)
				if c, err := s.GetCapability(t.Context(), run.ID); err == nil && c.UsedRequests != 0 {
					t.Fatalf("%s: the refused spend was counted: %+v", tt.name, c)
				}
			})
		}
		s := open(t, Options{})
		if res := spend(t, s, "run-missing", testCall, 20); res.Outcome != belay.ConsumeInactive {
			t.Fatalf("spend for a missing run = %+v, want inactive", res)
		}
	})

	t.Run("record_response", func(t *testing.T) {
		s := open(t, Options{})
		run := createIn(t, s, "run-rr", belay.StatusRunning) // seq 1, 2
		mustActivate(t, s, newCapability(run.ID, 5, at(600)))
		spend(t, s, run.ID, testCall, 20) // seq 3
		d := belay.UsageDelta{ModelRequests: 1, PromptTokens: 11, CompletionTokens: 7}
		appended, err := s.RecordModelResponse(t.Context(), run.ID, d, responseEvent(21))
		if err != nil || !appended {
			t.Fatalf("RecordModelResponse = %v, %v; want appended", appended, err)
		}
		got := mustGet(t, s, run.ID)
		if want := (belay.Usage{ModelRequests: 1, MaxRequests: run.Usage.MaxRequests, PromptTokens: 11, CompletionTokens: 7}); got.Usage != want || got.LastSeq != 4 {
			t.Fatalf("after the response: usage %+v lastSeq %d; want %+v, 4", got.Usage, got.LastSeq, want)
		}
		log := allEvents(t, s, run.ID)
		in := responseEvent(21)
		sameEvents(t, "the response event", log.Events[3:], []belay.Event{{Seq: 4, Time: in.Time, Type: in.Type, Source: belay.SourceControl, Data: in.Data}})

		// A malformed event adds nothing, not even the usage.
		before, beforeLog := mustGet(t, s, run.ID), allEvents(t, s, run.ID)
		_, err = s.RecordModelResponse(t.Context(), run.ID, d, belay.EventInput{Time: at(22), Type: ""})
		wantCode(t, err, belay.CodeInvalid, "RecordModelResponse with an event without a type")
		wantUnchanged(t, s, "a refused response", before, beforeLog)

		// The run ends while the call is upstream: the usage still counts
		// (the request was paid for); the ended log gets nothing.
		mustTransition(t, s, run.ID, belay.StatusFailed, at(30)) // seq 5
		before, beforeLog = mustGet(t, s, run.ID), allEvents(t, s, run.ID)
		appended, err = s.RecordModelResponse(t.Context(), run.ID, d, responseEvent(31))
		if err != nil || appended {
			t.Fatalf("RecordModelResponse after the run ended = %v, %v; want not appended, no error", appended, err)
		}
		after := mustGet(t, s, run.ID)
		if after.Usage.ModelRequests != 2 || after.Usage.PromptTokens != 22 || after.Usage.CompletionTokens != 14 || after.LastSeq != before.LastSeq {
			t.Fatalf("after a response to an ended run: usage %+v lastSeq %d; want the usage added and lastSeq %d", after.Usage, after.LastSeq, before.LastSeq)
		}
		sameEvents(t, "the ended run's log", allEvents(t, s, run.ID).Events, beforeLog.Events)
		if after.Status != belay.StatusFailed || !after.FinishedAt.Equal(before.FinishedAt) {
			t.Fatalf("the ended run changed: %s, finished %v", after.Status, after.FinishedAt)
		}

		_, err = s.RecordModelResponse(t.Context(), "run-missing", d, responseEvent(40))
		wantCode(t, err, belay.CodeNotFound, "RecordModelResponse for a missing run")
	})

	t.Run("buffer", func(t *testing.T) {
		s := open(t, Options{EventBufferSize: 4})
		run := createIn(t, s, "run-mb", belay.StatusRunning) // seq 1, 2
		mustActivate(t, s, newCapability(run.ID, 10, at(600)))
		for i := range 3 {
			spend(t, s, run.ID, testCall, 20+2*i) // seq 3, 5, 7
			if _, err := s.RecordModelResponse(t.Context(), run.ID, belay.UsageDelta{ModelRequests: 1}, responseEvent(21+2*i)); err != nil {
				t.Fatal(err) // seq 4, 6, 8
			}
		}
		log := allEvents(t, s, run.ID)
		if got := eventSeqs(log.Events); !slices.Equal(got, seqRange(5, 8)) || log.OldestSeq != 5 || log.LastSeq != 8 {
			t.Fatalf("a buffer of 4 after 8 events keeps %v (oldest %d, last %d); want 5..8", got, log.OldestSeq, log.LastSeq)
		}
		if got := eventTypes(log.Events); !slices.Equal(got, []string{belay.EventModelRequest, belay.EventModelResponse, belay.EventModelRequest, belay.EventModelResponse}) {
			t.Fatalf("kept %v", got)
		}
	})

	t.Run("concurrent_spends", func(t *testing.T) {
		s := open(t, Options{})
		run := createIn(t, s, "run-mcc", belay.StatusRunning) // seq 1, 2
		c := newCapability(run.ID, 20, at(600))
		mustActivate(t, s, c)
		// Spends, responses and sandbox events race on one run.
		const spenders, appenders = 40, 10
		results := make([]belay.ConsumeResult, spenders)
		errs := parallel(spenders+appenders, func(i int) error {
			if i >= spenders {
				_, err := s.AppendEvents(t.Context(), run.ID, "", toolEvents(1, 100+i))
				return err
			}
			var err error
			if results[i], err = s.SpendModelRequest(t.Context(), run.ID, testCall, at(20)); err != nil || results[i].Outcome != belay.ConsumeOK {
				return err
			}
			_, err = s.RecordModelResponse(t.Context(), run.ID, belay.UsageDelta{ModelRequests: 1, PromptTokens: 1}, responseEvent(21))
			return err
		})
		var remaining []int
		for i, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
			if i < spenders && results[i].Outcome == belay.ConsumeOK {
				remaining = append(remaining, results[i].Remaining)
			} else if i < spenders && results[i].Outcome != belay.ConsumeExhausted {
				t.Fatalf("spend %d = %+v, want ok or exhausted", i, results[i])
			}
		}
		slices.Sort(remaining)
		if !slices.Equal(remaining, seqInts(0, 19)) {
			t.Fatalf("the ok spends left %v; want 0..19 once each (20 of 40 succeed)", remaining)
		}
		wantCapability(t, s, c, belay.CapabilityActive, 20)
		log := allEvents(t, s, run.ID)
		if want := int64(2 + 20 + 20 + appenders); log.LastSeq != want || !slices.Equal(eventSeqs(log.Events), seqRange(1, want)) {
			t.Fatalf("log seqs %v; want 1..%d with no gap", eventSeqs(log.Events), want)
		}
		var logged []int
		for _, e := range log.Events {
			if e.Type == belay.EventModelRequest {
				var d struct {
					Remaining int `json:"remainingRequests"`
				}
				if err := json.Unmarshal(e.Data, &d); err != nil {
					t.Fatal(err)
				}
				logged = append(logged, d.Remaining)
			}
		}
		if slices.Sort(logged); !slices.Equal(logged, seqInts(0, 19)) {
			t.Fatalf("model.request events say %v left; want 0..19 once each", logged)
		}
		if got := mustGet(t, s, run.ID).Usage; got.ModelRequests != 20 || got.PromptTokens != 20 {
			t.Fatalf("usage %+v; want 20 requests and 20 prompt tokens", got)
		}
	})
}

// seqInts returns from, from+1, …, to.
func seqInts(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// Baseline is a write a store's model-call writes are read against, in
// BenchmarkModelCall.
type Baseline struct {
	Name  string
	Write func(ctx context.Context) error
}

// BenchmarkModelCall measures the store's part of one proxied model call
// against baseline writes of the same store, interleaved in one loop so
// that all see the same machine (the first baseline is the one the
// reported ratios use). Each iteration runs each baseline; the consume
// (SpendModelRequest: the spend and its model.request event, what the
// proxy waits for before it forwards); the response (RecordModelResponse:
// usage and model.response); and, for comparison, the four writes the
// proxy made before (ConsumeModelRequest, AppendEvents, RecordUsage,
// AppendEvents) on a second run. Contexts cannot be cancelled, as in the
// proxy, which detaches its writes from the caller.
//
// It reports ops/s of each and the ratios consume/baseline (goal ≥ 0.5)
// and call/baseline (both writes), and logs them all as a table.
func BenchmarkModelCall(b *testing.B, open func(tb testing.TB, opts Options) belay.Store, baselines ...Baseline) {
	s := open(b, Options{})
	ctx := context.WithoutCancel(b.Context())
	run := createIn(b, s, "run-bench-call", belay.StatusRunning)
	mustActivate(b, s, newCapability(run.ID, 1<<30, at(3600)))
	before := createIn(b, s, "run-bench-before", belay.StatusRunning)
	mustActivate(b, s, newCapability(before.ID, 1<<30, at(3600)))
	response := responseEvent(2)
	delta := belay.UsageDelta{ModelRequests: 1, PromptTokens: 11, CompletionTokens: 7}
	// Warm up (DynamoDB Local is a JVM): each write a few times, untimed.
	for range 20 {
		for _, base := range baselines {
			if err := base.Write(ctx); err != nil {
				b.Fatalf("%s: %v", base.Name, err)
			}
		}
		if _, err := s.SpendModelRequest(ctx, run.ID, testCall, at(1)); err != nil {
			b.Fatalf("SpendModelRequest: %v", err)
		}
		if _, err := s.RecordModelResponse(ctx, run.ID, delta, response); err != nil {
			b.Fatalf("RecordModelResponse: %v", err)
		}
	}
	tBase := make([]time.Duration, len(baselines))
	var tSpend, tRecord, tFour time.Duration
	b.ReportAllocs()
	for b.Loop() {
		for i, base := range baselines {
			t0 := time.Now()
			if err := base.Write(ctx); err != nil {
				b.Fatalf("%s: %v", base.Name, err)
			}
			tBase[i] += time.Since(t0)
		}
		t1 := time.Now()
		res, err := s.SpendModelRequest(ctx, run.ID, testCall, at(1))
		if err != nil || res.Outcome != belay.ConsumeOK {
			b.Fatalf("SpendModelRequest = %+v, %v", res, err)
		}
		t2 := time.Now()
		if _, err := s.RecordModelResponse(ctx, run.ID, delta, response); err != nil {
			b.Fatalf("RecordModelResponse: %v", err)
		}
		t3 := time.Now()
		tSpend += t2.Sub(t1)
		tRecord += t3.Sub(t2)

		t4 := time.Now()
		res, err = s.ConsumeModelRequest(ctx, before.ID, testModel, at(1))
		if err != nil || res.Outcome != belay.ConsumeOK {
			b.Fatalf("ConsumeModelRequest = %+v, %v", res, err)
		}
		if _, err := s.AppendEvents(ctx, before.ID, "", []belay.EventInput{belay.ModelRequestEvent(at(1), testCall, res.Remaining)}); err != nil {
			b.Fatalf("AppendEvents: %v", err)
		}
		if err := s.RecordUsage(ctx, before.ID, delta); err != nil {
			b.Fatalf("RecordUsage: %v", err)
		}
		if _, err := s.AppendEvents(ctx, before.ID, "", []belay.EventInput{response}); err != nil {
			b.Fatalf("AppendEvents: %v", err)
		}
		tFour += time.Since(t4)
	}
	n := float64(b.N)
	opsPerSec := func(d time.Duration) float64 { return n / d.Seconds() }
	consume, call, four := opsPerSec(tSpend), opsPerSec(tSpend+tRecord), opsPerSec(tFour)
	b.ReportMetric(consume, "consume-ops/s")
	b.ReportMetric(call, "call-ops/s")
	b.ReportMetric(four, "four-writes-ops/s")
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-52s %10s", "store writes of one model call ("+strconv.Itoa(b.N)+" iterations)", "ops/s")
	for _, base := range baselines {
		fmt.Fprintf(&table, " %14s", "vs "+base.Name)
	}
	row := func(name string, ops float64) {
		fmt.Fprintf(&table, "\n%-52s %10.0f", name, ops)
		for i := range baselines {
			fmt.Fprintf(&table, " %13.2f×", ops/opsPerSec(tBase[i]))
		}
	}
	for i, base := range baselines {
		row("baseline: "+base.Name, opsPerSec(tBase[i]))
	}
	row("consume: spend + model.request (1 write)", consume)
	row("whole call: consume, then usage + response (2)", call)
	row("before: consume, event, usage, event (4 writes)", four)
	if len(baselines) > 0 {
		base := opsPerSec(tBase[0])
		b.ReportMetric(base, "baseline-ops/s")
		b.ReportMetric(consume/base, "consume/baseline")
		b.ReportMetric(call/base, "call/baseline")
		fmt.Fprintf(&table, "\nconsume/%s = %.2f (goal ≥ 0.50); whole call %.2f× the four writes it replaces", baselines[0].Name, consume/base, call/four)
	}
	b.Log(table.String())
}

// BenchmarkRequestSize measures the writes every event and every model
// call make (AppendEvents with one event, then SpendModelRequest) on a run
// whose request is small and on one that uploaded a whole tree at the
// reference limits (belay.DefaultLimits: its files at the per-file cap, up
// to the tree cap), interleaved in one loop. A store that keeps the
// request beside the run's counters pays for the upload on every write;
// the goal is a ratio near 1. It reports ops/s of both and the ratio
// large/small, and logs them as a table.
func BenchmarkRequestSize(b *testing.B, open func(tb testing.TB, opts Options) belay.Store) {
	s := open(b, Options{})
	ctx := context.WithoutCancel(b.Context())
	limits := belay.DefaultLimits(testModel)
	small := createIn(b, s, "run-bench-small", belay.StatusRunning)
	mustActivate(b, s, newCapability(small.ID, 1<<30, at(3600)))

	large := newRun("run-bench-large", at(0), "hash-run-bench-large")
	large.Request.Files = nil
	for i := 0; (i+1)*limits.MaxFileBytes <= limits.MaxTreeBytes && i < limits.MaxFiles; i++ {
		large.Request.Files = append(large.Request.Files, belay.File{
			Path: fmt.Sprintf("src/part%02d.py", i), Content: strings.Repeat("x = 1  # "+canary+"\n", limits.MaxFileBytes/32)[:limits.MaxFileBytes],
		})
	}
	large.Request.AllowedPaths = []string{"src/**"}
	mustCreate(b, s, large, "")
	for i, to := range pathTo(belay.StatusRunning) {
		mustTransition(b, s, large.ID, to, at(10*(i+1)))
	}
	mustActivate(b, s, newCapability(large.ID, 1<<30, at(3600)))
	treeBytes := 0
	for _, f := range large.Request.Files {
		treeBytes += len(f.Content)
	}

	write := func(runID string) {
		if _, err := s.AppendEvents(ctx, runID, "", []belay.EventInput{{Time: at(1), Type: "bench.step", Data: json.RawMessage(`{"step":1}`)}}); err != nil {
			b.Fatalf("AppendEvents(%s): %v", runID, err)
		}
		if res, err := s.SpendModelRequest(ctx, runID, testCall, at(1)); err != nil || res.Outcome != belay.ConsumeOK {
			b.Fatalf("SpendModelRequest(%s) = %+v, %v", runID, res, err)
		}
	}
	for range 10 {
		write(small.ID)
		write(large.ID)
	}
	var tSmall, tLarge time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		write(small.ID)
		t1 := time.Now()
		write(large.ID)
		tSmall += t1.Sub(t0)
		tLarge += time.Since(t1)
	}
	n := float64(b.N)
	smallOps, largeOps := n/tSmall.Seconds(), n/tLarge.Seconds()
	b.ReportMetric(smallOps, "small-ops/s")
	b.ReportMetric(largeOps, "large-ops/s")
	b.ReportMetric(largeOps/smallOps, "large/small")
	b.Logf("\nan event and a model call's spend (%d iterations)        ops/s\nsmall request                                      %8.0f\nrequest with %d files, %d bytes (reference limits) %8.0f\nlarge/small = %.2f (goal: near 1)",
		b.N, smallOps, len(large.Request.Files), treeBytes, largeOps, largeOps/smallOps)
}
