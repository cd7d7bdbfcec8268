// Package emf writes metrics in CloudWatch's embedded metric format: one
// JSON object a line on the function's standard output, which CloudWatch
// Logs turns into metrics without an API call (and without the function
// needing cloudwatch:PutMetricData). See
// https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html.
//
// The metrics belay records (namespace "belay", dimension Function, and
// Outcome or Status where named):
//   - ModelCalls: model calls that spent budget, by Outcome (ok, upstream_error).
//   - BudgetRefusals: model calls refused because the run's budget was spent.
//   - ClaimRefusals: claim codes refused (unknown, used, expired, wrong run or attempt).
//   - RunOutcomes: runs finalized, by Status (completed, failed, cancelled).
package emf

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of belay's metrics.
const Namespace = "belay"

// The metric names.
const (
	ModelCalls     = "ModelCalls"
	BudgetRefusals = "BudgetRefusals"
	ClaimRefusals  = "ClaimRefusals"
	RunOutcomes    = "RunOutcomes"
)

// Recorder writes metrics for one function. It is safe for concurrent use;
// a nil *Recorder records nothing.
type Recorder struct {
	mu       sync.Mutex
	w        io.Writer
	function string
	now      func() time.Time
}

// New returns a Recorder writing to w (os.Stdout in Lambda) for the named
// function. A nil now means time.Now.
func New(w io.Writer, function string, now func() time.Time) *Recorder {
	if now == nil {
		now = time.Now
	}
	return &Recorder{w: w, function: function, now: now}
}

// Count records value of the named count metric, with an optional extra
// dimension (name and value; empty for none) besides Function.
func (r *Recorder) Count(metric string, value int, dimension, dimValue string) {
	if r == nil {
		return
	}
	dims := []string{"Function"}
	doc := map[string]any{
		"Function": r.function,
		metric:     value,
	}
	if dimension != "" {
		dims = append(dims, dimension)
		doc[dimension] = dimValue
	}
	doc["_aws"] = map[string]any{
		"Timestamp": r.now().UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace":  Namespace,
			"Dimensions": [][]string{dims},
			"Metrics":    []any{map[string]string{"Name": metric, "Unit": "Count"}},
		}},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	// One Write per line, so a log line written concurrently by slog
	// (on the same stream) cannot land inside it.
	_, _ = r.w.Write(b)
}
