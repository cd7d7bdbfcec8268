package sandbox

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// transcriptWriter is the run's transcript.jsonl: the agent and the tools
// both write whole JSON lines to it, so writes are serialised, and it is
// capped so that the artifact stays under belay.MaxArtifactBytes. Past the
// cap, one marker line says so and later lines are dropped; a write never
// fails the agent.
type transcriptWriter struct {
	mu      sync.Mutex
	w       io.Writer
	n, max  int64
	full    bool
	dropped int64
	now     func() time.Time
	err     error
}

// markerRoom is kept free under the cap for the truncation marker.
const markerRoom = 256

func newTranscriptWriter(w io.Writer, max int64, now func() time.Time) *transcriptWriter {
	return &transcriptWriter{w: w, max: max, now: now}
}

func (t *transcriptWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.full || t.err != nil {
		t.dropped += int64(len(p))
		return len(p), nil
	}
	if t.n+int64(len(p)) > t.max-markerRoom {
		t.full = true
		t.dropped += int64(len(p))
		line, _ := json.Marshal(map[string]any{
			"type": "transcript.truncated",
			"time": t.now().UTC().Format(time.RFC3339Nano),
			"note": "the transcript reached its size cap; later lines were dropped",
		})
		t.write(append(line, '\n'))
		return len(p), nil
	}
	t.write(p)
	return len(p), nil
}

func (t *transcriptWriter) write(p []byte) {
	n, err := t.w.Write(p)
	t.n += int64(n)
	if err != nil {
		t.err = err
	}
}

// loss reports what the transcript is missing: the bytes dropped past the
// cap or after a failed write, and that write's error.
func (t *transcriptWriter) loss() (dropped int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped, t.err
}

// snapshot returns a copy of what has been written to buf, the writer t
// writes to, taken under t's lock so no line is cut.
func (t *transcriptWriter) snapshot(buf *bytes.Buffer) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(buf.Bytes())
}
