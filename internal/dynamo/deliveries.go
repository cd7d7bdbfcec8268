package dynamo

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// skDelivery is the sort key of a delivery's item, "DELIVERY#<provider>#<id>"
// / "DELIVERY": a redelivery is looked up by what the host sends, never by
// run.
const skDelivery = "DELIVERY"

func deliveryPK(provider, id string) string { return "DELIVERY#" + provider + "#" + id }

// RecordDelivery puts the delivery's item with the condition that it does
// not exist, in one write; when it does, the condition failure returns the
// stored item, which is the answer. Returns invalid for a delivery
// belay.CheckDelivery refuses.
func (s *Store) RecordDelivery(ctx context.Context, d belay.Delivery) (belay.Delivery, bool, error) {
	if err := belay.CheckDelivery(d); err != nil {
		return belay.Delivery{}, false, err
	}
	it := keyOf(deliveryPK(d.Provider, d.ID), skDelivery)
	it["provider"] = avS(d.Provider)
	it["deliveryId"] = avS(d.ID)
	if d.RunID != "" {
		it["runId"] = avS(d.RunID)
	}
	if d.Ignored != "" {
		it["ignored"] = avS(d.Ignored)
	}
	it["receivedAt"] = avTime(d.ReceivedAt)
	it[attrTTL] = avN(s.ttlOf(d.ReceivedAt))
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           s.table,
		Item:                                it,
		ConditionExpression:                 aws.String("attribute_not_exists(#PK)"),
		ExpressionAttributeNames:            exprNames("#PK"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var failed *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		stored := d
		stored.ReceivedAt = d.ReceivedAt.UTC()
		return stored, true, nil
	case !errors.As(err, &failed):
		return belay.Delivery{}, false, fmt.Errorf("record delivery %s/%s: %w", d.Provider, d.ID, err)
	}
	dec := &decoder{it: failed.Item}
	stored := belay.Delivery{
		Provider:   dec.str("provider"),
		ID:         dec.str("deliveryId"),
		RunID:      dec.str("runId"),
		Ignored:    dec.str("ignored"),
		ReceivedAt: dec.time("receivedAt"),
	}
	if dec.err != nil {
		return belay.Delivery{}, false, fmt.Errorf("record delivery %s/%s: decode the stored one: %w", d.Provider, d.ID, dec.err)
	}
	return stored, false, nil
}
