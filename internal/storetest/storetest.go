// Package storetest is the conformance suite for belay.Store: the run store,
// the capability store and the approval store. The embedded SQLite adapter
// and the DynamoDB adapter both call Run from their tests, so the two
// deployments answer every call the same way, including under concurrency.
//
// The suite passes every time explicitly and never sleeps; it asserts what a
// caller of the port would notice (states, sequence numbers, error codes),
// not how an adapter lays out its data.
package storetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// Options configures a store under test.
type Options struct{ EventBufferSize int } // 0 means belay.DefaultEventBufferSize

// opener is the shape of Run's open argument, for the suite's groups.
type opener = func(tb testing.TB, opts Options) belay.Store

// Run runs the whole suite. open returns a fresh, empty store (its own cleanup via tb.Cleanup).
func Run(t *testing.T, open func(tb testing.TB, opts Options) belay.Store) {
	t.Run("runs", func(t *testing.T) { testRuns(t, open) })
	t.Run("transitions", func(t *testing.T) { testTransitions(t, open) })
	t.Run("cancel", func(t *testing.T) { testCancel(t, open) })
	t.Run("events", func(t *testing.T) { testEvents(t, open) })
	t.Run("buffer", func(t *testing.T) { testBuffer(t, open) })
	t.Run("idempotency", func(t *testing.T) { testIdempotency(t, open) })
	t.Run("capability", func(t *testing.T) { testCapability(t, open) })
	t.Run("approvals", func(t *testing.T) { testApprovals(t, open) })
	t.Run("concurrency", func(t *testing.T) { testConcurrency(t, open) })
	t.Run("claims", func(t *testing.T) { testClaims(t, open) })
	t.Run("sandbox_events", func(t *testing.T) { testSandboxEvents(t, open) })
	t.Run("checkpoints", func(t *testing.T) { testCheckpoints(t, open) })
	t.Run("model_calls", func(t *testing.T) { testModelCalls(t, open) })
	t.Run("deliveries", func(t *testing.T) { testDeliveries(t, open) })
	t.Run("sessions", func(t *testing.T) { testSessions(t, open) })
	t.Run("connections", func(t *testing.T) { testConnections(t, open) })
}

// BenchmarkConsume measures ConsumeModelRequest on one capability with a
// budget too large to run out, so every iteration is a successful, spending
// write: the hot path of the model proxy. It reports ops/s.
func BenchmarkConsume(b *testing.B, open func(tb testing.TB, opts Options) belay.Store) {
	s := open(b, Options{})
	ctx := b.Context()
	run := newRun("run-bench", at(0), "hash-bench")
	mustCreate(b, s, run, "")
	if err := s.ActivateCapability(ctx, belay.Capability{
		RunID: run.ID, Model: testModel, State: belay.CapabilityActive,
		ExpiresAt: at(3600), MaxRequests: 1 << 30,
	}); err != nil {
		b.Fatalf("ActivateCapability: %v", err)
	}
	now := at(1)
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.ConsumeModelRequest(ctx, run.ID, testModel, now)
		if err != nil {
			b.Fatalf("ConsumeModelRequest: %v", err)
		}
		if res.Outcome != belay.ConsumeOK {
			b.Fatalf("ConsumeModelRequest: outcome %q, want ok", res.Outcome)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// testModel is the operator model every run of the suite uses.
const testModel = "test-model-1"

// canary is planted in run instructions and file contents; no error message
// may ever repeat it.
const canary = "CANARY-prompt-7f3a9c1e"

// base is the suite's clock origin. It has nanoseconds so a store that
// rounds times is caught.
var base = time.Date(2031, time.March, 4, 5, 6, 7, 123456789, time.UTC)

// at returns the suite time sec seconds after base.
func at(sec int) time.Time { return base.Add(time.Duration(sec) * time.Second) }

// newRequest returns a small, canonical run request.
func newRequest(instruction string) belay.RunRequest {
	return belay.RunRequest{
		Instruction:     instruction,
		Model:           testModel,
		Files:           []belay.File{{Path: "calc.py", Content: "def add(a, b):\n    return a - b\n# " + canary + "\n"}, {Path: "tests/test_calc.py", Content: "from calc import add\n"}},
		AllowedPaths:    []string{"calc.py", "tests/**"},
		Checks:          [][]string{{"python3", "-m", "pytest", "-q"}},
		MaxSteps:        12,
		WallTimeSeconds: 180,
		Approval:        belay.ApprovalConfig{Policy: belay.PolicyAsk, Allow: []string{"run_check"}, TimeoutSeconds: 120},
	}
}

// newRun returns a queued run as the API would hand it to CreateRun.
func newRun(id string, created time.Time, hash string) belay.Run {
	req := newRequest("Fix the failing test in calc.py " + canary)
	return belay.Run{
		ID:          id,
		Status:      belay.StatusQueued,
		Request:     req,
		RequestHash: hash,
		CreatedAt:   created,
		UpdatedAt:   created,
		Usage:       belay.Usage{MaxRequests: req.MaxRequests()},
	}
}

// mustCreate stores run and fails the test unless it was created.
func mustCreate(tb testing.TB, s belay.Store, run belay.Run, key string) belay.Run {
	tb.Helper()
	got, created, err := s.CreateRun(tb.Context(), run, key)
	if err != nil {
		tb.Fatalf("CreateRun(%s): %v", run.ID, err)
	}
	if !created {
		tb.Fatalf("CreateRun(%s): created = false, want true", run.ID)
	}
	return got
}

// mustGet returns the stored run.
func mustGet(tb testing.TB, s belay.Store, id string) belay.Run {
	tb.Helper()
	r, err := s.GetRun(tb.Context(), id)
	if err != nil {
		tb.Fatalf("GetRun(%s): %v", id, err)
	}
	return r
}

// mustTransition moves the run to `to` with the event a real caller would
// append for it, and fails the test on error.
func mustTransition(tb testing.TB, s belay.Store, id string, to belay.RunStatus, when time.Time) belay.Run {
	tb.Helper()
	r, err := s.Transition(tb.Context(), id, transitionTo(to, when))
	if err != nil {
		tb.Fatalf("Transition(%s → %s): %v", id, to, err)
	}
	return r
}

// transitionTo builds the transition the orchestrator would write: the new
// state and its event.
func transitionTo(to belay.RunStatus, when time.Time) belay.Transition {
	typ := belay.TerminalEventType(to)
	switch to {
	case belay.StatusRunning:
		typ = belay.EventRunStarted
	case belay.StatusQueued:
		typ = belay.EventRunQueued
	}
	return belay.Transition{
		To: to, At: when,
		Events: []belay.EventInput{{Time: when, Type: typ, Data: json.RawMessage(`{"status":"` + string(to) + `"}`)}},
	}
}

// pathTo lists the transitions that bring a new run to state s.
func pathTo(s belay.RunStatus) []belay.RunStatus {
	switch s {
	case belay.StatusRunning:
		return []belay.RunStatus{belay.StatusRunning}
	case belay.StatusCompleted, belay.StatusFailed:
		return []belay.RunStatus{belay.StatusRunning, s}
	case belay.StatusCancelled:
		return []belay.RunStatus{belay.StatusCancelled}
	}
	return nil
}

// createIn creates run id and drives it to state st.
func createIn(tb testing.TB, s belay.Store, id string, st belay.RunStatus) belay.Run {
	tb.Helper()
	r := mustCreate(tb, s, newRun(id, at(0), "hash-"+id), "")
	for i, to := range pathTo(st) {
		r = mustTransition(tb, s, id, to, at(10*(i+1)))
	}
	if r.Status != st {
		tb.Fatalf("setup: run %s is %s, want %s", id, r.Status, st)
	}
	return r
}

// allEvents returns the run's whole log (as far as the buffer keeps it).
func allEvents(tb testing.TB, s belay.Store, id string) belay.EventPage {
	tb.Helper()
	p, err := s.ListEvents(tb.Context(), id, 0, 10000)
	if err != nil {
		tb.Fatalf("ListEvents(%s): %v", id, err)
	}
	return p
}

// eventTypes lists the types of events, in order.
func eventTypes(evs []belay.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// eventSeqs lists the sequence numbers of events, in order.
func eventSeqs(evs []belay.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

// seqRange returns from, from+1, …, to.
func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// wantCode fails the test unless err carries code.
func wantCode(tb testing.TB, err error, code belay.Code, what string) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("%s: no error, want %s", what, code)
	}
	if got := belay.ErrorCode(err); got != code {
		tb.Fatalf("%s: error %q has code %s, want %s", what, err, got, code)
	}
	if strings.Contains(err.Error(), canary) || strings.Contains(belay.ErrorMessage(err), canary) {
		tb.Fatalf("%s: error message repeats the request's content", what)
	}
}

// jsonEqual reports whether a and b hold the same JSON value; both empty
// counts as equal. Stores may re-encode JSON, so bytes are not compared.
func jsonEqual(a, b []byte) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// runJSON renders a run the way a client sees it (times in UTC), plus the
// request hash, which the API never shows but the store must keep.
func runJSON(tb testing.TB, r belay.Run) string {
	tb.Helper()
	for _, t := range []*time.Time{&r.CreatedAt, &r.UpdatedAt, &r.StartedAt, &r.FinishedAt} {
		*t = t.UTC()
	}
	b, err := json.Marshal(r)
	if err != nil {
		tb.Fatalf("marshal run: %v", err)
	}
	return string(b) + " hash=" + r.RequestHash
}

// sameRun fails the test unless got and want describe the same run.
func sameRun(tb testing.TB, what string, got, want belay.Run) {
	tb.Helper()
	if g, w := runJSON(tb, got), runJSON(tb, want); g != w {
		tb.Fatalf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// sameRequest fails the test unless the stored request equals the one asked.
func sameRequest(tb testing.TB, what string, got, want belay.RunRequest) {
	tb.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		tb.Fatalf("%s: request changed in storage:\n got %s\nwant %s", what, g, w)
	}
}

// sameTime fails the test unless got and want are the same instant (a zero
// want requires a zero got).
func sameTime(tb testing.TB, what string, got, want time.Time) {
	tb.Helper()
	if want.IsZero() {
		if !got.IsZero() {
			tb.Fatalf("%s = %v, want unset", what, got)
		}
		return
	}
	if !got.Equal(want) {
		tb.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// sameEvents fails the test unless got lists the same events as want
// (seq, time, type, data).
func sameEvents(tb testing.TB, what string, got, want []belay.Event) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%s: %d events %v, want %d %v", what, len(got), eventTypes(got), len(want), eventTypes(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Type != w.Type || g.Source != w.Source || !g.Time.Equal(w.Time) || !jsonEqual(g.Data, w.Data) {
			tb.Fatalf("%s: event %d = {%d %v %s %s}, want {%d %v %s %s}", what, i,
				g.Seq, g.Time, g.Type, g.Data, w.Seq, w.Time, w.Type, w.Data)
		}
	}
}

// runIDs lists the ids of runs, in order.
func runIDs(runs []belay.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

// sortedCopy returns a sorted copy of ids.
func sortedCopy(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// intp returns a pointer to v, for ExitCode.
func intp(v int) *int { return &v }

// name formats a sub-test name.
func name(format string, args ...any) string { return fmt.Sprintf(format, args...) }
