package sandbox

import (
	"encoding/json"
	"io"
	"time"
	"unicode/utf8"
)

// writeTranscriptLine appends one JSON line to the transcript; v gets a
// time field when it is a map without one.
func writeTranscriptLine(w io.Writer, now func() time.Time, v any) {
	if m, ok := v.(map[string]any); ok {
		if _, has := m["time"]; !has {
			m["time"] = now().UTC().Format(time.RFC3339Nano)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = w.Write(append(b, '\n'))
}

// truncateBytes cuts s to at most n bytes on a rune boundary.
func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
