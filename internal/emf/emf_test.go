package emf_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/emf"
)

// A line is what CloudWatch's embedded metric format specification asks
// for: the metric's value at top level, its dimensions' values at top
// level, and _aws naming the namespace, the dimension set and the metric.
func TestCountWritesEmbeddedMetricFormat(t *testing.T) {
	var buf bytes.Buffer
	at := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	rec := emf.New(&buf, "modelproxy", func() time.Time { return at })
	rec.Count(emf.ModelCalls, 1, "Outcome", "ok")
	rec.Count(emf.BudgetRefusals, 2, "", "")

	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	type metricDef struct{ Name, Unit string }
	var first struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []metricDef
			}
		} `json:"_aws"`
		Function   string
		Outcome    string
		ModelCalls int
	}
	if err := json.Unmarshal(lines[0], &first); err != nil {
		t.Fatal(err)
	}
	cw := first.AWS.CloudWatchMetrics
	if first.AWS.Timestamp != at.UnixMilli() || len(cw) != 1 || cw[0].Namespace != emf.Namespace ||
		len(cw[0].Dimensions) != 1 || len(cw[0].Dimensions[0]) != 2 || cw[0].Dimensions[0][1] != "Outcome" ||
		len(cw[0].Metrics) != 1 || cw[0].Metrics[0] != (metricDef{"ModelCalls", "Count"}) {
		t.Fatalf("first line %s", lines[0])
	}
	if first.Function != "modelproxy" || first.Outcome != "ok" || first.ModelCalls != 1 {
		t.Fatalf("first line's values %s", lines[0])
	}
	var second map[string]any
	if err := json.Unmarshal(lines[1], &second); err != nil || second["BudgetRefusals"] != 2.0 {
		t.Fatalf("second line %s, %v", lines[1], err)
	}
	if _, ok := second["Outcome"]; ok {
		t.Fatalf("a metric without a dimension carries one: %s", lines[1])
	}

	var none *emf.Recorder
	none.Count(emf.RunOutcomes, 1, "Status", "completed") // records nothing, does not panic
}
