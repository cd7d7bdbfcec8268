package dynamo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/belay-dev/belay/internal/belay"
)

// checkpointCondition admits pointing a run at a checkpoint: the run
// exists, is running at the checkpoint's attempt, and points at no
// checkpoint or an older one. checkpointSeq is kept beside the JSON of the
// ref for this comparison.
const checkpointCondition = "attribute_exists(#PK) AND #status = :running AND #attempt = :attempt AND " +
	"(attribute_not_exists(#checkpointSeq) OR #checkpointSeq < :seq)"

// RecordCheckpoint points the run at c with one conditional update of
// META, which leaves lastSeq alone (no event writer has to retry), and
// returns the checkpoint META held before (the update's old values). A
// failed condition is classified from the item it returns. Returns invalid
// for a bad ref; not_found if the run does not exist; conflict if it is
// not running, at another attempt, or points at a newer checkpoint.
func (s *Store) RecordCheckpoint(ctx context.Context, runID string, c belay.CheckpointRef) (belay.CheckpointRef, error) {
	if err := belay.CheckCheckpointRef(c); err != nil {
		return belay.CheckpointRef{}, err
	}
	c.At = c.At.UTC()
	ref, err := json.Marshal(c)
	if err != nil {
		return belay.CheckpointRef{}, fmt.Errorf("record checkpoint of run %s: %w", runID, err)
	}
	out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(runPK(runID), skMeta),
		UpdateExpression:         aws.String("SET #checkpoint = :ref, #checkpointSeq = :seq"),
		ConditionExpression:      aws.String(checkpointCondition),
		ExpressionAttributeNames: exprNames("#checkpoint", checkpointCondition),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":ref": avS(string(ref)), ":seq": avN(c.Seq),
			":running": avS(string(belay.StatusRunning)), ":attempt": avN(int64(c.Attempt)),
		},
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var failed *types.ConditionalCheckFailedException
	if errors.As(err, &failed) {
		m, err := decodeMeta(failed.Item)
		switch {
		case err != nil:
			return belay.CheckpointRef{}, err
		case m == nil:
			return belay.CheckpointRef{}, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		case m.run.Checkpoint != nil && m.run.Checkpoint.Seq == c.Seq && m.run.Checkpoint.Attempt == c.Attempt:
			// A repeat of the write that set it.
			return belay.CheckpointRef{}, nil
		}
		if err := belay.CheckpointAllowed(m.run, c); err != nil {
			return belay.CheckpointRef{}, err
		}
		return belay.CheckpointRef{}, fmt.Errorf("record checkpoint of run %s: condition failed on a run that allows it", runID)
	}
	if err != nil {
		return belay.CheckpointRef{}, fmt.Errorf("record checkpoint of run %s: %w", runID, err)
	}
	old, err := decodeMeta(out.Attributes)
	if err != nil || old == nil || old.run.Checkpoint == nil {
		return belay.CheckpointRef{}, err
	}
	return *old.run.Checkpoint, nil
}

// ResumeRun moves the running run from attempt rs.From to the next and
// appends rs.Events, in one transaction conditioned on the run's status,
// attempt, cancel flag and lastSeq (see writeRun). Returns invalid for a
// malformed resume; not_found if the run does not exist; conflict if it is
// not running, its cancel was requested, or it is at another attempt.
func (s *Store) ResumeRun(ctx context.Context, runID string, rs belay.Resume) (belay.Run, error) {
	if err := belay.CheckResume(rs); err != nil {
		return belay.Run{}, err
	}
	at := rs.At.UTC()
	rs.At = at
	events := make([]belay.EventInput, len(rs.Events))
	for i, e := range rs.Events {
		if e.Time.IsZero() {
			e.Time = at
		}
		events[i] = e
	}
	_, err := s.writeRun(ctx, runID, func(cur *runMeta) (*runChange, error) {
		if cur == nil {
			return nil, belay.Errorf(belay.CodeNotFound, "run %s not found", runID)
		}
		next := cur.run
		next.LostAttempts = append([]belay.LostAttempt(nil), cur.run.LostAttempts...)
		if err := belay.ApplyResume(&next, rs); err != nil {
			return nil, err
		}
		lost, err := json.Marshal(next.LostAttempts)
		if err != nil {
			return nil, fmt.Errorf("resume run %s: %w", runID, err)
		}
		return &runChange{
			set:  []string{"#attempt = :next", "#lostAttempts = :lost", "#sandboxRef = :noRef", "#updatedAt = :at"},
			cond: "#status = :running AND #attempt = :from AND #cancelRequested = :false",
			values: map[string]types.AttributeValue{
				":next":    avN(int64(next.Attempt)),
				":lost":    avS(string(lost)),
				":noRef":   avS(""),
				":at":      avTime(at),
				":running": avS(string(belay.StatusRunning)),
				":from":    avN(int64(rs.From)),
				":false":   avBool(false),
			},
			events: events,
		}, nil
	})
	if err != nil {
		return belay.Run{}, err
	}
	return s.GetRun(ctx, runID)
}
