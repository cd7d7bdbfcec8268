package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// spendCondition is consumeCondition pinned to the count of requests the
// spend was planned on, so the model.request event written in the same
// transaction states what is left exactly.
const spendCondition = consumeCondition + " AND #usedRequests = :used"

// SpendModelRequest reads the run's CAP and META items in one consistent
// BatchGetItem, decides the outcome from them as ConsumeModelRequest would
// (a refusal read consistently is a refusal), and writes an ok spend as one
// transaction: CAP's count, conditioned on every consume condition and on
// the count it read; META's lastSeq, conditioned on the run being live and
// on the lastSeq it read; and the model.request event. A writer that got
// there first fails a condition and returns the item as it now is, which
// the spend plans against again, without another read. A run that has
// ended (its capability not yet revoked) or is gone is inactive.
func (s *Store) SpendModelRequest(ctx context.Context, runID string, call belay.ModelCall, now time.Time) (belay.ConsumeResult, error) {
	capItem, meta, err := s.readCapAndMeta(ctx, runID)
	if err != nil {
		return belay.ConsumeResult{}, err
	}
	for attempt := range maxWriteAttempts {
		if capItem == nil {
			return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
		}
		c, err := decodeCapability(capItem)
		if err != nil {
			return belay.ConsumeResult{}, fmt.Errorf("spend for run %s: %w", runID, err)
		}
		left := max(0, c.MaxRequests-c.UsedRequests)
		switch {
		case c.State != belay.CapabilityActive || c.Model != call.Model:
			return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
		case !now.Before(c.ExpiresAt):
			return belay.ConsumeResult{Outcome: belay.ConsumeExpired, Remaining: left}, nil
		case left == 0:
			return belay.ConsumeResult{Outcome: belay.ConsumeExhausted}, nil
		case meta == nil || meta.terminal():
			return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
		}
		remaining := left - 1
		ch := &runChange{
			cond:   "NOT #status IN (:completed, :failed, :cancelled)",
			values: terminalValues(),
			events: []belay.EventInput{belay.ModelRequestEvent(now, call, remaining)},
			extra: []types.TransactWriteItem{{Update: &types.Update{
				TableName:                s.table,
				Key:                      keyOf(runPK(runID), skCap),
				UpdateExpression:         aws.String("SET #usedRequests = #usedRequests + :one"),
				ConditionExpression:      aws.String(spendCondition),
				ExpressionAttributeNames: exprNames(spendCondition),
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":one":    avN(1),
					":active": avS(string(belay.CapabilityActive)),
					":model":  avS(call.Model),
					":now":    avN(now.UnixNano()),
					":used":   avN(int64(c.UsedRequests)),
				},
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}}},
		}
		tx, _, deferred, err := s.transaction(runID, meta, ch)
		if err != nil {
			return belay.ConsumeResult{}, err
		}
		_, err = s.client.TransactWriteItems(ctx, tx)
		if err == nil {
			s.deleteEvents(ctx, runID, deferred)
			return belay.ConsumeResult{Outcome: belay.ConsumeOK, Remaining: remaining}, nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) || len(canceled.CancellationReasons) != len(tx.TransactItems) {
			return belay.ConsumeResult{}, fmt.Errorf("spend for run %s: %w", runID, err)
		}
		reasons := canceled.CancellationReasons
		metaFailed := reasonCode(reasons[0]) == "ConditionalCheckFailed"
		capFailed := reasonCode(reasons[1]) == "ConditionalCheckFailed"
		if metaFailed || capFailed {
			// Plan again against the items as they are now.
			if metaFailed {
				if meta, err = decodeMeta(reasons[0].Item); err != nil {
					return belay.ConsumeResult{}, err
				}
			}
			if capFailed {
				capItem = reasons[1].Item
			}
			continue
		}
		if !hasReason(reasons, "TransactionConflict") {
			return belay.ConsumeResult{}, fmt.Errorf("spend for run %s: %w", runID, err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return belay.ConsumeResult{}, fmt.Errorf("spend for run %s: %w", runID, err)
		}
		if capItem, meta, err = s.readCapAndMeta(ctx, runID); err != nil {
			return belay.ConsumeResult{}, err
		}
	}
	return belay.ConsumeResult{}, belay.Errorf(belay.CodeUnavailable, "run %s is being changed by too many writers at once; try again", runID)
}

// readCapAndMeta reads the run's CAP and META items, strongly consistent,
// in one BatchGetItem; either is nil when absent.
func (s *Store) readCapAndMeta(ctx context.Context, runID string) (item, *runMeta, error) {
	keys := []map[string]types.AttributeValue{keyOf(runPK(runID), skCap), keyOf(runPK(runID), skMeta)}
	var capItem, metaItem item
	for attempt := 0; len(keys) > 0; attempt++ {
		if attempt == MaxAttempts {
			return nil, nil, belay.Errorf(belay.CodeUnavailable, "could not read run %s: DynamoDB left the read unprocessed; try again", runID)
		}
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return nil, nil, fmt.Errorf("read run %s: %w", runID, err)
			}
		}
		out, err := s.client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
			*s.table: {Keys: keys, ConsistentRead: aws.Bool(true)},
		}})
		if err != nil {
			return nil, nil, fmt.Errorf("read run %s: %w", runID, err)
		}
		for _, it := range out.Responses[*s.table] {
			switch {
			case isItem(it, skCap):
				capItem = it
			case isItem(it, skMeta):
				metaItem = it
			}
		}
		keys = out.UnprocessedKeys[*s.table].Keys
	}
	meta, err := decodeMeta(metaItem)
	if err != nil {
		return nil, nil, err
	}
	return capItem, meta, nil
}

// errRunEnded is a plan's note that the run has ended, so only its usage
// is written.
var errRunEnded = errors.New("run ended")

// RecordModelResponse adds the usage on META and appends the model.response
// event in one run write (see writeRun): conditioned on the run being live
// and on its lastSeq, re-planned when another writer got there first. For
// a run that has ended, only the usage is added (RecordUsage's atomic ADD).
func (s *Store) RecordModelResponse(ctx context.Context, runID string, d belay.UsageDelta, response belay.EventInput) (bool, error) {
	if err := belay.CheckEvents([]belay.EventInput{response}); err != nil {
		return false, err
	}
	_, err := s.writeRun(ctx, runID, func(cur *runMeta) (*runChange, error) {
		switch {
		case cur == nil:
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		case cur.terminal():
			return nil, errRunEnded
		}
		values := terminalValues()
		values[":m"] = avN(int64(d.ModelRequests))
		values[":p"] = avN(d.PromptTokens)
		values[":c"] = avN(d.CompletionTokens)
		return &runChange{
			set: []string{
				"#modelRequests = #modelRequests + :m",
				"#promptTokens = #promptTokens + :p",
				"#completionTokens = #completionTokens + :c",
			},
			cond:   "NOT #status IN (:completed, :failed, :cancelled)",
			values: values,
			events: []belay.EventInput{response},
		}, nil
	})
	if errors.Is(err, errRunEnded) {
		return false, s.RecordUsage(ctx, runID, d)
	}
	if err != nil {
		return false, err
	}
	return true, nil
}
