package events_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/belay-dev/belay/events"
	"github.com/belay-dev/belay/internal/belay"
)

// envelope is an EventBridge event with its detail kept raw.
type envelope struct {
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Detail     json.RawMessage `json:"detail"`
}

func samples(t *testing.T) map[string][]byte {
	t.Helper()
	s, err := events.Samples()
	if err != nil {
		t.Fatal(err)
	}
	if len(s) < 8 {
		t.Fatalf("found %d samples, want at least 8", len(s))
	}
	return s
}

// TestSamplesValidate: every sample is an instance of its schema.
func TestSamplesValidate(t *testing.T) {
	for name, b := range samples(t) {
		schema, ok := events.SchemaOf(name)
		if !ok {
			t.Errorf("sample %s names no schema (repo-event-* or run-status-*)", name)
			continue
		}
		if err := events.Validate(schema, b); err != nil {
			t.Errorf("%s does not validate against %s: %v", name, schema, err)
		}
	}
}

// TestRoundTrip: each sample's detail decodes into belay's Go type, which
// encodes back to the same JSON, and the envelope names the source and
// detail-type the rules match on.
func TestRoundTrip(t *testing.T) {
	for name, b := range samples(t) {
		var env envelope
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var back []byte
		var err error
		switch schema, _ := events.SchemaOf(name); schema {
		case events.RepoEventSchema:
			if env.Source != belay.RepoEventSource || env.DetailType != belay.RepoEventDetailType {
				t.Errorf("%s: source %q, detail-type %q; want %q, %q", name, env.Source, env.DetailType, belay.RepoEventSource, belay.RepoEventDetailType)
			}
			ev, perr := belay.ParseRepoEvent(env.Detail)
			if perr != nil {
				t.Errorf("%s: ParseRepoEvent: %v", name, perr)
				continue
			}
			back, err = json.Marshal(ev)
		case events.RunStatusSchema:
			if env.Source != belay.RunStatusSource || env.DetailType != belay.RunStatusDetailType {
				t.Errorf("%s: source %q, detail-type %q; want %q, %q", name, env.Source, env.DetailType, belay.RunStatusSource, belay.RunStatusDetailType)
			}
			ev, perr := belay.ParseRunStatusEvent(env.Detail)
			if perr != nil {
				t.Errorf("%s: ParseRunStatusEvent: %v", name, perr)
				continue
			}
			back, err = json.Marshal(ev)
		}
		if err != nil {
			t.Fatalf("%s: marshal: %v", name, err)
		}
		if !sameJSON(t, env.Detail, back) {
			t.Errorf("%s: detail does not survive a round trip through Go:\n got %s\nwant %s", name, back, env.Detail)
		}
	}
}

// TestGoValuesValidate: what the Go code builds (not only the samples)
// is an instance of the schema.
func TestGoValuesValidate(t *testing.T) {
	exit := 0
	run := belay.Run{ID: "run_abc", Status: belay.StatusCompleted, ExitCode: &exit, ChangedFiles: []string{"calc.py"}}
	run.Request.Trigger = &belay.Trigger{Provider: "github", Event: "issues", Action: "labeled", Delivery: "d", Repository: "o/r", Actor: "octocat",
		Outputs: belay.TriggerOutputs{Branch: true}}
	// The Go decoder refuses a status event without its time.
	zero, err := json.Marshal(belay.RunStatusEventOf(run))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := belay.ParseRunStatusEvent(zero); !belay.IsCode(err, belay.CodeInvalid) {
		t.Errorf("a status event with the zero time: %v, want invalid", err)
	}
	run.UpdatedAt = run.UpdatedAt.AddDate(2030, 0, 0)
	run.FinishedAt = run.UpdatedAt
	detail, _ := json.Marshal(belay.RunStatusEventOf(run))
	if err := events.Validate(events.RunStatusSchema, wrap(t, belay.RunStatusSource, belay.RunStatusDetailType, detail)); err != nil {
		t.Errorf("RunStatusEventOf(run) does not validate: %v\n%s", err, detail)
	}
}

func wrap(t *testing.T, source, detailType string, detail []byte) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"version": "0", "id": "id-1", "detail-type": detailType, "source": source, "account": "123456789012",
		"time": "2026-11-20T09:15:02Z", "region": "eu-west-1", "resources": []string{}, "detail": json.RawMessage(detail),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMalformed: a sample changed in one place is refused by the schema,
// and (for the detail) by the Go decoder the dispatcher and publisher use.
func TestMalformed(t *testing.T) {
	s := samples(t)
	cases := []struct {
		sample string
		name   string
		edit   func(env, detail map[string]any)
		goToo  bool // the Go decoder refuses it too (it sees only the detail)
	}{
		{"repo-event-issue-comment.json", "no delivery", func(_, d map[string]any) { delete(d, "delivery") }, true},
		{"repo-event-issue-comment.json", "unknown provider", func(_, d map[string]any) { d["provider"] = "gitlab" }, true},
		{"repo-event-issue-comment.json", "unknown event", func(_, d map[string]any) { d["event"] = "release" }, true},
		{"repo-event-issue-comment.json", "unknown field", func(_, d map[string]any) { d["installation"] = 1 }, true},
		{"repo-event-issue-comment.json", "comment without its issue", func(_, d map[string]any) { delete(d, "issue") }, true},
		{"repo-event-issue-comment.json", "run id with a slash", func(_, d map[string]any) { d["runId"] = "run/../x" }, true},
		{"repo-event-issue-comment.json", "comment body a number", func(_, d map[string]any) { d["comment"].(map[string]any)["body"] = 7 }, true},
		{"repo-event-issue-comment.json", "not a time", func(_, d map[string]any) { d["receivedAt"] = "yesterday" }, true},
		{"repo-event-issue-comment.json", "wrong version", func(_, d map[string]any) { d["version"] = "2" }, true},
		{"repo-event-push.json", "short commit", func(_, d map[string]any) { d["commit"] = "6113728" }, true},
		{"repo-event-push.json", "push without ref", func(_, d map[string]any) { delete(d, "ref") }, true},
		{"repo-event-pull-request.json", "head sha upper case", func(_, d map[string]any) {
			d["pullRequest"].(map[string]any)["headSha"] = strings.ToUpper("ec26c3e57ca3a959ca5aad62de7213c562f8c821")
		}, true},
		{"repo-event-push.json", "wrong detail-type", func(e, _ map[string]any) { e["detail-type"] = "Run Status Change" }, false},
		{"run-status-completed.json", "unknown status", func(_, d map[string]any) { d["status"] = "done" }, true},
		{"run-status-completed.json", "no time", func(_, d map[string]any) { delete(d, "time") }, true},
		{"run-status-completed.json", "exit code a string", func(_, d map[string]any) { d["exitCode"] = "0" }, true},
		{"run-status-completed.json", "trigger without outputs", func(_, d map[string]any) { delete(d["trigger"].(map[string]any), "outputs") }, false},
		{"run-status-completed.json", "trigger without actor", func(_, d map[string]any) { delete(d["trigger"].(map[string]any), "actor") }, true},
		{"run-status-completed.json", "unknown field", func(_, d map[string]any) { d["cost"] = 3 }, true},
		{"run-status-queued.json", "wrong source", func(e, _ map[string]any) { e["source"] = "belay.repo" }, false},
	}
	for _, c := range cases {
		t.Run(c.sample+"/"+c.name, func(t *testing.T) {
			var env map[string]any
			if err := json.Unmarshal(s[c.sample], &env); err != nil {
				t.Fatal(err)
			}
			detail := env["detail"].(map[string]any)
			c.edit(env, detail)
			doc, _ := json.Marshal(env)
			schema, _ := events.SchemaOf(c.sample)
			if err := events.Validate(schema, doc); err == nil {
				t.Errorf("the schema accepted it")
			}
			if !c.goToo {
				return
			}
			d, _ := json.Marshal(detail)
			var err error
			if schema == events.RepoEventSchema {
				_, err = belay.ParseRepoEvent(d)
			} else {
				_, err = belay.ParseRunStatusEvent(d)
			}
			if !belay.IsCode(err, belay.CodeInvalid) {
				t.Errorf("the Go decoder answered %v, want invalid", err)
			}
		})
	}
	// And a document that is not JSON at all.
	if err := events.Validate(events.RepoEventSchema, []byte(`{"detail": `)); err == nil {
		t.Errorf("truncated JSON validated")
	}
	if _, err := belay.ParseRepoEvent([]byte(`{"version":"1"} {}`)); !belay.IsCode(err, belay.CodeInvalid) {
		t.Errorf("trailing data: %v, want invalid", err)
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}
