// Package outputtail keeps the end of a sandbox process's output, with the
// run's secrets blanked out, for both local launchers (the process one and
// the runc one): where a crash explains itself, shown in the run's reason
// and the log, never a token.
package outputtail

import (
	"bytes"
	"strings"
	"sync"
)

// Max is how much of a sandbox's output is kept: its end.
const Max = 16 << 10

// MaxLoggedLine caps the one output line a log record carries.
const MaxLoggedLine = 300

// Buffer keeps the last bytes written to it and counts the rest. Its
// readers see the secrets (run tokens, a claim code) blanked out, in case
// the sandbox printed one.
type Buffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	total     int64
	truncated bool
	secrets   []string
}

// New returns a Buffer keeping the last max bytes, blanking secrets.
func New(max int, secrets ...string) *Buffer {
	return &Buffer{max: max, secrets: secrets}
}

// Write keeps the end of p and what fits of the earlier output.
func (t *Buffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	return len(p), nil
}

// Total is how many bytes were written in all.
func (t *Buffer) Total() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Tail is the kept end, starting at a line boundary when the start was cut
// (so no secret is cut in half and escapes the blanking), with the secrets
// replaced by "[redacted]".
func (t *Buffer) Tail() string {
	t.mu.Lock()
	b := bytes.Clone(t.buf)
	truncated := t.truncated
	t.mu.Unlock()
	if truncated {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		} else {
			b = nil
		}
	}
	s := string(b)
	for _, sec := range t.secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}

// LastLine is the last non-empty line of Tail, at most max bytes (its end).
func (t *Buffer) LastLine(max int) string {
	lines := strings.Split(strings.TrimRight(t.Tail(), "\n\r\t "), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(last) > max {
		last = "…" + strings.ToValidUTF8(last[len(last)-max:], "")
	}
	return last
}
