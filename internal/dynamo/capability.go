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

// ActivateCapability puts the run's CAP item if there is none, in one
// transaction with a condition that the run's META exists, so a
// capability is never swapped mid-run or revived after revocation, and
// never made for a run that does not exist. Its TTL is the retention after
// its expiry. Returns invalid for a capability belay.CheckCapability
// refuses; not_found if the run does not exist; conflict if the run
// already has a capability.
func (s *Store) ActivateCapability(ctx context.Context, c belay.Capability) error {
	if err := belay.CheckCapability(c); err != nil {
		return err
	}
	in := &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{ConditionCheck: &types.ConditionCheck{
			TableName:                s.table,
			Key:                      keyOf(runPK(c.RunID), skMeta),
			ConditionExpression:      aws.String("attribute_exists(#PK)"),
			ExpressionAttributeNames: exprNames("#PK"),
		}},
		{Put: &types.Put{
			TableName:                s.table,
			Item:                     capabilityItem(c, c.ExpiresAt.Add(s.retention).Unix()),
			ConditionExpression:      aws.String("attribute_not_exists(#PK)"),
			ExpressionAttributeNames: exprNames("#PK"),
		}},
	}}
	for attempt := range maxWriteAttempts {
		_, err := s.client.TransactWriteItems(ctx, in)
		if err == nil {
			return nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) || len(canceled.CancellationReasons) != 2 {
			return fmt.Errorf("activate capability of run %s: %w", c.RunID, err)
		}
		reasons := canceled.CancellationReasons
		switch {
		case reasonCode(reasons[0]) == "ConditionalCheckFailed":
			return belay.Errorf(belay.CodeNotFound, "run %s not found", c.RunID)
		case reasonCode(reasons[1]) == "ConditionalCheckFailed":
			return belay.Errorf(belay.CodeConflict, "run %s already has a capability", c.RunID)
		case !hasReason(reasons, "TransactionConflict"):
			return fmt.Errorf("activate capability of run %s: %w", c.RunID, err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return fmt.Errorf("activate capability of run %s: %w", c.RunID, err)
		}
	}
	return belay.Errorf(belay.CodeUnavailable, "run %s is being changed by too many writers at once; try again", c.RunID)
}

// consumeCondition admits a consume only for the active capability of the
// model, before its expiry (checked here: TTL deletion is lazy, so an expired
// item may still exist), with budget left.
const consumeCondition = "#state = :active AND #model = :model AND #expiresAt > :now AND #usedRequests < #maxRequests"

// ConsumeModelRequest spends one request with one conditional UpdateItem.
// When the condition fails, the item as it was (ALL_OLD) says why, without a
// second read: absent, revoked or another model is inactive (with nothing
// left to spend); past expiry is expired; otherwise the budget is
// exhausted.
func (s *Store) ConsumeModelRequest(ctx context.Context, runID, model string, now time.Time) (belay.ConsumeResult, error) {
	out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(runPK(runID), skCap),
		UpdateExpression:         aws.String("SET #usedRequests = #usedRequests + :one"),
		ConditionExpression:      aws.String(consumeCondition),
		ExpressionAttributeNames: exprNames(consumeCondition),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":one":    avN(1),
			":active": avS(string(belay.CapabilityActive)),
			":model":  avS(model),
			":now":    avN(now.UnixNano()),
		},
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		if failed.Item == nil {
			return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
		}
		c, err := decodeCapability(failed.Item)
		if err != nil {
			return belay.ConsumeResult{}, fmt.Errorf("consume for run %s: %w", runID, err)
		}
		left := max(0, c.MaxRequests-c.UsedRequests)
		switch {
		case c.State != belay.CapabilityActive || c.Model != model:
			return belay.ConsumeResult{Outcome: belay.ConsumeInactive}, nil
		case !now.Before(c.ExpiresAt):
			return belay.ConsumeResult{Outcome: belay.ConsumeExpired, Remaining: left}, nil
		default:
			return belay.ConsumeResult{Outcome: belay.ConsumeExhausted, Remaining: left}, nil
		}
	}
	if err != nil {
		return belay.ConsumeResult{}, fmt.Errorf("consume for run %s: %w", runID, err)
	}
	c, err := decodeCapability(out.Attributes)
	if err != nil {
		return belay.ConsumeResult{}, fmt.Errorf("consume for run %s: %w", runID, err)
	}
	return belay.ConsumeResult{Outcome: belay.ConsumeOK, Remaining: max(0, c.MaxRequests-c.UsedRequests)}, nil
}

// RevokeCapability marks the run's capability revoked; a run without one
// is left alone, so it is idempotent.
func (s *Store) RevokeCapability(ctx context.Context, runID string) error {
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 s.table,
		Key:                       keyOf(runPK(runID), skCap),
		UpdateExpression:          aws.String("SET #state = :revoked"),
		ConditionExpression:       aws.String("attribute_exists(#PK)"),
		ExpressionAttributeNames:  exprNames("#state #PK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":revoked": avS(string(belay.CapabilityRevoked))},
	})
	var failed *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &failed) {
		return fmt.Errorf("revoke capability of run %s: %w", runID, err)
	}
	return nil
}

// GetCapability reads the run's capability, strongly consistent. Returns
// not_found if it has none.
func (s *Store) GetCapability(ctx context.Context, runID string) (belay.Capability, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyOf(runPK(runID), skCap),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return belay.Capability{}, fmt.Errorf("get capability of run %s: %w", runID, err)
	}
	if out.Item == nil {
		return belay.Capability{}, belay.Errorf(belay.CodeNotFound, "run %s has no capability", runID)
	}
	return decodeCapability(out.Item)
}
