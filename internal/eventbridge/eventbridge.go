// Package eventbridge is belay's adapter to Amazon EventBridge: it puts the
// normalized repository events (for the dispatcher) and the run status
// changes (for the publisher, and for users' own rules) on belay's bus, as
// events/ describes them.
package eventbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/belay-dev/belay/internal/belay"
)

// Bus puts belay's events on one event bus.
type Bus struct {
	client *awseb.Client
	name   string
}

// New returns the bus named name (a name or an ARN).
func New(client *awseb.Client, name string) *Bus { return &Bus{client: client, name: name} }

// PublishRepoEvent puts a normalized repository event (source belay.repo,
// detail-type "Repository Event").
func (b *Bus) PublishRepoEvent(ctx context.Context, ev belay.RepoEvent) error {
	return b.put(ctx, belay.RepoEventSource, belay.RepoEventDetailType, ev, ev.RunID)
}

// PublishRunStatus puts a run status change (source belay.runs,
// detail-type "Run Status Change").
func (b *Bus) PublishRunStatus(ctx context.Context, ev belay.RunStatusEvent) error {
	return b.put(ctx, belay.RunStatusSource, belay.RunStatusDetailType, ev, ev.RunID)
}

func (b *Bus) put(ctx context.Context, source, detailType string, detail any, runID string) error {
	d, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("eventbridge: encode %s: %w", detailType, err)
	}
	if len(d) > belay.MaxRepoEventBytes {
		return fmt.Errorf("eventbridge: %s is %d bytes, over what the bus takes", detailType, len(d))
	}
	out, err := b.client.PutEvents(ctx, &awseb.PutEventsInput{Entries: []types.PutEventsRequestEntry{{
		EventBusName: aws.String(b.name),
		Source:       aws.String(source),
		DetailType:   aws.String(detailType),
		Detail:       aws.String(string(d)),
		Resources:    []string{},
	}}})
	if err != nil {
		return fmt.Errorf("eventbridge: put %s of run %s: %w", detailType, runID, err)
	}
	if out.FailedEntryCount > 0 {
		msg := "unknown"
		if len(out.Entries) > 0 && out.Entries[0].ErrorCode != nil {
			msg = aws.ToString(out.Entries[0].ErrorCode) + ": " + aws.ToString(out.Entries[0].ErrorMessage)
		}
		return errors.New("eventbridge: the bus refused " + detailType + " of run " + runID + ": " + msg)
	}
	return nil
}

// StatusNotifier returns the function belay.NotifyStore calls: each run
// state is put on the bus; a failure is passed to onErr (logged by the
// caller), never to the store's writer, whose write has happened.
func (b *Bus) StatusNotifier(onErr func(runID string, err error)) func(context.Context, belay.Run) {
	return func(ctx context.Context, run belay.Run) {
		if err := b.PublishRunStatus(context.WithoutCancel(ctx), belay.RunStatusEventOf(run)); err != nil && onErr != nil {
			onErr(run.ID, err)
		}
	}
}
