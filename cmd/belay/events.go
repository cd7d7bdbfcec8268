package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/belay-dev/belay/internal/belay"
	"github.com/belay-dev/belay/internal/httpapi"
	"github.com/belay-dev/belay/internal/wire"
)

const eventsDoc = `Prints a run's events, one readable line each, or as JSON lines with --json.
With --follow it keeps printing them live until the run ends, reconnecting
after a dropped connection without repeating or losing an event.`

// maxDataShown bounds the event data printed on a readable line.
const maxDataShown = 200

// cmdEvents runs `belay events ID [--follow] [--after N] [--json]`.
func cmdEvents(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "events", "ID [--follow] [--after N] [--json]", eventsDoc)
	follow := fs.Bool("follow", false, "keep printing events live until the run ends")
	after := fs.Int64("after", 0, "print only events after this `seq`")
	asJSON := fs.Bool("json", false, "print each event as a JSON line")
	pos, err := parseExact(fs, args, "ID")
	if err != nil {
		return err
	}
	if *after < 0 {
		return usagef("--after must not be negative")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	id := pos[0]
	show := func(ev belay.Event) error { return printEvent(e.stdout, id, ev, *asJSON) }
	if *follow {
		return followEvents(ctx, e, c, id, *after, show)
	}
	last := *after
	for {
		page, err := c.Events(ctx, id, last, 0)
		if err != nil {
			return err
		}
		if page.Missed {
			if err := show(missedEvent(page.OldestSeq)); err != nil {
				return err
			}
		}
		for _, ev := range page.Events {
			if err := show(ev); err != nil {
				return err
			}
			last = ev.Seq
		}
		if len(page.Events) == 0 || last >= page.LastSeq {
			return nil
		}
	}
}

// followEvents streams the run's events into show until its terminal
// event. When ctx ends first (Ctrl-C), it says how to pick up again.
func followEvents(ctx context.Context, e *env, c *httpapi.Client, id string, after int64, show func(belay.Event) error) error {
	last := after
	err := c.StreamEvents(ctx, id, after, func(ev belay.Event) error {
		if ev.Seq > 0 {
			last = ev.Seq
		}
		return show(ev)
	})
	if err != nil && ctx.Err() != nil {
		fmt.Fprintf(e.stderr, "belay: stopped following; the run goes on. Resume with: belay events %s --follow --after %d\n", id, last)
		return nil
	}
	return err
}

// missedEvent is the marker StreamEvents gives for events the server no
// longer keeps; the NDJSON page reports them in its fields instead.
func missedEvent(oldest int64) belay.Event {
	data, _ := json.Marshal(wire.EventsMissed{OldestSeq: oldest})
	return belay.Event{Type: wire.EventsMissedType, Data: data}
}

// printEvent writes one event: as the server's NDJSON line with asJSON,
// else as a readable line, with a hint under an approval request.
func printEvent(w io.Writer, runID string, ev belay.Event, asJSON bool) error {
	if ev.Type == wire.EventsMissedType {
		var m wire.EventsMissed
		_ = json.Unmarshal(ev.Data, &m)
		if asJSON {
			return writeJSONLine(w, wire.EventsMissedLine{Type: ev.Type, Data: m})
		}
		_, err := fmt.Fprintf(w, "  ... older events are no longer kept; the log continues at #%d\n", m.OldestSeq)
		return err
	}
	if asJSON {
		return writeJSONLine(w, ev)
	}
	// The sandbox's own account of its steps is marked: only the control
	// plane's events (unmarked) record what belay decided and validated.
	source := ""
	if ev.Source == belay.SourceSandbox {
		source = "sandbox"
	}
	_, err := fmt.Fprintf(w, "%5s %s  %-7s %-16s %s\n", "#"+strconv.FormatInt(ev.Seq, 10),
		ev.Time.Local().Format("15:04:05"), source, printableLine(ev.Type), clip(printableLine(summary(ev)), maxDataShown))
	if err != nil {
		return err
	}
	if ev.Type == belay.EventApprovalRequested {
		var a struct {
			ApprovalID string `json:"approvalId"`
		}
		if json.Unmarshal(ev.Data, &a) == nil && a.ApprovalID != "" {
			_, err = fmt.Fprintf(w, "%16s answer with: belay approve %s %s allow_once|allow_session|deny|cancel\n", "", runID, a.ApprovalID)
		}
	}
	return err
}

// eventData holds the fields of the event types a person follows most; each
// type uses a few of them.
type eventData struct {
	Reason          string          `json:"reason"`
	ExitCode        *int            `json:"exitCode"`
	MaxRequests     int             `json:"maxRequests"`
	WallTimeSeconds int             `json:"wallTimeSeconds"`
	Remaining       *int            `json:"remainingRequests"`
	FinishReason    string          `json:"finishReason"`
	ToolCalls       []string        `json:"toolCalls"`
	Step            int             `json:"step"`
	Name            string          `json:"name"`
	Arguments       json.RawMessage `json:"arguments"`
	IsError         bool            `json:"isError"`
	Result          string          `json:"result"`
	Argv            []string        `json:"argv"`
	DurationMs      int64           `json:"durationMs"`
	TimedOut        bool            `json:"timedOut"`
	Final           bool            `json:"final"`
	Text            string          `json:"text"`
	ApprovalID      string          `json:"approvalId"`
	Tool            string          `json:"tool"`
	Decision        string          `json:"decision"`
	DecidedBy       string          `json:"decidedBy"`
}

// summary says what an event means in a few words; for a type it does not
// know, or data it cannot read, it shows the data as compact JSON.
func summary(ev belay.Event) string {
	raw := compactJSON(ev.Data)
	var d eventData
	if raw == "" || json.Unmarshal(ev.Data, &d) != nil {
		return raw
	}
	switch ev.Type {
	case belay.EventRunStarted:
		if d.MaxRequests > 0 {
			return fmt.Sprintf("budget %d model calls, %d s wall time", d.MaxRequests, d.WallTimeSeconds)
		}
	case belay.EventModelRequest:
		if d.Remaining != nil {
			return fmt.Sprintf("%d model call(s) left after this one", *d.Remaining)
		}
	case belay.EventModelResponse:
		if len(d.ToolCalls) > 0 {
			return "asks for " + strings.Join(d.ToolCalls, ", ")
		}
		if d.FinishReason != "" {
			return "answers (" + d.FinishReason + ")"
		}
	case belay.EventToolCall:
		if d.Name != "" {
			return fmt.Sprintf("step %d: %s %s", d.Step, d.Name, argumentsText(d.Arguments))
		}
	case belay.EventToolResult:
		if d.Name != "" {
			verdict := "ok"
			if d.IsError {
				verdict = "error"
			}
			first, _, _ := strings.Cut(strings.TrimSpace(d.Result), "\n")
			return fmt.Sprintf("step %d: %s %s: %s", d.Step, d.Name, verdict, first)
		}
	case belay.EventCheckFinished:
		if len(d.Argv) > 0 && d.ExitCode != nil {
			verdict := "passed"
			switch {
			case d.TimedOut:
				verdict = "TIMED OUT"
			case *d.ExitCode != 0:
				verdict = fmt.Sprintf("FAILED (exit %d)", *d.ExitCode)
			}
			final := ""
			if d.Final {
				final = " (final)"
			}
			return fmt.Sprintf("%s: %s in %dms%s", strings.Join(d.Argv, " "), verdict, d.DurationMs, final)
		}
	case belay.EventAgentMessage:
		if d.Text != "" {
			return strings.ReplaceAll(d.Text, "\n", " ")
		}
	case belay.EventApprovalRequested:
		if d.Tool != "" {
			return fmt.Sprintf("%s %s (%s)", d.Tool, argumentsText(d.Arguments), d.ApprovalID)
		}
	case belay.EventApprovalDecided:
		if d.Decision != "" {
			s := fmt.Sprintf("%s by %s (%s)", d.Decision, d.DecidedBy, d.ApprovalID)
			if d.Reason != "" {
				s += ": " + d.Reason
			}
			return s
		}
	case belay.EventRunCompleted, belay.EventRunFailed, belay.EventRunCancelled:
		s := d.Reason
		if d.ExitCode != nil {
			s = strings.TrimSpace(fmt.Sprintf("%s (exit %d)", s, *d.ExitCode))
		}
		if s != "" {
			return s
		}
	}
	return raw
}

// argumentsText shows a tool call's arguments, which the sandbox reports as
// the model sent them: a JSON object, or a string holding one.
func argumentsText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return compactJSON(json.RawMessage(s))
	}
	return compactJSON(raw)
}

func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// compactJSON returns data on one line; "" for none.
func compactJSON(data json.RawMessage) string {
	if len(data) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return string(data)
	}
	if s := buf.String(); s != "{}" && s != "null" {
		return s
	}
	return ""
}

// printable makes text that comes from a run safe to print on a terminal.
// Much of it is the model's or the sandbox's (a tool's result, a check's
// output, a patch), and neither is trusted: a control character other than
// newline and tab could move the cursor, rewrite what is on the screen or
// set the clipboard, so each is shown escaped ("\x1b") instead, and bytes
// that are not UTF-8 as U+FFFD.
func printable(s string) string { return escapeControls(s, true) }

// printableLine is printable for text that must stay on one line: a
// newline is escaped too.
func printableLine(s string) string { return escapeControls(s, false) }

func escapeControls(s string, keepNewlines bool) string {
	unsafe := func(r rune) bool {
		return unicode.IsControl(r) && r != '\t' && (r != '\n' || !keepNewlines)
	}
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unsafe) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unsafe(r) {
			fmt.Fprintf(&b, `\x%02x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// clip shortens s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
