package dynamo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// The page sizes of ListEvents.
const (
	defaultEventLimit = 500
	maxEventLimit     = 1000
)

// batchReplay is the sequence range an earlier batch got.
type batchReplay struct{ first, count int64 }

// AppendEvents appends events in one transaction with the META update that
// advances lastSeq (conditioned on the run being non-terminal and on the
// lastSeq it read), the buffer trim, and, for a non-empty batchID, a BATCH#
// item conditioned on being absent. A repeated batch finds that item and
// answers with the events it recorded. The ClientRequestToken of a batch is
// derived from the table, the run, the batch, its events and the lastSeq it
// was planned on, so a copy sent concurrently against the same state is
// answered by DynamoDB without a second write. Returns invalid for events
// belay.CheckEvents refuses; too_large for more than the transaction holds
// (belay.MaxAppendEvents with a batch id); not_found if the run does not
// exist; conflict if it is terminal.
func (s *Store) AppendEvents(ctx context.Context, runID, batchID string, events []belay.EventInput) ([]belay.Event, error) {
	return s.appendEvents(ctx, runID, batchID, events, belay.SourceControl, nil)
}

// AppendSandboxEvents is AppendEvents for the sandbox's events: the same
// transaction sets the run's sandbox-event counters on META, planned
// against the META it read and guarded by the lastSeq condition (every
// writer of the counters also moves lastSeq), so a batch past the caps is
// refused with too_large and concurrent batches never overshoot them.
func (s *Store) AppendSandboxEvents(ctx context.Context, runID, batchID string, events []belay.EventInput, limits belay.SandboxEventLimits) ([]belay.Event, error) {
	if !limits.Valid() {
		return nil, belay.Errorf(belay.CodeInvalid, "sandbox event limits %+v must both be positive", limits)
	}
	return s.appendEvents(ctx, runID, batchID, events, belay.SourceSandbox, &limits)
}

func (s *Store) appendEvents(ctx context.Context, runID, batchID string, events []belay.EventInput, source string, limits *belay.SandboxEventLimits) ([]belay.Event, error) {
	if err := belay.CheckEvents(events); err != nil {
		return nil, err
	}
	digest := eventsDigest(events) + source
	for _, useToken := range []bool{true, false} {
		var replay *batchReplay
		appended, err := s.writeRun(ctx, runID, func(cur *runMeta) (*runChange, error) {
			switch {
			case cur == nil:
				return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
			case cur.terminal():
				if batchID != "" {
					// A batch repeated after the run ended still gets its answer.
					r, err := s.readBatch(ctx, runID, batchID)
					if err != nil {
						return nil, err
					}
					if r != nil {
						replay = r
						return nil, errNoChange
					}
				}
				return nil, belay.Errorf(belay.CodeConflict, "run %s is %s; its log has ended", runID, cur.run.Status)
			case len(events) == 0 && batchID == "":
				return nil, errNoChange
			}
			ch := &runChange{
				cond:   "NOT #status IN (:completed, :failed, :cancelled)",
				values: terminalValues(),
				events: events,
				source: source,
			}
			if limits != nil && len(events) > 0 {
				if err := belay.CheckSandboxEventLimits(*limits, cur.run.SandboxEvents, cur.run.SandboxEventBytes, events); err != nil {
					if batchID != "" {
						// A repeated batch gets its first answer, even at
						// the cap it helped reach.
						r, rerr := s.readBatch(ctx, runID, batchID)
						if rerr != nil {
							return nil, rerr
						}
						if r != nil {
							replay = r
							return nil, errNoChange
						}
					}
					return nil, err
				}
				size := cur.run.SandboxEventBytes
				for _, e := range events {
					size += belay.EventBytes(e)
				}
				ch.set = append(ch.set, "#sandboxEvents = :sandboxEvents", "#sandboxEventBytes = :sandboxEventBytes")
				ch.values[":sandboxEvents"] = avN(int64(cur.run.SandboxEvents + len(events)))
				ch.values[":sandboxEventBytes"] = avN(size)
			}
			if batchID != "" {
				b := keyOf(runPK(runID), batchSK(batchID))
				b["firstSeq"] = avN(cur.run.LastSeq + 1)
				b["count"] = avN(int64(len(events)))
				b[attrTTL] = avN(cur.ttl)
				ch.extra = []types.TransactWriteItem{{Put: &types.Put{
					TableName:                           s.table,
					Item:                                b,
					ConditionExpression:                 aws.String("attribute_not_exists(#PK)"),
					ExpressionAttributeNames:            exprNames("#PK"),
					ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
				}}}
				ch.extraFailed = func(_ int, old item) error {
					r, err := decodeBatch(old)
					if err != nil {
						return err
					}
					replay = r
					return errNoChange
				}
				if useToken {
					ch.token = requestToken("append", *s.table, runID, batchID, fmt.Sprint(cur.run.LastSeq), digest)
				}
			}
			return ch, nil
		})
		switch {
		case replay != nil:
			return s.batchEvents(ctx, runID, *replay)
		case errors.Is(err, errNoChange):
			return []belay.Event{}, nil
		case isAPICode(err, "IdempotentParameterMismatchException") && useToken:
			// Only a digest collision gets here: an earlier write under this
			// token had other parameters. The BATCH item tells whether it was
			// this batch; if not, write again under a token of the SDK's.
			r, err := s.readBatch(ctx, runID, batchID)
			if err != nil {
				return nil, err
			}
			if r != nil {
				return s.batchEvents(ctx, runID, *r)
			}
			continue
		case err != nil:
			return nil, err
		}
		return appended, nil
	}
	return nil, fmt.Errorf("append events to run %s: request token mismatch", runID)
}

// eventsDigest identifies a batch's content, so that the request token of
// a batch differs when its events do.
func eventsDigest(events []belay.EventInput) string {
	h := sha256.New()
	for _, e := range events {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%d\x00", e.Type, e.Time.UnixNano(), e.Data, len(e.Data))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// terminalValues are the values of the "not terminal" condition.
func terminalValues() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		":completed": avS(string(belay.StatusCompleted)),
		":failed":    avS(string(belay.StatusFailed)),
		":cancelled": avS(string(belay.StatusCancelled)),
	}
}

// readBatch reads a batch's record, strongly consistent; nil if absent.
func (s *Store) readBatch(ctx context.Context, runID, batchID string) (*batchReplay, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyOf(runPK(runID), batchSK(batchID)),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("read batch of run %s: %w", runID, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	return decodeBatch(out.Item)
}

func decodeBatch(it item) (*batchReplay, error) {
	if it == nil {
		return nil, errors.New("decode batch: no batch item came back")
	}
	d := decoder{it: it}
	r := &batchReplay{first: d.num("firstSeq"), count: d.num("count")}
	if d.err != nil {
		return nil, fmt.Errorf("decode batch: %w", d.err)
	}
	return r, nil
}

// batchEvents returns the events an earlier batch appended that are still
// in the buffer.
func (s *Store) batchEvents(ctx context.Context, runID string, b batchReplay) ([]belay.Event, error) {
	events := []belay.Event{}
	if b.count == 0 {
		return events, nil
	}
	m, err := s.readMeta(ctx, runID)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
	}
	from := max(b.first, m.run.LastSeq-s.buffer+1)
	to := b.first + b.count - 1
	if from > to {
		return events, nil
	}
	return s.queryEvents(ctx, runID, from, to, int(to-from+1))
}

// queryEvents reads up to limit events with from <= seq <= to, oldest first,
// strongly consistent.
func (s *Store) queryEvents(ctx context.Context, runID string, from, to int64, limit int) ([]belay.Event, error) {
	in := &dynamodb.QueryInput{
		TableName:                s.table,
		KeyConditionExpression:   aws.String("#PK = :pk AND #SK BETWEEN :from AND :to"),
		ExpressionAttributeNames: exprNames("#PK #SK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk":   avS(runPK(runID)),
			":from": avS(eventSK(from)),
			":to":   avS(eventSK(to)),
		},
		ConsistentRead: aws.Bool(true),
	}
	events := []belay.Event{}
	for len(events) < limit {
		in.Limit = aws.Int32(int32(limit - len(events)))
		out, err := s.client.Query(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("read events of run %s: %w", runID, err)
		}
		for _, it := range out.Items {
			e, err := decodeEvent(it)
			if err != nil {
				return nil, fmt.Errorf("run %s: %w", runID, err)
			}
			events = append(events, e)
		}
		if out.LastEvaluatedKey == nil {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	return events, nil
}

// ListEvents reads META first (for lastSeq, the buffer's bounds and whether
// the log ended), then the events after `after` up to that lastSeq, both
// strongly consistent, so a reader resuming with Last-Event-ID sees every
// event written before its request. Events older than the buffer may linger
// until a deferred trim or TTL removes them; they are never read. Returns
// not_found if the run does not exist.
func (s *Store) ListEvents(ctx context.Context, runID string, after int64, limit int) (belay.EventPage, error) {
	m, err := s.readMeta(ctx, runID)
	if err != nil {
		return belay.EventPage{}, err
	}
	if m == nil {
		return belay.EventPage{}, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
	}
	if limit <= 0 {
		limit = defaultEventLimit
	}
	limit = min(limit, maxEventLimit)
	after = max(after, 0)
	last := m.run.LastSeq
	page := belay.EventPage{
		Events:    []belay.Event{},
		LastSeq:   last,
		OldestSeq: max(1, last-s.buffer+1),
		Terminal:  m.terminal(),
	}
	from := max(after+1, page.OldestSeq)
	page.Missed = from > after+1 && last > after
	if from > last {
		return page, nil
	}
	if page.Events, err = s.queryEvents(ctx, runID, from, last, limit); err != nil {
		return belay.EventPage{}, err
	}
	// A writer may have trimmed the oldest of these between the two reads.
	if len(page.Events) > 0 && page.Events[0].Seq > from {
		page.OldestSeq = page.Events[0].Seq
		page.Missed = true
	}
	return page, nil
}
