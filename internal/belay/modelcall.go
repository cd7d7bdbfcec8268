package belay

import (
	"context"
	"encoding/json"
	"time"
)

// ModelCall is what the control plane records about one proxied model call
// before forwarding it: its shape, never its prompt.
type ModelCall struct {
	Model     string
	Messages  int
	Tools     int
	MaxTokens int64
}

// modelRequestData is the data of a model.request event.
type modelRequestData struct {
	Model     string `json:"model"`
	Messages  int    `json:"messages"`
	Tools     int    `json:"tools"`
	MaxTokens int64  `json:"maxTokens"`
	Remaining int    `json:"remainingRequests"`
}

// ModelRequestEvent is the model.request event of a call that spent a
// request, with what the run's budget has left after it. The stores build
// it inside SpendModelRequest's write, where that number is known.
func ModelRequestEvent(at time.Time, call ModelCall, remaining int) EventInput {
	// Only strings and integers: Marshal cannot fail.
	data, _ := json.Marshal(modelRequestData{
		Model: call.Model, Messages: call.Messages, Tools: call.Tools, MaxTokens: call.MaxTokens, Remaining: remaining,
	})
	return EventInput{Time: at, Type: EventModelRequest, Data: data}
}

// ModelCallStore records a proxied model call in two atomic writes instead
// of four: before the upstream call, the spend and its model.request
// event; after it, the usage and its model.response event. Both keep the
// guarantees of the writes they fold: a budget of n admits exactly n
// spends, sequence numbers stay gapless, events leave the bounded buffer as
// AppendEvents would push them out, and a write that fails leaves nothing.
type ModelCallStore interface {
	// SpendModelRequest spends one request of the run's capability for
	// call.Model at time now, exactly as ConsumeModelRequest does, and when
	// the outcome is ok appends the call's model.request event
	// (ModelRequestEvent at now, with Remaining) in the same atomic write.
	// A run that has ended, or does not exist, is inactive: nothing is spent
	// and nothing appended. Only ok spends or appends.
	SpendModelRequest(ctx context.Context, runID string, call ModelCall, now time.Time) (ConsumeResult, error)

	// RecordModelResponse adds d to the run's usage and appends response
	// (the call's model.response event) in one atomic write. The request was
	// paid for, so the usage is added even when the run has ended; the
	// event is then left out, since the log has ended, and appended is
	// false. Returns invalid for an event CheckEvents refuses (adding
	// nothing); not_found if the run does not exist.
	RecordModelResponse(ctx context.Context, runID string, d UsageDelta, response EventInput) (appended bool, err error)
}
