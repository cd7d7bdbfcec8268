package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/dynamo"
	"github.com/belay-dev/belay/internal/storetest"
)

// openStore gives the conformance suite a store on a fresh table.
func openStore(tb testing.TB, opts storetest.Options) belay.Store {
	tb.Helper()
	return newPeer(tb, dynamo.Options{EventBufferSize: opts.EventBufferSize}).store
}

func TestConformance(t *testing.T) {
	storetest.Run(t, openStore)
}

func BenchmarkConsume(b *testing.B) {
	storetest.BenchmarkConsume(b, openStore)
}

// BenchmarkConsumeParallel measures consumes from many goroutines on one
// capability: the model proxy under load, where every consume is a
// conditional write to the same item.
func BenchmarkConsumeParallel(b *testing.B) {
	p := newPeer(b, dynamo.Options{})
	ctx := b.Context()
	mustCreate(b, p.store, newRun("run-bench", t0))
	if err := p.store.ActivateCapability(ctx, belay.Capability{RunID: "run-bench", Model: "test-model", ExpiresAt: t0.Add(time.Hour), MaxRequests: 1 << 30}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := p.store.ConsumeModelRequest(ctx, "run-bench", "test-model", t0)
			if err != nil || res.Outcome != belay.ConsumeOK {
				b.Errorf("consume = %+v, %v", res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkRequestSize times an event and a spend on a run with a small
// request against one with a tree at the reference limits (see
// storetest.BenchmarkRequestSize).
func BenchmarkRequestSize(b *testing.B) {
	storetest.BenchmarkRequestSize(b, func(tb testing.TB, opts storetest.Options) belay.Store {
		return newPeer(tb, dynamo.Options{EventBufferSize: opts.EventBufferSize}).store
	})
}

// BenchmarkModelCall times a proxied model call's two store writes (see
// storetest.BenchmarkModelCall) on DynamoDB Local, for the record: against
// one UpdateItem (the cheapest write, what ConsumeModelRequest is) and a
// one-item TransactWriteItems, on a scratch item of the same table.
func BenchmarkModelCall(b *testing.B) {
	var p peer
	open := func(tb testing.TB, opts storetest.Options) belay.Store {
		p = newPeer(tb, dynamo.Options{EventBufferSize: opts.EventBufferSize})
		return p.store
	}
	scratch := map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "BENCH#scratch"},
		"SK": &types.AttributeValueMemberS{Value: "COUNTER"},
	}
	update := func() *dynamodb.UpdateItemInput {
		return &dynamodb.UpdateItemInput{
			TableName: aws.String(p.table), Key: scratch,
			UpdateExpression:          aws.String("ADD #n :one"),
			ExpressionAttributeNames:  map[string]string{"#n": "n"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		}
	}
	storetest.BenchmarkModelCall(b, open,
		storetest.Baseline{Name: "one UpdateItem", Write: func(ctx context.Context) error {
			_, err := p.client.UpdateItem(ctx, update())
			return err
		}},
		storetest.Baseline{Name: "1-item transaction", Write: func(ctx context.Context) error {
			u := update()
			_, err := p.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{Update: &types.Update{
				TableName: u.TableName, Key: u.Key, UpdateExpression: u.UpdateExpression,
				ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
			}}}})
			return err
		}},
	)
}
