package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"unicode/utf8"
)

// line is one transcript line. Role is system, user, assistant or tool for
// the conversation, error for a failed model call, note for a remark of the
// loop's own, and outcome for the last line.
type line struct {
	Role       string         `json:"role"`
	Step       int            `json:"step,omitempty"`
	Content    string         `json:"content,omitempty"`
	ToolCalls  []lineToolCall `json:"toolCalls,omitempty"`
	ToolCallID string         `json:"toolCallId,omitempty"`
	Name       string         `json:"name,omitempty"`
	IsError    bool           `json:"isError,omitempty"`
	Usage      *lineUsage     `json:"usage,omitempty"`
	Outcome    *Outcome       `json:"outcome,omitempty"`
}

type lineToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type lineUsage struct {
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// transcript writes JSON lines to w, up to MaxTranscriptBytes. A write error
// is logged once and ends the transcript, not the run: the patch matters
// more than the record of how it was made.
type transcript struct {
	w       io.Writer
	redact  func(string) string
	log     *slog.Logger
	written int
	stopped bool
}

func newTranscript(w io.Writer, redact func(string) string, log *slog.Logger) *transcript {
	if w == nil {
		w = io.Discard
	}
	return &transcript{w: w, redact: redact, log: log}
}

// outcomeReserve keeps room for the last line after the cap is reached.
const outcomeReserve = 16 << 10

func (t *transcript) write(ln line) {
	if t.stopped {
		return
	}
	b, err := encodeLine(ln)
	if err != nil {
		t.log.Error("transcript line not encodable", "role", ln.Role, "err", err)
		return
	}
	b = []byte(t.redact(string(b)))
	limit := MaxTranscriptBytes - outcomeReserve
	if ln.Role == "outcome" {
		limit = MaxTranscriptBytes
	}
	if t.written+len(b) > limit {
		if ln.Role != "outcome" {
			note, _ := encodeLine(line{Role: "note", Content: fmt.Sprintf(
				"transcript truncated: the next line (%s, %d bytes) and the rest of the conversation are left out", ln.Role, len(b))})
			t.emit(note)
			t.stopped = true
			t.log.Warn("transcript cap reached; the rest of the conversation is left out", "cap_bytes", MaxTranscriptBytes)
		}
		return
	}
	t.emit(b)
}

func (t *transcript) emit(b []byte) {
	n, err := t.w.Write(b)
	t.written += n
	if err != nil {
		t.stopped = true
		t.log.Warn("transcript write failed; the transcript ends here", "err", err)
	}
}

func encodeLine(ln line) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the transcript is read by people: keep <, > and & as they are
	if err := enc.Encode(ln); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// The event payloads. Text fields hold at most MaxEventTextBytes bytes; a
// *Truncated flag says when more was cut.
type (
	callEvent struct {
		Step               int    `json:"step"`
		CallID             string `json:"callId"`
		Name               string `json:"name"`
		Arguments          string `json:"arguments"`
		ArgumentsTruncated bool   `json:"argumentsTruncated,omitempty"`
	}
	resultEvent struct {
		Step            int    `json:"step"`
		CallID          string `json:"callId"`
		Name            string `json:"name"`
		IsError         bool   `json:"isError"`
		Interrupted     bool   `json:"interrupted,omitempty"`
		Result          string `json:"result"`
		ResultBytes     int    `json:"resultBytes"`
		ResultTruncated bool   `json:"resultTruncated,omitempty"`
	}
	messageEvent struct {
		Step      int    `json:"step"`
		Text      string `json:"text"`
		Truncated bool   `json:"truncated,omitempty"`
	}
)

// minRedactLen is the shortest token the loop scrubs from text: scrubbing a
// very short string would mangle ordinary content, and real run tokens are
// far longer.
const minRedactLen = 8

// redactor returns a function that replaces token in text. Nothing the loop
// writes should contain it; this is the second line of defence.
func redactor(token string) func(string) string {
	if len(token) < minRedactLen {
		return func(s string) string { return s }
	}
	return func(s string) string { return strings.ReplaceAll(s, token, "[redacted]") }
}

// truncate cuts s to at most n bytes on a rune boundary and reports whether
// it cut.
func truncate(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// capText cuts s to about n bytes and says so at the end, for text the
// model or a person reads.
func capText(s string, n int) string {
	short, cut := truncate(s, n)
	if !cut {
		return s
	}
	return short + fmt.Sprintf("\n[truncated: %d of %d bytes shown]", len(short), len(s))
}

// truncationNoteRoom is more than capText's note can take for any text a
// process can hold ("\n[truncated: N of M bytes shown]", N and M at most
// 19 digits).
const truncationNoteRoom = 72

// capSummary cuts a summary to MaxSummaryBytes, its truncation note
// included, so that the note survives the result bundle's cap.
func capSummary(s string) string {
	if len(s) <= MaxSummaryBytes {
		return s
	}
	return capText(s, MaxSummaryBytes-truncationNoteRoom)
}

// shortID bounds a model-chosen identifier (a tool name, a call id) for
// events and logs.
func shortID(s string) string {
	short, _ := truncate(s, 128)
	return short
}
