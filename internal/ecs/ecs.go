// Package ecs is belay's adapter to Amazon ECS: it stops a run's Fargate
// task, for cancel and for the cleanup of executions that ended without
// their Catch handlers. (The state machine starts tasks itself, with
// Step Functions' runTask.sync integration.) The task's ARN is the one the
// sandbox entry reported from the ECS task metadata endpoint when it
// claimed its run.
package ecs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsecs "github.com/aws/aws-sdk-go-v2/service/ecs"
	"github.com/aws/aws-sdk-go-v2/service/ecs/types"
)

// maxReasonLen is the longest stop reason ECS keeps.
const maxReasonLen = 255

// Tasks stops tasks in one cluster. It is safe for concurrent use.
type Tasks struct {
	client  *awsecs.Client
	cluster string
}

// New returns Tasks for the cluster (name or ARN).
func New(client *awsecs.Client, cluster string) *Tasks {
	return &Tasks{client: client, cluster: cluster}
}

// StopTask stops the task with the given ARN, recording reason (cut to what
// ECS keeps). Stopping a task that has stopped already, or that ECS no
// longer knows, succeeds: cancel and cleanup may both try, in any order.
func (t *Tasks) StopTask(ctx context.Context, taskARN, reason string) error {
	if taskARN == "" {
		return errors.New("ecs: stop task: no task ARN")
	}
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	_, err := t.client.StopTask(ctx, &awsecs.StopTaskInput{
		Cluster: aws.String(t.cluster),
		Task:    aws.String(taskARN),
		Reason:  aws.String(reason),
	})
	if err == nil {
		return nil
	}
	var invalid *types.InvalidParameterException
	if errors.As(err, &invalid) && strings.Contains(strings.ToLower(invalid.ErrorMessage()), "not found") {
		return nil
	}
	return fmt.Errorf("ecs: stop task %s: %w", taskARN, err)
}
