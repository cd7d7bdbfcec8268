// Package dynamo is belay's DynamoDB adapter: it implements belay.Store (run
// sessions and their event logs, capabilities, approvals) on one table with
// conditional writes and transactions, so that any number of control-plane
// processes (Lambda functions, the Step Functions tasks) share one consistent
// state. Its embedded twin is internal/sqlite; internal/storetest holds both
// to one contract.
//
// The rules it keeps:
//   - A budget consume is one conditional UpdateItem; a refusal is classified
//     from the item returned with the failed condition, never by a second read.
//   - A state change and the events it causes are one TransactWriteItems that
//     is conditioned on the run's status and on its lastSeq. Writers that lose
//     the race re-plan against the state that beat them (returned with the
//     failed condition) and try again, a bounded number of times; a lost race
//     leaves nothing behind.
//   - Expiry is checked in conditions: TTL deletion is lazy, so an expired
//     item may still be there.
package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// DefaultRetention is how long a run's items live before DynamoDB's TTL may
// remove them.
const DefaultRetention = 30 * 24 * time.Hour

// maxTransactItems is DynamoDB's limit of items in one transaction.
const maxTransactItems = 100

// maxWriteAttempts bounds the optimistic loop of one run write: each lost
// race means another writer succeeded, so this many concurrent writers to one
// run all get through.
const maxWriteAttempts = 64

// Options tunes a Store. The zero value is usable.
type Options struct {
	// EventBufferSize is how many events each run keeps; 0 means
	// belay.DefaultEventBufferSize.
	EventBufferSize int
	// Retention is how long after creation a run's items expire (DynamoDB's
	// TTL removes them some time later); 0 means DefaultRetention.
	Retention time.Duration
	// Logger receives the store's warnings (a deferred trim that failed);
	// nil discards them.
	Logger *slog.Logger
}

// Store implements belay.Store on one DynamoDB table (see CreateTable for its
// shape). It is safe for concurrent use, also by many processes at once.
type Store struct {
	client    *dynamodb.Client
	table     *string
	buffer    int64
	retention time.Duration
	log       *slog.Logger
}

var _ belay.Store = (*Store)(nil)

// New returns a Store on the given table. The client should be configured
// with ClientOptions (NewLocalClient is).
func New(client *dynamodb.Client, table string, opts Options) *Store {
	s := &Store{
		client:    client,
		table:     aws.String(table),
		buffer:    int64(opts.EventBufferSize),
		retention: opts.Retention,
		log:       opts.Logger,
	}
	if s.buffer <= 0 {
		s.buffer = belay.DefaultEventBufferSize
	}
	if s.retention <= 0 {
		s.retention = DefaultRetention
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// readMeta reads a run's META item, strongly consistent; nil when the run
// does not exist.
func (s *Store) readMeta(ctx context.Context, runID string) (*runMeta, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyOf(runPK(runID), skMeta),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", runID, err)
	}
	return decodeMeta(out.Item)
}

// runChange is one write to a run planned against its current META: what to
// set on META, what else to write, and the events to append.
type runChange struct {
	// set holds SET clauses for META besides lastSeq; cond is an extra
	// condition on META. Attribute names in both are written "#name" (see
	// exprNames); values serve both.
	set    []string
	cond   string
	values map[string]types.AttributeValue
	// events are appended after the run's current lastSeq, marked with
	// source (belay.SourceControl when empty).
	events []belay.EventInput
	source string
	// extra items are written in the same transaction, after META.
	extra []types.TransactWriteItem
	// extraFailed answers when the condition of extra[i] failed; old is the
	// item as it was (nil if absent).
	extraFailed func(i int, old item) error
	// token, when set, is the transaction's ClientRequestToken; otherwise
	// the SDK makes one per call and keeps it across its own retries, which
	// makes a retry after a lost response idempotent. Only writes that are
	// idempotent by contract (a batch) derive one from their content: two
	// concurrent identical transitions under one derived token would both
	// be told they succeeded, where exactly one must get conflict.
	token string
}

// errNoChange is returned by a plan when the run is already as asked and
// nothing needs writing.
var errNoChange = errors.New("no change")

// writeRun plans a change against the run's META and writes it, together with
// its events and the trimming of the event buffer, in one transaction
// conditioned on the status the plan saw (the plan's cond) and on lastSeq.
// When another writer got there first, the META returned with the failed
// condition is the new state: the plan runs again against it, without a
// second read. plan gets nil for a missing run. It returns the events it
// appended, with their sequence numbers.
func (s *Store) writeRun(ctx context.Context, runID string, plan func(cur *runMeta) (*runChange, error)) ([]belay.Event, error) {
	cur, err := s.readMeta(ctx, runID)
	if err != nil {
		return nil, err
	}
	for attempt := range maxWriteAttempts {
		ch, err := plan(cur)
		if err != nil {
			return nil, err
		}
		tx, events, deferred, err := s.transaction(runID, cur, ch)
		if err != nil {
			return nil, err
		}
		_, err = s.client.TransactWriteItems(ctx, tx)
		if err == nil {
			s.deleteEvents(ctx, runID, deferred)
			return events, nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) {
			return nil, fmt.Errorf("write run %s: %w", runID, err)
		}
		reasons := canceled.CancellationReasons
		if len(reasons) != len(tx.TransactItems) {
			return nil, fmt.Errorf("write run %s: %d cancellation reasons for %d items: %w",
				runID, len(reasons), len(tx.TransactItems), err)
		}
		if reasonCode(reasons[0]) == "ConditionalCheckFailed" {
			// The run changed (or is gone): plan again against what is there.
			if cur, err = decodeMeta(reasons[0].Item); err != nil {
				return nil, err
			}
			continue
		}
		for i := range ch.extra {
			if reasonCode(reasons[1+i]) == "ConditionalCheckFailed" {
				return nil, ch.extraFailed(i, reasons[1+i].Item)
			}
		}
		if !hasReason(reasons, "TransactionConflict") {
			return nil, fmt.Errorf("write run %s: %w", runID, err)
		}
		// Another transaction held one of the items: back off, read again.
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return nil, fmt.Errorf("write run %s: %w", runID, err)
		}
		if cur, err = s.readMeta(ctx, runID); err != nil {
			return nil, err
		}
	}
	return nil, belay.Errorf(belay.CodeUnavailable, "run %s is being changed by too many writers at once; try again", runID)
}

// transaction builds the TransactWriteItems of one planned change: META
// first (so reason 0 is always META's), then ch.extra, the new events, and
// the deletion of events that fall out of the buffer. Events that would be
// deleted at once are not written at all. When the deletions do not fit in
// the transaction's item limit they are returned to be deleted afterwards:
// readers never see them anyway (ListEvents reads only the last bufferSize
// sequence numbers), and if that cleanup fails the items' TTL removes them.
func (s *Store) transaction(runID string, cur *runMeta, ch *runChange) (*dynamodb.TransactWriteItemsInput, []belay.Event, []int64, error) {
	last := cur.run.LastSeq
	newLast := last + int64(len(ch.events))
	cut := newLast - s.buffer // sequence numbers <= cut are out of the buffer

	values := map[string]types.AttributeValue{":oldSeq": avN(last), ":newSeq": avN(newLast)}
	for k, v := range ch.values {
		values[k] = v
	}
	cond := "attribute_exists(#PK) AND #lastSeq = :oldSeq"
	if ch.cond != "" {
		cond += " AND (" + ch.cond + ")"
	}
	update := "SET " + strings.Join(append([]string{"#lastSeq = :newSeq"}, ch.set...), ", ")
	items := []types.TransactWriteItem{{Update: &types.Update{
		TableName:                           s.table,
		Key:                                 keyOf(runPK(runID), skMeta),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            exprNames(update, cond),
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}}
	items = append(items, ch.extra...)

	events := make([]belay.Event, len(ch.events))
	var size int
	source := ch.source
	if source == "" {
		source = belay.SourceControl
	}
	for i, in := range ch.events {
		e := belay.Event{Seq: last + 1 + int64(i), Time: in.Time, Type: in.Type, Source: source, Data: in.Data}
		if !e.Time.IsZero() {
			e.Time = e.Time.UTC()
		}
		events[i] = e
		if e.Seq <= cut {
			continue
		}
		size += len(e.Data) + len(e.Type) + 100
		if len(e.Data) > maxEventDataBytes {
			return nil, nil, nil, belay.Errorf(belay.CodeTooLarge, "event %d (%s) has %d bytes of data; at most %d fit", i, e.Type, len(e.Data), maxEventDataBytes)
		}
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: s.table, Item: eventItem(runID, e, cur.ttl)}})
	}
	if len(items) > maxTransactItems {
		return nil, nil, nil, belay.Errorf(belay.CodeTooLarge, "%d events do not fit in one write; send at most %d at a time", len(ch.events), maxTransactItems-1-len(ch.extra))
	}
	if size > maxWriteBytes {
		return nil, nil, nil, belay.Errorf(belay.CodeTooLarge, "events of %d bytes do not fit in one write; at most %d fit", size, maxWriteBytes)
	}

	var deferred []int64
	for seq := max(1, last-s.buffer+1); seq <= min(last, cut); seq++ {
		if len(items) < maxTransactItems {
			items = append(items, types.TransactWriteItem{Delete: &types.Delete{TableName: s.table, Key: keyOf(runPK(runID), eventSK(seq))}})
		} else {
			deferred = append(deferred, seq)
		}
	}
	in := &dynamodb.TransactWriteItemsInput{TransactItems: items}
	if ch.token != "" {
		in.ClientRequestToken = aws.String(ch.token)
	}
	return in, events, deferred, nil
}

// The size limits of events: DynamoDB items hold at most 400 KB and a
// transaction at most 4 MB.
const (
	maxEventDataBytes = 350_000
	maxWriteBytes     = 3_500_000
)

// deleteEvents removes events that fell out of the buffer but did not fit in
// the transaction that pushed them out. A failure is logged, not returned:
// the write it follows has succeeded, readers already skip these events, and
// TTL removes them in the end.
func (s *Store) deleteEvents(ctx context.Context, runID string, seqs []int64) {
	for len(seqs) > 0 {
		n := min(len(seqs), 25) // BatchWriteItem's limit
		reqs := make([]types.WriteRequest, n)
		for i, seq := range seqs[:n] {
			reqs[i] = types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: keyOf(runPK(runID), eventSK(seq))}}
		}
		seqs = seqs[n:]
		pending := map[string][]types.WriteRequest{*s.table: reqs}
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt == MaxAttempts {
				s.log.WarnContext(ctx, "trim event buffer: unprocessed deletions left to TTL", "run_id", runID)
				break
			}
			if attempt > 0 {
				if sleep(ctx, backoff(attempt)) != nil {
					return
				}
			}
			out, err := s.client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				s.log.WarnContext(ctx, "trim event buffer failed; TTL removes the events later", "run_id", runID, "err", err)
				return
			}
			pending = out.UnprocessedItems
		}
	}
}

func reasonCode(r types.CancellationReason) string { return aws.ToString(r.Code) }

func hasReason(rs []types.CancellationReason, code string) bool {
	for _, r := range rs {
		if reasonCode(r) == code {
			return true
		}
	}
	return false
}

// backoff is capped exponential backoff with full jitter. The jitter needs no
// reproducible randomness: it only spreads writers apart.
func backoff(attempt int) time.Duration {
	ceiling := min(5*time.Millisecond<<min(attempt, 6), 250*time.Millisecond)
	return time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exprNames aliases every "#name" in the expressions to the attribute
// "name". Expressions here name every attribute that way, so none of them
// can collide with DynamoDB's long list of reserved words ("status", "data",
// "time", "ttl", …).
func exprNames(exprs ...string) map[string]string {
	names := map[string]string{}
	for _, e := range exprs {
		for _, m := range nameRef.FindAllStringSubmatch(e, -1) {
			names[m[0]] = m[1]
		}
	}
	return names
}

var nameRef = regexp.MustCompile(`#([A-Za-z0-9_]+)`)

// ttlOf is the epoch second at which a run created at t may be swept.
func (s *Store) ttlOf(t time.Time) int64 { return t.Add(s.retention).Unix() }
