package outputtail

import "testing"

func TestBufferKeepsTheEndWithSecretsBlanked(t *testing.T) {
	b := New(32, "tok-SECRET")
	_, _ = b.Write([]byte("first line with tok-SECRET in it\n"))
	_, _ = b.Write([]byte("mid tok-SECR"))
	_, _ = b.Write([]byte("ET\nlast tok-SECRET line\n"))
	if b.Total() != 33+12+24 {
		t.Errorf("Total = %d, want %d", b.Total(), 33+12+24)
	}
	tail := b.Tail()
	// Cut at the first line boundary of the kept end, so the half-kept
	// secret of "mid" cannot escape the blanking.
	if tail != "last [redacted] line\n" {
		t.Errorf("Tail = %q", tail)
	}
	if got := b.LastLine(8); got != "…ed] line" {
		t.Errorf("LastLine(8) = %q", got)
	}
}

func TestBufferUncut(t *testing.T) {
	b := New(Max)
	_, _ = b.Write([]byte("one\ntwo\n"))
	if b.Tail() != "one\ntwo\n" || b.LastLine(MaxLoggedLine) != "two" {
		t.Errorf("Tail %q, LastLine %q", b.Tail(), b.LastLine(MaxLoggedLine))
	}
}
