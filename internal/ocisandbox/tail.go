package ocisandbox

import (
	"bytes"
	"strings"
	"sync"
)

// maxTail is how much of a sandbox's output is kept: its end, which is
// where a crash explains itself.
const maxTail = 16 << 10

// maxLoggedLine caps the one output line a log record carries.
const maxLoggedLine = 300

// tailBuffer keeps the last bytes written to it. Its readers see the
// secrets (the claim code) blanked out, in case the sandbox printed one.
type tailBuffer struct {
	mu        sync.Mutex
	buf       []byte
	total     int64
	truncated bool
	secrets   []string
}

// Write keeps the end of p and what fits of the earlier output.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - maxTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	return len(p), nil
}

// Total is how many bytes were written in all.
func (t *tailBuffer) Total() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Tail is the kept end, from a line boundary when the start was cut (so
// no secret is cut in half and escapes the blanking), with the secrets
// replaced by "[redacted]".
func (t *tailBuffer) Tail() string {
	t.mu.Lock()
	b := bytes.Clone(t.buf)
	truncated := t.truncated
	secrets := t.secrets
	t.mu.Unlock()
	if truncated {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		} else {
			b = nil
		}
	}
	s := string(b)
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}

// LastLine is the last non-empty line of Tail, at most max bytes (its end).
func (t *tailBuffer) LastLine(max int) string {
	lines := strings.Split(strings.TrimRight(t.Tail(), "\n\r\t "), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(last) > max {
		last = "…" + strings.ToValidUTF8(last[len(last)-max:], "")
	}
	return last
}
