package dynamo

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// claimRetention is how long after its expiry a claim item may linger
// before TTL removes it; an expired claim is refused by its condition
// whether or not it is still there.
const claimRetention = 24 * time.Hour

func claimPK(hash [32]byte) string { return "CLAIM#" + hex.EncodeToString(hash[:]) }

// CreateClaim puts the claim item, unused, in one transaction with a
// condition that the run's META exists. Returns invalid for a claim
// belay.CheckClaim refuses; not_found if the run does not exist; conflict
// if a claim with the same code hash exists.
func (s *Store) CreateClaim(ctx context.Context, c belay.Claim) error {
	if err := belay.CheckClaim(c); err != nil {
		return err
	}
	it := keyOf(claimPK(c.CodeHash), skClaim)
	it["runId"] = avS(c.RunID)
	it["attempt"] = avN(int64(c.Attempt))
	it["expiresAt"] = avN(c.ExpiresAt.UnixNano())
	it["used"] = avBool(false)
	it[attrTTL] = avN(c.ExpiresAt.Add(claimRetention).Unix())
	in := &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{ConditionCheck: &types.ConditionCheck{
			TableName:                s.table,
			Key:                      keyOf(runPK(c.RunID), skMeta),
			ConditionExpression:      aws.String("attribute_exists(#PK)"),
			ExpressionAttributeNames: exprNames("#PK"),
		}},
		{Put: &types.Put{
			TableName:                s.table,
			Item:                     it,
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
			return fmt.Errorf("create claim for run %s: %w", c.RunID, err)
		}
		reasons := canceled.CancellationReasons
		switch {
		case reasonCode(reasons[0]) == "ConditionalCheckFailed":
			return belay.Errorf(belay.CodeNotFound, "run %s not found", c.RunID)
		case reasonCode(reasons[1]) == "ConditionalCheckFailed":
			return belay.Errorf(belay.CodeConflict, "a claim with this code already exists")
		case !hasReason(reasons, "TransactionConflict"):
			return fmt.Errorf("create claim for run %s: %w", c.RunID, err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return fmt.Errorf("create claim for run %s: %w", c.RunID, err)
		}
	}
	return belay.Errorf(belay.CodeUnavailable, "run %s is being changed by too many writers at once; try again", c.RunID)
}

// claimUseCondition admits the use of a claim that exists, is unused and
// unexpired; runCondition, on the run's META, a running run at the claim's
// attempt. Both hold in the one transaction that marks the claim used.
const (
	claimUseCondition = "attribute_exists(#PK) AND #used = :false AND #expiresAt > :now"
	runCondition      = "#status = :running AND #attempt = :attempt"
)

// ConsumeClaim reads the claim (strongly consistent) to learn its run, and
// refuses at once what the item alone answers (unknown, another run, used,
// expired). It then marks the claim used in one transaction with a
// condition on the claim (unused, unexpired) and one on the run's META
// (running, at the claim's attempt), so of concurrent callers exactly one
// wins; a failed condition is classified from the items it returns. A
// refusal is a *belay.ClaimError and writes nothing.
func (s *Store) ConsumeClaim(ctx context.Context, codeHash [32]byte, runID string, now time.Time) (belay.Claim, error) {
	key := keyOf(claimPK(codeHash), skClaim)
	for attempt := range maxWriteAttempts {
		out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: key, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return belay.Claim{}, fmt.Errorf("read claim: %w", err)
		}
		if out.Item == nil {
			return belay.Claim{}, belay.RefuseClaim(belay.ClaimUnknown)
		}
		c, used, err := decodeClaim(out.Item, codeHash)
		if err != nil {
			return belay.Claim{}, err
		}
		switch {
		case runID != "" && runID != c.RunID:
			return belay.Claim{}, belay.RefuseClaim(belay.ClaimWrongRun)
		case used:
			return belay.Claim{}, belay.RefuseClaim(belay.ClaimUsed)
		case !now.Before(c.ExpiresAt):
			return belay.Claim{}, belay.RefuseClaim(belay.ClaimExpired)
		}
		_, err = s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
			{Update: &types.Update{
				TableName:                s.table,
				Key:                      key,
				UpdateExpression:         aws.String("SET #used = :true, #usedAt = :now"),
				ConditionExpression:      aws.String(claimUseCondition),
				ExpressionAttributeNames: exprNames("#used #usedAt", claimUseCondition),
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":true": avBool(true), ":false": avBool(false), ":now": avN(now.UnixNano()),
				},
			}},
			{ConditionCheck: &types.ConditionCheck{
				TableName:                s.table,
				Key:                      keyOf(runPK(c.RunID), skMeta),
				ConditionExpression:      aws.String(runCondition),
				ExpressionAttributeNames: exprNames(runCondition),
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":running": avS(string(belay.StatusRunning)), ":attempt": avN(int64(c.Attempt)),
				},
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}},
		}})
		if err == nil {
			return c, nil
		}
		var canceled *types.TransactionCanceledException
		if !errors.As(err, &canceled) || len(canceled.CancellationReasons) != 2 {
			return belay.Claim{}, fmt.Errorf("consume claim: %w", err)
		}
		reasons := canceled.CancellationReasons
		switch {
		case reasonCode(reasons[0]) == "ConditionalCheckFailed":
			// Used or expired meanwhile: the next read says which.
			continue
		case reasonCode(reasons[1]) == "ConditionalCheckFailed":
			m, err := decodeMeta(reasons[1].Item)
			if err != nil {
				return belay.Claim{}, err
			}
			if m == nil || m.run.Status != belay.StatusRunning {
				return belay.Claim{}, belay.RefuseClaim(belay.ClaimRunNotRunning)
			}
			return belay.Claim{}, belay.RefuseClaim(belay.ClaimWrongAttempt)
		case !hasReason(reasons, "TransactionConflict"):
			return belay.Claim{}, fmt.Errorf("consume claim: %w", err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return belay.Claim{}, fmt.Errorf("consume claim: %w", err)
		}
	}
	return belay.Claim{}, belay.Errorf(belay.CodeUnavailable, "the claim is being used by too many callers at once; try again")
}

// decodeClaim decodes a claim item and says whether it was used.
func decodeClaim(it item, hash [32]byte) (belay.Claim, bool, error) {
	d := decoder{it: it}
	c := belay.Claim{
		RunID:     d.str("runId"),
		Attempt:   int(d.num("attempt")),
		CodeHash:  hash,
		ExpiresAt: time.Unix(0, d.num("expiresAt")).UTC(),
	}
	used := d.boolean("used")
	if d.err != nil {
		return belay.Claim{}, false, fmt.Errorf("decode claim: %w", d.err)
	}
	return c, used, nil
}

// sandboxRefCondition admits recording the sandbox of a run that exists,
// has not ended and is at the given attempt.
const sandboxRefCondition = "attribute_exists(#PK) AND #attempt = :attempt AND NOT #status IN (:completed, :failed, :cancelled)"

// RecordSandboxRef sets the run's sandboxRef with one conditional update of
// META, which leaves lastSeq alone (no event writer has to retry). Returns
// invalid for a bad ref; not_found if the run does not exist; conflict if
// it is terminal or at another attempt.
func (s *Store) RecordSandboxRef(ctx context.Context, runID string, attempt int, ref string) error {
	if err := belay.CheckSandboxRef(ref); err != nil {
		return err
	}
	values := terminalValues()
	values[":attempt"] = avN(int64(attempt))
	values[":ref"] = avS(ref)
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 keyOf(runPK(runID), skMeta),
		UpdateExpression:                    aws.String("SET #sandboxRef = :ref"),
		ConditionExpression:                 aws.String(sandboxRefCondition),
		ExpressionAttributeNames:            exprNames("#sandboxRef", sandboxRefCondition),
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		m, err := decodeMeta(failed.Item)
		switch {
		case err != nil:
			return err
		case m == nil:
			return belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		case m.terminal():
			return belay.Errorf(belay.CodeConflict, "run %s is already %s", runID, m.run.Status)
		}
		return belay.Errorf(belay.CodeConflict, "run %s is at attempt %d, not %d", runID, m.run.Attempt, attempt)
	}
	if err != nil {
		return fmt.Errorf("record sandbox of run %s: %w", runID, err)
	}
	return nil
}
