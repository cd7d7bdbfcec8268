package dynamo_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
)

// rawItems returns every item of a run's partition, read straight from the
// table, keyed by sort key.
func rawItems(tb testing.TB, p peer, runID string) map[string]map[string]types.AttributeValue {
	tb.Helper()
	out, err := p.client.Query(context.Background(), &dynamodb.QueryInput{
		TableName:                 aws.String(p.table),
		KeyConditionExpression:    aws.String("PK = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "RUN#" + runID}},
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		tb.Fatalf("query run %s: %v", runID, err)
	}
	items := map[string]map[string]types.AttributeValue{}
	for _, it := range out.Items {
		items[it["SK"].(*types.AttributeValueMemberS).Value] = it
	}
	return items
}

// storedEventTypes lists the types of the EVT# items the table holds for a
// run, in sequence order.
func storedEventTypes(tb testing.TB, p peer, runID string) []string {
	tb.Helper()
	items := rawItems(tb, p, runID)
	var sks []string
	for sk := range items {
		if strings.HasPrefix(sk, "EVT#") {
			sks = append(sks, sk)
		}
	}
	slices.Sort(sks)
	types := make([]string, len(sks))
	for i, sk := range sks {
		types[i] = str(items[sk]["type"])
	}
	return types
}

func str(v types.AttributeValue) string {
	if s, ok := v.(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}

func num(tb testing.TB, v types.AttributeValue) int64 {
	tb.Helper()
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		tb.Fatalf("attribute %v is not a number", v)
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return i
}

func TestConsumeConcurrentBudget(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	ctx := t.Context()
	mustCreate(t, p.store, newRun("run-budget", t0))
	if err := p.store.ActivateCapability(ctx, belay.Capability{RunID: "run-budget", Model: "test-model", ExpiresAt: t0.Add(time.Hour), MaxRequests: 50}); err != nil {
		t.Fatal(err)
	}
	outcomes := make([]belay.ConsumeOutcome, 200)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range outcomes {
		wg.Go(func() {
			<-start
			res, err := p.store.ConsumeModelRequest(ctx, "run-budget", "test-model", t0.Add(time.Minute))
			if err != nil {
				t.Errorf("consume %d: %v", i, err)
			}
			outcomes[i] = res.Outcome
		})
	}
	close(start)
	wg.Wait()
	counts := map[belay.ConsumeOutcome]int{}
	for _, o := range outcomes {
		counts[o]++
	}
	if counts[belay.ConsumeOK] != 50 || counts[belay.ConsumeExhausted] != 150 {
		t.Fatalf("200 concurrent consumes against 50: %v; want 50 ok, 150 exhausted", counts)
	}
	if used := num(t, rawItems(t, p, "run-budget")["CAP"]["usedRequests"]); used != 50 {
		t.Fatalf("table holds usedRequests = %d, want 50", used)
	}
}

// TestConsumeExpiredItemStillPresent covers the window TTL leaves open:
// DynamoDB deletes expired items lazily (up to days later), so a capability
// past its expiry, whose item's ttl has also passed, may still be read and
// written. The consume condition must refuse it as expired on its own.
func TestConsumeExpiredItemStillPresent(t *testing.T) {
	p := newPeer(t, dynamo.Options{Retention: time.Second})
	ctx := t.Context()
	now := time.Now()
	expires := now.Add(-time.Hour)
	mustCreate(t, p.store, newRun("run-old", expires.Add(-time.Hour)))
	if err := p.store.ActivateCapability(ctx, belay.Capability{RunID: "run-old", Model: "test-model", ExpiresAt: expires, MaxRequests: 10}); err != nil {
		t.Fatal(err)
	}
	capItem, ok := rawItems(t, p, "run-old")["CAP"]
	if !ok {
		t.Fatal("capability item is gone; this test needs it present past its ttl")
	}
	if ttl := num(t, capItem["ttl"]); ttl >= now.Unix() {
		t.Fatalf("capability ttl %d is not in the past (now %d)", ttl, now.Unix())
	}
	for _, c := range []struct {
		name string
		at   time.Time
		want belay.ConsumeOutcome
	}{
		{"before_expiry", expires.Add(-time.Nanosecond), belay.ConsumeOK},
		{"at_expiry", expires, belay.ConsumeExpired},
		{"now", now, belay.ConsumeExpired},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := p.store.ConsumeModelRequest(ctx, "run-old", "test-model", c.at)
			if err != nil || res.Outcome != c.want {
				t.Fatalf("consume = %+v, %v; want %s", res, err, c.want)
			}
		})
	}
	if used := num(t, rawItems(t, p, "run-old")["CAP"]["usedRequests"]); used != 1 {
		t.Fatalf("usedRequests = %d, want 1 (refusals spend nothing)", used)
	}
}

// racingStore returns a store whose first TransactWriteItems runs rival
// just before it is sent: after the store has read the run and planned its
// write, before DynamoDB sees it. That is a real lost race, every time.
func racingStore(tb testing.TB, p peer, rival func()) *dynamo.Store {
	tb.Helper()
	var once sync.Once
	client := dynamodb.New(p.client.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(slices.Clip(o.APIOptions), func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("rival",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					if _, ok := in.Parameters.(*dynamodb.TransactWriteItemsInput); ok {
						once.Do(rival)
					}
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		})
	})
	return dynamo.New(client, p.table, dynamo.Options{})
}

func TestTransitionLosesRace(t *testing.T) {
	completion := belay.Transition{
		To: belay.StatusCompleted, At: t0.Add(3 * time.Second), Reason: "checks passed", ExitCode: new(int),
		Events: []belay.EventInput{
			{Time: t0.Add(3 * time.Second), Type: belay.EventCheckFinished, Data: json.RawMessage(`{"exitCode":0}`)},
			{Time: t0.Add(3 * time.Second), Type: belay.EventRunCompleted},
		},
	}
	for _, c := range []struct {
		name       string
		rival      func(ctx context.Context, s belay.Store) error
		wantCode   belay.Code
		wantStatus belay.RunStatus
		wantEvents []string
	}{
		{
			// The completion lost to a cancellation: refused, and neither its
			// state nor its events are anywhere in the table.
			name: "cancel_wins",
			rival: func(ctx context.Context, s belay.Store) error {
				_, err := s.Transition(ctx, "run-race", belay.Transition{
					To: belay.StatusCancelled, At: t0.Add(2 * time.Second), Reason: "cancelled by user",
					Events: []belay.EventInput{{Time: t0.Add(2 * time.Second), Type: belay.EventRunCancelled}},
				})
				return err
			},
			wantCode:   belay.CodeConflict,
			wantStatus: belay.StatusCancelled,
			wantEvents: []string{belay.EventRunQueued, belay.EventRunStarted, belay.EventRunCancelled},
		},
		{
			// The completion lost to an event append: it is planned again
			// against the new lastSeq and its events follow the rival's.
			name: "append_wins",
			rival: func(ctx context.Context, s belay.Store) error {
				_, err := s.AppendEvents(ctx, "run-race", "", []belay.EventInput{{Time: t0.Add(2 * time.Second), Type: belay.EventToolCall}})
				return err
			},
			wantStatus: belay.StatusCompleted,
			wantEvents: []string{belay.EventRunQueued, belay.EventRunStarted, belay.EventToolCall, belay.EventCheckFinished, belay.EventRunCompleted},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t, dynamo.Options{})
			ctx := t.Context()
			mustCreate(t, p.store, newRun("run-race", t0))
			if _, err := p.store.Transition(ctx, "run-race", belay.Transition{
				To: belay.StatusRunning, At: t0.Add(time.Second),
				Events: []belay.EventInput{{Time: t0.Add(time.Second), Type: belay.EventRunStarted}},
			}); err != nil {
				t.Fatal(err)
			}
			var rivalErr error
			ran := false
			slow := racingStore(t, p, func() { ran, rivalErr = true, c.rival(ctx, p.store) })

			_, err := slow.Transition(ctx, "run-race", completion)
			if !ran || rivalErr != nil {
				t.Fatalf("rival ran %v: %v", ran, rivalErr)
			}
			if belay.ErrorCode(err) != c.wantCode && (c.wantCode != "" || err != nil) {
				t.Fatalf("losing Transition: %v (code %q), want code %q", err, belay.ErrorCode(err), c.wantCode)
			}
			items := rawItems(t, p, "run-race")
			meta := items["META"]
			if got := belay.RunStatus(str(meta["status"])); got != c.wantStatus {
				t.Fatalf("table status = %s, want %s", got, c.wantStatus)
			}
			if got := storedEventTypes(t, p, "run-race"); !slices.Equal(got, c.wantEvents) {
				t.Fatalf("table events = %v, want %v", got, c.wantEvents)
			}
			if last := num(t, meta["lastSeq"]); last != int64(len(c.wantEvents)) {
				t.Fatalf("lastSeq = %d, want %d", last, len(c.wantEvents))
			}
			if c.wantStatus == belay.StatusCancelled && (str(meta["reason"]) != "cancelled by user" || meta["exitCode"] != nil) {
				t.Fatalf("cancelled run carries the lost completion's outcome: reason %q exitCode %v", str(meta["reason"]), meta["exitCode"])
			}
		})
	}
}

func TestCompletionAfterCancel(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	ctx := t.Context()
	mustCreate(t, p.store, newRun("run-late", t0))
	for _, to := range []belay.RunStatus{belay.StatusRunning, belay.StatusCancelled} {
		if _, err := p.store.Transition(ctx, "run-late", belay.Transition{To: to, At: t0, Events: []belay.EventInput{{Time: t0, Type: "run." + string(to)}}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.store.Transition(ctx, "run-late", belay.Transition{To: belay.StatusCompleted, At: t0, Events: []belay.EventInput{{Time: t0, Type: belay.EventRunCompleted}}})
	if !belay.IsCode(err, belay.CodeConflict) {
		t.Fatalf("completion after cancel: %v, want conflict", err)
	}
	r, err := p.store.GetRun(ctx, "run-late")
	if err != nil || r.Status != belay.StatusCancelled {
		t.Fatalf("run after a late completion = %s, %v; want cancelled", r.Status, err)
	}
	if got := storedEventTypes(t, p, "run-late"); slices.Contains(got, belay.EventRunCompleted) {
		t.Fatalf("table holds the refused completion's event: %v", got)
	}
}

// TestEventBufferTrim checks the table itself, not only what ListEvents
// shows: events out of the buffer are deleted, in the transaction that
// pushed them out when they fit in its 100 items, right after it otherwise.
func TestEventBufferTrim(t *testing.T) {
	for _, c := range []struct {
		name    string
		buffer  int
		batches []int
	}{
		{"in_transaction", 5, []int{1, 3, 4, 2, 7}},
		{"deferred", 60, []int{59, 60, 60}}, // 60 puts + 60 deletes exceed 100 items
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t, dynamo.Options{EventBufferSize: c.buffer})
			ctx := t.Context()
			mustCreate(t, p.store, newRun("run-trim", t0))
			last := int64(1)
			for _, n := range c.batches {
				in := make([]belay.EventInput, n)
				for i := range in {
					in[i] = belay.EventInput{Time: t0, Type: belay.EventToolCall, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, last+int64(i)+1))}
				}
				if _, err := p.store.AppendEvents(ctx, "run-trim", "", in); err != nil {
					t.Fatal(err)
				}
				last += int64(n)
				if got := len(storedEventTypes(t, p, "run-trim")); got != min(int(last), c.buffer) {
					t.Fatalf("after lastSeq %d the table holds %d events, want %d", last, got, min(int(last), c.buffer))
				}
			}
			page, err := p.store.ListEvents(ctx, "run-trim", 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			oldest := last - int64(c.buffer) + 1
			if !page.Missed || page.OldestSeq != oldest || page.LastSeq != last || len(page.Events) != c.buffer || page.Events[0].Seq != oldest {
				t.Fatalf("page: missed %v oldest %d last %d, %d events from %d; want true %d %d, %d from %d",
					page.Missed, page.OldestSeq, page.LastSeq, len(page.Events), page.Events[0].Seq, oldest, last, c.buffer, oldest)
			}
		})
	}
}

// TestAppendTooManyEvents pins belay.MaxAppendEvents to this adapter: one
// more event than it, in a batch, no longer fits one transaction (the
// conformance suite shows that exactly MaxAppendEvents does).
func TestAppendTooManyEvents(t *testing.T) {
	for _, c := range []struct {
		n     int
		batch string
	}{
		{120, ""},
		{belay.MaxAppendEvents + 1, "batch-1"},
	} {
		t.Run(fmt.Sprintf("%d_events_batch_%q", c.n, c.batch), func(t *testing.T) {
			p := newPeer(t, dynamo.Options{})
			ctx := t.Context()
			mustCreate(t, p.store, newRun("run-big", t0))
			in := make([]belay.EventInput, c.n)
			for i := range in {
				in[i] = belay.EventInput{Time: t0, Type: belay.EventToolCall}
			}
			_, err := p.store.AppendEvents(ctx, "run-big", c.batch, in)
			if !belay.IsCode(err, belay.CodeTooLarge) {
				t.Fatalf("append of %d events: %v, want too_large", c.n, err)
			}
			if got := storedEventTypes(t, p, "run-big"); len(got) != 1 {
				t.Fatalf("refused append left events: %v", got)
			}
		})
	}
}

func TestBatchConcurrentCopies(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	ctx := t.Context()
	mustCreate(t, p.store, newRun("run-batch", t0))
	in := []belay.EventInput{{Time: t0, Type: belay.EventToolCall, Data: json.RawMessage(`{"a":1}`)}, {Time: t0, Type: belay.EventToolResult}}
	results := make([][]belay.Event, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			var err error
			if results[i], err = p.store.AppendEvents(ctx, "run-batch", "batch-1", in); err != nil {
				t.Errorf("copy %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	for i, r := range results {
		if len(r) != 2 || r[0].Seq != 2 || r[1].Seq != 3 {
			t.Fatalf("copy %d got %+v, want seqs 2 and 3", i, r)
		}
	}
	if got := storedEventTypes(t, p, "run-batch"); len(got) != 3 {
		t.Fatalf("8 copies of one batch stored %v, want it once", got)
	}
}

// TestIdempotencyKeyExpiry shows that an idempotency item past its ttl
// counts as absent even while DynamoDB has not swept it yet.
func TestIdempotencyKeyExpiry(t *testing.T) {
	for _, c := range []struct {
		name        string
		gap         time.Duration
		wantCreated bool
	}{
		{"within_retention", 30 * time.Minute, false},
		{"past_retention", 2 * time.Hour, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t, dynamo.Options{Retention: time.Hour})
			ctx := t.Context()
			first := newRun("run-first", t0)
			if _, _, err := p.store.CreateRun(ctx, first, "key-1"); err != nil {
				t.Fatal(err)
			}
			second := newRun("run-second", t0.Add(c.gap))
			second.RequestHash = "another-hash"
			got, created, err := p.store.CreateRun(ctx, second, "key-1")
			if c.wantCreated {
				if err != nil || !created || got.ID != "run-second" {
					t.Fatalf("CreateRun with an expired key = %s created %v, %v; want run-second created", got.ID, created, err)
				}
				return
			}
			if !belay.IsCode(err, belay.CodeConflict) {
				t.Fatalf("CreateRun with a live key and another hash: %v, want conflict", err)
			}
		})
	}
}

// TestLargeRequest stores a request bigger than one DynamoDB item (400 KB)
// that gzip cannot shrink enough, and reads it back whole.
func TestLargeRequest(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	ctx := t.Context()
	r := newRun("run-large", t0)
	r.Request.Files = nil
	for i := range 8 {
		noise := make([]byte, 48<<10)
		rand.Read(noise)
		r.Request.Files = append(r.Request.Files, belay.File{Path: fmt.Sprintf("f%d.txt", i), Content: base64.StdEncoding.EncodeToString(noise)})
	}
	mustCreate(t, p.store, r)
	if n := len(slices.DeleteFunc(slices.Collect(maps.Keys(rawItems(t, p, "run-large"))), func(sk string) bool { return !strings.HasPrefix(sk, "REQ#") })); n < 2 {
		t.Fatalf("request stored in %d chunks; the test needs at least 2", n)
	}
	want, _ := json.Marshal(r.Request)
	got, err := p.store.GetRun(ctx, "run-large")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got.Request); string(b) != string(want) {
		t.Fatal("GetRun: request differs from the stored one")
	}
	page, err := p.store.ListRuns(ctx, belay.ListRunsQuery{})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("ListRuns = %d runs, %v", len(page.Runs), err)
	}
	if b, _ := json.Marshal(page.Runs[0].Request); string(b) != string(want) {
		t.Fatal("ListRuns: request differs from the stored one")
	}
}

func TestListRunsCursorBoundToFilter(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	ctx := t.Context()
	for i := range 3 {
		mustCreate(t, p.store, newRun(fmt.Sprintf("run-%d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	page, err := p.store.ListRuns(ctx, belay.ListRunsQuery{Status: belay.StatusQueued, Limit: 1})
	if err != nil || page.NextCursor == "" {
		t.Fatalf("first page: cursor %q, %v", page.NextCursor, err)
	}
	for _, q := range []belay.ListRunsQuery{
		{Cursor: page.NextCursor, Limit: 1},
		{Status: belay.StatusRunning, Cursor: page.NextCursor, Limit: 1},
	} {
		if _, err := p.store.ListRuns(ctx, q); !belay.IsCode(err, belay.CodeInvalid) {
			t.Fatalf("cursor of status=queued used with status=%q: %v, want invalid", q.Status, err)
		}
	}
}

func TestCreateTableEnablesTTL(t *testing.T) {
	p := newPeer(t, dynamo.Options{})
	out, err := p.client.DescribeTimeToLive(t.Context(), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(p.table)})
	if err != nil {
		t.Fatal(err)
	}
	d := out.TimeToLiveDescription
	if d == nil || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled || aws.ToString(d.AttributeName) != "ttl" {
		t.Fatalf("TTL = %+v, want enabled on ttl", d)
	}
}

func TestNewLocalClientEndpoint(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		ok       bool
	}{
		{"http://127.0.0.1:8000", true},
		{"https://localhost:8000", true},
		{"127.0.0.1:8000", false},
		{"", false},
		{"ftp://127.0.0.1:8000", false},
		{"http://", false},
	} {
		_, err := dynamo.NewLocalClient(context.Background(), c.endpoint)
		if (err == nil) != c.ok {
			t.Errorf("NewLocalClient(%q) error = %v, want ok %v", c.endpoint, err, c.ok)
		}
	}
}
