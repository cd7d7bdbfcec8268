package dynamo

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// CreateRun stores the run, its request, its run.queued event and (with a
// key) its idempotency item in one transaction. The idempotency item is
// conditioned on being absent or past its TTL; when that condition fails,
// the item returned with the failure names the earlier run and its request
// hash, which decides between the earlier run and conflict. Returns invalid
// for a run belay.PrepareNewRun refuses; conflict if the key was used with
// another request or the run id exists.
func (s *Store) CreateRun(ctx context.Context, asked belay.Run, idempotencyKey string) (belay.Run, bool, error) {
	run, err := belay.PrepareNewRun(asked)
	if err != nil {
		return belay.Run{}, false, err
	}
	chunks, err := encodeRequest(run.Request)
	if err != nil {
		return belay.Run{}, false, fmt.Errorf("create run %s: %w", run.ID, err)
	}
	run.CreatedAt = run.CreatedAt.UTC()
	run.UpdatedAt = run.UpdatedAt.UTC()
	run.LastSeq = 1
	ttl := s.ttlOf(run.CreatedAt)
	meta, err := metaItem(run, len(chunks), ttl)
	if err != nil {
		return belay.Run{}, false, fmt.Errorf("create run %s: %w", run.ID, err)
	}
	in := belay.RunQueuedEvent(run)
	queued := belay.Event{Seq: 1, Time: in.Time, Type: in.Type, Source: belay.SourceControl, Data: in.Data}

	items := []types.TransactWriteItem{{Put: &types.Put{
		TableName:                           s.table,
		Item:                                meta,
		ConditionExpression:                 aws.String("attribute_not_exists(#PK)"),
		ExpressionAttributeNames:            exprNames("#PK"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}}
	idemIndex := -1
	if idempotencyKey != "" {
		idemIndex = len(items)
		idem := keyOf(idemPK(idempotencyKey), skIdem)
		idem["runId"] = avS(run.ID)
		idem["requestHash"] = avS(run.RequestHash)
		idem[attrTTL] = avN(ttl)
		items = append(items, types.TransactWriteItem{Put: &types.Put{
			TableName:                           s.table,
			Item:                                idem,
			ConditionExpression:                 aws.String("attribute_not_exists(#PK) OR #ttl < :now"),
			ExpressionAttributeNames:            exprNames("attribute_not_exists(#PK) OR #ttl < :now"),
			ExpressionAttributeValues:           map[string]types.AttributeValue{":now": avN(run.CreatedAt.Unix())},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}})
	}
	items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: s.table, Item: eventItem(run.ID, queued, ttl)}})
	for i, c := range chunks {
		it := keyOf(runPK(run.ID), requestSK(i))
		it["data"] = avB(c)
		it[attrTTL] = avN(ttl)
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: s.table, Item: it}})
	}

	for attempt := range maxWriteAttempts {
		_, err := s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			return run, true, nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) || len(canceled.CancellationReasons) != len(items) {
			return belay.Run{}, false, fmt.Errorf("create run %s: %w", run.ID, err)
		}
		reasons := canceled.CancellationReasons
		if idemIndex >= 0 && reasonCode(reasons[idemIndex]) == "ConditionalCheckFailed" {
			d := decoder{it: reasons[idemIndex].Item}
			earlierID, earlierHash := d.str("runId"), d.str("requestHash")
			if d.err != nil {
				return belay.Run{}, false, fmt.Errorf("create run %s: malformed idempotency item: %w", run.ID, d.err)
			}
			if earlierID == "" {
				return belay.Run{}, false, fmt.Errorf("create run %s: idempotency item names no run", run.ID)
			}
			if earlierHash != run.RequestHash {
				return belay.Run{}, false, belay.Errorf(belay.CodeConflict, "idempotency key was already used with a different request")
			}
			earlier, err := s.GetRun(ctx, earlierID)
			if err != nil {
				return belay.Run{}, false, fmt.Errorf("create run: read earlier run %s: %w", earlierID, err)
			}
			return earlier, false, nil
		}
		if reasonCode(reasons[0]) == "ConditionalCheckFailed" {
			return belay.Run{}, false, belay.Errorf(belay.CodeConflict, "run %s already exists", run.ID)
		}
		if !hasReason(reasons, "TransactionConflict") {
			return belay.Run{}, false, fmt.Errorf("create run %s: %w", run.ID, err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return belay.Run{}, false, fmt.Errorf("create run %s: %w", run.ID, err)
		}
	}
	return belay.Run{}, false, belay.Errorf(belay.CodeUnavailable, "too many concurrent writes; try again")
}

// GetRun reads the run's META and request chunks in one strongly consistent
// query (they sort together: "META" < "REQ#…"). Returns not_found if the run
// does not exist.
func (s *Store) GetRun(ctx context.Context, id string) (belay.Run, error) {
	var items []item
	in := &dynamodb.QueryInput{
		TableName:                 s.table,
		KeyConditionExpression:    aws.String("#PK = :pk AND #SK >= :meta"),
		ExpressionAttributeNames:  exprNames("#PK #SK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": avS(runPK(id)), ":meta": avS(skMeta)},
		ConsistentRead:            aws.Bool(true),
	}
	for p := dynamodb.NewQueryPaginator(s.client, in); p.HasMorePages(); {
		out, err := p.NextPage(ctx)
		if err != nil {
			return belay.Run{}, fmt.Errorf("get run %s: %w", id, err)
		}
		items = append(items, out.Items...)
	}
	if len(items) == 0 || !isItem(items[0], skMeta) {
		return belay.Run{}, belay.Errorf(belay.CodeNotFound, "run %s not found", id)
	}
	m, err := decodeMeta(items[0])
	if err != nil {
		return belay.Run{}, err
	}
	chunks := make([][]byte, 0, len(items)-1)
	for _, it := range items[1:] {
		if d := (&decoder{it: it}); strings.HasPrefix(d.str(attrSK), prefixReq) {
			chunks = append(chunks, d.bytes("data"))
		}
	}
	if len(chunks) != m.reqChunks {
		return belay.Run{}, fmt.Errorf("get run %s: %d request chunks, want %d", id, len(chunks), m.reqChunks)
	}
	if m.run.Request, err = decodeRequest(chunks); err != nil {
		return belay.Run{}, fmt.Errorf("get run %s: %w", id, err)
	}
	return m.run, nil
}

// The page sizes of ListRuns.
const (
	defaultListLimit = 50
	maxListLimit     = 100
)

// listCursor is the position after which the next page of ListRuns starts.
// It is bound to the status filter it was issued for.
type listCursor struct {
	Version int    `json:"v"`
	Status  string `json:"s,omitempty"`
	SortKey string `json:"k"`
	RunID   string `json:"r"`
}

// ListRuns reads the listing index newest first: all runs (GSI1) or the runs
// of one status (GSI2). The indexes hold only keys and the request's chunk
// count, so the META updates of event appends and usage never write to them;
// each page then reads its runs' META and request items in one batch. Index
// reads are eventually consistent: a run created a moment ago may be missing
// for a moment, and a run whose status just changed is skipped by the
// filter it no longer matches (its META, read after, is the truth). Each
// page looks for one run more than it returns, so NextCursor is empty exactly
// on the last page. Returns invalid for a cursor it did not issue or issued
// for another status filter.
func (s *Store) ListRuns(ctx context.Context, q belay.ListRunsQuery) (belay.RunPage, error) {
	if q.Status != "" && !q.Status.Valid() {
		return belay.RunPage{}, belay.FieldErrorf(belay.CodeInvalid, "status", "unknown status %q", q.Status)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)

	index, partitionAttr, partition := indexAllRuns, attrGSI1PK, gsi1AllRuns
	if q.Status != "" {
		index, partitionAttr, partition = indexRunsByStatus, attrGSI2PK, statusPK(q.Status)
	}
	in := &dynamodb.QueryInput{
		TableName:                 s.table,
		IndexName:                 aws.String(index),
		KeyConditionExpression:    aws.String("#" + partitionAttr + " = :p"),
		ExpressionAttributeNames:  exprNames("#" + partitionAttr),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": avS(partition)},
		ScanIndexForward:          aws.Bool(false),
	}
	if q.Cursor != "" {
		c, err := decodeCursor(q.Cursor)
		if err != nil || c.Status != string(q.Status) {
			return belay.RunPage{}, belay.FieldErrorf(belay.CodeInvalid, "cursor", "not a cursor of this listing")
		}
		start := keyOf(runPK(c.RunID), skMeta)
		start[attrGSI1SK] = avS(c.SortKey)
		start[partitionAttr] = avS(partition)
		in.ExclusiveStartKey = start
	}

	var runs []belay.Run
	for len(runs) <= limit {
		in.Limit = aws.Int32(int32(limit + 1 - len(runs)))
		out, err := s.client.Query(ctx, in)
		if err != nil {
			return belay.RunPage{}, fmt.Errorf("list runs: %w", err)
		}
		found, err := s.readListed(ctx, out.Items)
		if err != nil {
			return belay.RunPage{}, fmt.Errorf("list runs: %w", err)
		}
		for _, r := range found {
			if q.Status == "" || r.Status == q.Status {
				runs = append(runs, r)
			}
		}
		if out.LastEvaluatedKey == nil {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}

	var page belay.RunPage
	if len(runs) > limit {
		runs = runs[:limit]
		last := runs[limit-1]
		page.NextCursor = encodeCursor(listCursor{Version: 1, Status: string(q.Status), SortKey: listSK(last.CreatedAt, last.ID), RunID: last.ID})
	}
	page.Runs = runs
	if page.Runs == nil {
		page.Runs = []belay.Run{}
	}
	return page, nil
}

func encodeCursor(c listCursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (listCursor, error) {
	var c listCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return c, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, err
	}
	if c.Version != 1 || c.RunID == "" || !strings.HasSuffix(c.SortKey, "#"+c.RunID) {
		return c, errors.New("malformed cursor")
	}
	if _, err := time.Parse(timeLayout, strings.TrimSuffix(c.SortKey, "#"+c.RunID)); err != nil {
		return c, errors.New("malformed cursor")
	}
	return c, nil
}

// readListed reads the META and request items of the runs that index
// entries name, in one batch, strongly consistent, and returns the runs in
// index order. A run deleted since (by TTL) is left out.
func (s *Store) readListed(ctx context.Context, entries []item) ([]belay.Run, error) {
	var keys []item
	for _, e := range entries {
		d := decoder{it: e}
		pk, chunks := d.str(attrPK), int(d.num("reqChunks"))
		if d.err != nil {
			return nil, fmt.Errorf("index entry %s: %w", pk, d.err)
		}
		keys = append(keys, keyOf(pk, skMeta))
		for c := range chunks {
			keys = append(keys, keyOf(pk, requestSK(c)))
		}
	}
	got, err := s.batchGet(ctx, keys)
	if err != nil {
		return nil, err
	}
	var runs []belay.Run
	for _, e := range entries {
		pk := (&decoder{it: e}).str(attrPK)
		m, err := decodeMeta(got[pk+"/"+skMeta])
		if err != nil {
			return nil, err
		}
		if m == nil {
			continue
		}
		chunks := make([][]byte, m.reqChunks)
		for c := range chunks {
			it, ok := got[pk+"/"+requestSK(c)]
			if !ok {
				return nil, fmt.Errorf("run %s: request chunk %d missing", m.run.ID, c)
			}
			chunks[c] = (&decoder{it: it}).bytes("data")
		}
		if m.run.Request, err = decodeRequest(chunks); err != nil {
			return nil, fmt.Errorf("run %s: %w", m.run.ID, err)
		}
		runs = append(runs, m.run)
	}
	return runs, nil
}

// batchGet reads items by key, strongly consistent, 100 keys a call (the
// BatchGetItem limit), retrying what DynamoDB leaves unprocessed. The result
// is keyed "PK/SK".
func (s *Store) batchGet(ctx context.Context, keys []item) (map[string]item, error) {
	got := make(map[string]item, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), 100)
		pending := map[string]types.KeysAndAttributes{*s.table: {Keys: keys[:n], ConsistentRead: aws.Bool(true)}}
		keys = keys[n:]
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt == MaxAttempts {
				return nil, errors.New("batch read: keys left unprocessed")
			}
			if attempt > 0 {
				if err := sleep(ctx, backoff(attempt)); err != nil {
					return nil, err
				}
			}
			out, err := s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: pending})
			if err != nil {
				return nil, fmt.Errorf("batch read: %w", err)
			}
			for _, it := range out.Responses[*s.table] {
				d := decoder{it: it}
				got[d.str(attrPK)+"/"+d.str(attrSK)] = it
			}
			pending = out.UnprocessedKeys
		}
	}
	return got, nil
}

// Transition moves the run to t.To, recording the outcome and appending
// t.Events in one transaction conditioned on the status it moves from (see
// belay.AllowedFrom) and on lastSeq, so that a late completion cannot
// overwrite a cancellation. An event without a time takes t.At. Returns
// invalid for an unknown state or a malformed event; not_found if the run
// does not exist; conflict if its state does not allow the move.
func (s *Store) Transition(ctx context.Context, id string, t belay.Transition) (belay.Run, error) {
	if !t.To.Valid() {
		return belay.Run{}, belay.FieldErrorf(belay.CodeInvalid, "status", "unknown status %q", t.To)
	}
	if t.Attempt < 0 {
		return belay.Run{}, belay.FieldErrorf(belay.CodeInvalid, "attempt", "must not be negative, not %d", t.Attempt)
	}
	events := t.TimedEvents()
	if err := belay.CheckEvents(events); err != nil {
		return belay.Run{}, err
	}
	at := t.At.UTC()
	_, err := s.writeRun(ctx, id, func(cur *runMeta) (*runChange, error) {
		if cur == nil {
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", id)
		}
		if !belay.CanTransition(cur.run.Status, t.To) {
			return nil, belay.Errorf(belay.CodeConflict, "run %s is %s and cannot become %s", id, cur.run.Status, t.To)
		}
		ch := &runChange{
			set:  []string{"#status = :to", "#GSI2PK = :statusPK", "#updatedAt = :at"},
			cond: "#status = :from",
			values: map[string]types.AttributeValue{
				":to":       avS(string(t.To)),
				":from":     avS(string(cur.run.Status)),
				":statusPK": avS(statusPK(t.To)),
				":at":       avTime(at),
			},
			events: events,
		}
		if t.To == belay.StatusRunning {
			ch.set = append(ch.set, "#startedAt = :at")
		}
		if t.To.Terminal() {
			ch.set = append(ch.set, "#finishedAt = :at")
		}
		if t.Reason != "" {
			ch.set = append(ch.set, "#reason = :reason")
			ch.values[":reason"] = avS(t.Reason)
		}
		if t.Attempt > 0 {
			ch.set = append(ch.set, "#attempt = :attempt")
			ch.values[":attempt"] = avN(int64(t.Attempt))
		}
		if t.ExitCode != nil {
			ch.set = append(ch.set, "#exitCode = :exitCode")
			ch.values[":exitCode"] = avN(int64(*t.ExitCode))
		}
		outcome := item{}
		if err := outcomeAttrs(outcome, t.Checks, t.ChangedFiles, t.Artifacts); err != nil {
			return nil, err
		}
		for name, v := range outcome {
			ch.set = append(ch.set, "#"+name+" = :"+name)
			ch.values[":"+name] = v
		}
		return ch, nil
	})
	if err != nil {
		return belay.Run{}, err
	}
	return s.GetRun(ctx, id)
}

// RequestCancel sets cancelRequested and appends run.cancel_requested, once.
// Returns not_found if the run does not exist; conflict if it is terminal.
func (s *Store) RequestCancel(ctx context.Context, id string, at time.Time) (belay.Run, error) {
	_, err := s.writeRun(ctx, id, func(cur *runMeta) (*runChange, error) {
		switch {
		case cur == nil:
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", id)
		case cur.terminal():
			return nil, belay.Errorf(belay.CodeConflict, "run %s is already %s", id, cur.run.Status)
		case cur.run.CancelRequested:
			return nil, errNoChange
		}
		return &runChange{
			set:  []string{"#cancelRequested = :true", "#updatedAt = :at"},
			cond: "#status = :from AND #cancelRequested = :false",
			values: map[string]types.AttributeValue{
				":true":  avBool(true),
				":false": avBool(false),
				":from":  avS(string(cur.run.Status)),
				":at":    avTime(at),
			},
			events: []belay.EventInput{{Time: at, Type: belay.EventCancelRequested}},
		}, nil
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return belay.Run{}, err
	}
	return s.GetRun(ctx, id)
}

// RecordUsage adds d to the run's usage counters with one atomic ADD; it
// leaves lastSeq alone, so it never makes an event writer retry. Returns
// not_found if the run does not exist.
func (s *Store) RecordUsage(ctx context.Context, id string, d belay.UsageDelta) error {
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(runPK(id), skMeta),
		UpdateExpression:         aws.String("ADD #modelRequests :m, #promptTokens :p, #completionTokens :c"),
		ConditionExpression:      aws.String("attribute_exists(#PK)"),
		ExpressionAttributeNames: exprNames("#modelRequests #promptTokens #completionTokens #PK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":m": avN(int64(d.ModelRequests)),
			":p": avN(d.PromptTokens),
			":c": avN(d.CompletionTokens),
		},
	})
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		return belay.Errorf(belay.CodeNotFound, "run %s not found", id)
	}
	if err != nil {
		return fmt.Errorf("record usage of run %s: %w", id, err)
	}
	return nil
}
