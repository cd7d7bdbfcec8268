package dynamo

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// CreateApproval puts the APPR# item (conditioned on being absent) and
// appends approval.requested, and approval.decided for an approval decided
// by policy, in one transaction with the META update. Returns invalid for an
// approval belay.CheckApproval refuses; not_found if the run does not exist;
// conflict if it is terminal or the approval exists.
func (s *Store) CreateApproval(ctx context.Context, a belay.Approval) (belay.Approval, error) {
	if err := belay.CheckApproval(a); err != nil {
		return belay.Approval{}, err
	}
	a.RequestedAt = utc(a.RequestedAt)
	a.ExpiresAt = utc(a.ExpiresAt)
	a.DecidedAt = utc(a.DecidedAt)
	requested, err := belay.ApprovalRequestedEvent(a)
	if err != nil {
		return belay.Approval{}, fmt.Errorf("create approval %s of run %s: %w", a.ID, a.RunID, err)
	}
	events := []belay.EventInput{requested}
	if a.Status == belay.ApprovalDecided {
		events = append(events, belay.ApprovalDecidedEvent(a))
	}
	_, err = s.writeRun(ctx, a.RunID, func(cur *runMeta) (*runChange, error) {
		switch {
		case cur == nil:
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", a.RunID)
		case cur.terminal():
			return nil, belay.Errorf(belay.CodeConflict, "run %s is %s", a.RunID, cur.run.Status)
		}
		return &runChange{
			cond:   "NOT #status IN (:completed, :failed, :cancelled)",
			values: terminalValues(),
			events: events,
			extra: []types.TransactWriteItem{{Put: &types.Put{
				TableName:                           s.table,
				Item:                                approvalItem(a, cur.run.LastSeq+1, cur.ttl),
				ConditionExpression:                 aws.String("attribute_not_exists(#PK)"),
				ExpressionAttributeNames:            exprNames("#PK"),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureNone,
			}}},
			extraFailed: func(int, item) error {
				return belay.Errorf(belay.CodeConflict, "approval %s already exists", a.ID)
			},
		}, nil
	})
	if err != nil {
		return belay.Approval{}, err
	}
	return a, nil
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// GetApproval reads one approval, strongly consistent: an agent polling for
// its decision must see it as soon as it is recorded. Returns not_found if it
// does not exist.
func (s *Store) GetApproval(ctx context.Context, runID, id string) (belay.Approval, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            keyOf(runPK(runID), approvalSK(id)),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return belay.Approval{}, fmt.Errorf("get approval %s of run %s: %w", id, runID, err)
	}
	if out.Item == nil {
		return belay.Approval{}, belay.Errorf(belay.CodeNotFound, "approval %s not found", id)
	}
	return decodeApproval(out.Item)
}

// ListApprovals reads the run's APPR# items and orders them by request time,
// then by the order they were stored. Returns not_found if the run does not
// exist.
func (s *Store) ListApprovals(ctx context.Context, runID string) ([]belay.Approval, error) {
	in := &dynamodb.QueryInput{
		TableName:                s.table,
		KeyConditionExpression:   aws.String("#PK = :pk AND begins_with(#SK, :appr)"),
		ExpressionAttributeNames: exprNames("#PK #SK"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk":   avS(runPK(runID)),
			":appr": avS(prefixAppr),
		},
		ConsistentRead: aws.Bool(true),
	}
	approvals := []belay.Approval{}
	position := map[string]int64{}
	for p := dynamodb.NewQueryPaginator(s.client, in); p.HasMorePages(); {
		out, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list approvals of run %s: %w", runID, err)
		}
		for _, it := range out.Items {
			a, err := decodeApproval(it)
			if err != nil {
				return nil, fmt.Errorf("run %s: %w", runID, err)
			}
			approvals = append(approvals, a)
			position[a.ID] = (&decoder{it: it}).num("position")
		}
	}
	if len(approvals) == 0 {
		m, err := s.readMeta(ctx, runID)
		if err != nil {
			return nil, err
		}
		if m == nil {
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		}
	}
	slices.SortStableFunc(approvals, func(x, y belay.Approval) int {
		return cmp.Or(x.RequestedAt.Compare(y.RequestedAt), cmp.Compare(position[x.ID], position[y.ID]), strings.Compare(x.ID, y.ID))
	})
	return approvals, nil
}

// DecideApproval records a decision with one transaction: the APPR# update
// conditioned on it still being pending, and approval.decided appended with
// the META update. Returns not_found if the approval does not exist;
// conflict if it is already decided or its run has ended.
func (s *Store) DecideApproval(ctx context.Context, runID, id string, d belay.Decision, reason, by string, at time.Time) (belay.Approval, error) {
	if !d.Valid() {
		return belay.Approval{}, belay.FieldErrorf(belay.CodeInvalid, "decision", "unknown decision %q", d)
	}
	a, err := s.GetApproval(ctx, runID, id)
	if err != nil {
		return belay.Approval{}, err
	}
	if a.Status != belay.ApprovalPending {
		return belay.Approval{}, belay.Errorf(belay.CodeConflict, "approval %s is already decided", id)
	}
	a.Status, a.Decision, a.Reason, a.DecidedBy, a.DecidedAt = belay.ApprovalDecided, d, reason, by, at.UTC()

	set := "SET #status = :decided, #decision = :decision, #decidedAt = :at"
	values := map[string]types.AttributeValue{
		":decided":  avS(string(belay.ApprovalDecided)),
		":pending":  avS(string(belay.ApprovalPending)),
		":decision": avS(string(d)),
		":at":       avTime(at),
	}
	if reason != "" {
		set += ", #reason = :reason"
		values[":reason"] = avS(reason)
	}
	if by != "" {
		set += ", #decidedBy = :by"
		values[":by"] = avS(by)
	}
	const cond = "#status = :pending"
	update := types.TransactWriteItem{Update: &types.Update{
		TableName:                           s.table,
		Key:                                 keyOf(runPK(runID), approvalSK(id)),
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            exprNames(set, cond),
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
	_, err = s.writeRun(ctx, runID, func(cur *runMeta) (*runChange, error) {
		switch {
		case cur == nil:
			return nil, belay.Errorf(belay.CodeNotFound, "approval %s not found", id)
		case cur.terminal():
			return nil, belay.Errorf(belay.CodeConflict, "run %s is %s; its approvals are closed", runID, cur.run.Status)
		}
		return &runChange{
			cond:   "NOT #status IN (:completed, :failed, :cancelled)",
			values: terminalValues(),
			events: []belay.EventInput{belay.ApprovalDecidedEvent(a)},
			extra:  []types.TransactWriteItem{update},
			extraFailed: func(_ int, old item) error {
				if old == nil {
					return belay.Errorf(belay.CodeNotFound, "approval %s not found", id)
				}
				return belay.Errorf(belay.CodeConflict, "approval %s is already decided", id)
			},
		}, nil
	})
	if err != nil {
		return belay.Approval{}, err
	}
	return a, nil
}
