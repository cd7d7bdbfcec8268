package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/belay-dev/belay/internal/belay"
)

// TestPrintEventMarksTheSandboxsEvents: a person reading the log tells the
// sandbox's own account from what the control plane recorded.
func TestPrintEventMarksTheSandboxsEvents(t *testing.T) {
	at := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	forged := belay.Event{Seq: 7, Time: at, Type: belay.EventCheckFinished, Source: belay.SourceSandbox,
		Data: json.RawMessage(`{"argv":["python3","-m","pytest","-q"],"exitCode":0,"durationMs":5}`)}
	real := belay.Event{Seq: 8, Time: at, Type: belay.EventCheckFinished, Source: belay.SourceControl,
		Data: json.RawMessage(`{"argv":["python3","-m","pytest","-q"],"exitCode":1,"durationMs":9,"final":true}`)}
	var out bytes.Buffer
	for _, ev := range []belay.Event{forged, real} {
		if err := printEvent(&out, "run_1", ev, false); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("printed %q", out.String())
	}
	if !strings.Contains(lines[0], " sandbox check.finished ") || !strings.Contains(lines[0], "passed") {
		t.Errorf("the sandbox's event is not marked: %q", lines[0])
	}
	if strings.Contains(lines[1], "sandbox") || !strings.Contains(lines[1], "FAILED (exit 1)") || !strings.Contains(lines[1], "(final)") {
		t.Errorf("the control plane's final check reads %q", lines[1])
	}
	out.Reset()
	if err := printEvent(&out, "run_1", forged, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"source":"sandbox"`) {
		t.Errorf("--json drops the source: %s", out.String())
	}
}
