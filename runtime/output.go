package runtime

import (
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"
)

// cappedBuffer keeps the first max bytes written to it and counts the rest.
// It never blocks and never fails, so a chatty program is never stalled or
// killed by its own output.
type cappedBuffer struct {
	mu    sync.Mutex
	max   int64
	buf   []byte
	total int64
}

func newCappedBuffer(max int64) *cappedBuffer {
	return &cappedBuffer{max: max}
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.max - int64(len(c.buf)); room > 0 {
		c.buf = append(c.buf, p[:min(int64(len(p)), room)]...)
	}
	return len(p), nil
}

// result returns the kept bytes, whether anything was dropped, and the total
// written.
func (c *cappedBuffer) result() ([]byte, bool, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf, c.total > int64(len(c.buf)), c.total
}

// streamBuffer is what the host keeps of one of the code's streams, as
// the init sends it: its head (the first half of the sandbox's cap, as it
// comes), and what came past the head, by its offset in the stream — the
// newest bytes of a watched call's reads, then, at its end, the tail the
// init kept, which takes their place. Each part is bounded: the init
// sends no more than the cap, and a frame no more than MaxFrame.
type streamBuffer struct {
	max     int
	head    []byte
	tail    []byte
	tailOff int64
	seen    int64 // the end of the furthest bytes it was sent
}

func newStreamBuffer(max int) *streamBuffer { return &streamBuffer{max: max} }

// writeHead keeps bytes of the head, which come in order.
func (b *streamBuffer) writeHead(p []byte) {
	if room := b.max - len(b.head); room > 0 {
		b.head = append(b.head, p[:min(len(p), room)]...)
	}
	b.seen = max(b.seen, int64(len(b.head)))
}

// writePast keeps bytes from offset off on, past the head: they replace
// what it kept from there on, or, apart from it, all it kept past the
// head.
func (b *streamBuffer) writePast(off int64, p []byte) {
	if off < int64(len(b.head)) || len(p) > b.max {
		return // not past the head, or more than the init keeps: not the init's
	}
	if end := b.tailOff + int64(len(b.tail)); len(b.tail) > 0 && off >= b.tailOff && off <= end {
		b.tail = append(b.tail[:off-b.tailOff], p...)
	} else {
		b.tail, b.tailOff = append(b.tail[:0], p...), off
	}
	if over := len(b.tail) - b.max; over > 0 {
		b.tail = append(b.tail[:0], b.tail[over:]...)
		b.tailOff += int64(over)
	}
	b.seen = max(b.seen, off+int64(len(p)))
}

// parts are the bytes kept: what is known from the start on (prefix),
// and what is known of the end apart from it (suffix, at suffixOff).
func (b *streamBuffer) parts() (prefix, suffix []byte, suffixOff int64) {
	if len(b.tail) > 0 && b.tailOff <= int64(len(b.head)) {
		return append(b.head[:b.tailOff:b.tailOff], b.tail...), nil, 0
	}
	return b.head, b.tail, b.tailOff
}

// bytes is everything kept, in order, for a diagnostic.
func (b *streamBuffer) bytes() []byte {
	prefix, suffix, _ := b.parts()
	return append(prefix[:len(prefix):len(prefix)], suffix...)
}

// result is the stream as a caller gets it, in at most limit bytes, given
// that total bytes were written (0: as many as it was sent): whole when
// it fits, else its first and last parts (half each) around a marker that
// says how many bytes were left out between them.
func (b *streamBuffer) result(limit, total int64) (out []byte, truncated bool) {
	prefix, suffix, suffixOff := b.parts()
	total = max(total, b.seen)
	if len(suffix) == 0 && int64(len(prefix)) == total && total <= limit {
		return prefix, false
	}
	// The end is known when the suffix reaches it, or the prefix is all.
	var end []byte
	switch {
	case len(suffix) > 0 && suffixOff+int64(len(suffix)) == total:
		end = suffix
	case len(suffix) == 0 && int64(len(prefix)) == total:
		end = prefix
	}
	budget := limit - int64(len(leftOutMarker(total)))
	if budget <= 0 {
		return cutHead(prefix, int(min(limit, int64(len(prefix))))), true
	}
	t := min(int64(len(end)), budget/2)
	h := min(int64(len(prefix)), budget-t)
	head, tail := cutHead(prefix, int(h)), cutTail(end, int(t))
	// The marker is a line of its own whatever the head ends with: its
	// bytes are never the stream's.
	m := leftOutMarker(total - int64(len(head)) - int64(len(tail)))
	out = make([]byte, 0, len(head)+len(m)+len(tail))
	return append(append(append(out, head...), m...), tail...), true
}

// leftOutMarker stands for the bytes of a stream left out between its
// head and its tail.
func leftOutMarker(n int64) string { return fmt.Sprintf("\n[… %d bytes left out …]\n", n) }

// cutHead is at most n bytes of the start of p, not ending inside a UTF-8
// character.
func cutHead(p []byte, n int) []byte {
	if n >= len(p) {
		return p
	}
	for i := n; i > 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			return p[:i]
		}
	}
	return p[:n]
}

// cutTail is at most n bytes of the end of p, not starting inside a UTF-8
// character.
func cutTail(p []byte, n int) []byte {
	if n >= len(p) {
		return p
	}
	start := len(p) - n
	for i := start; i < len(p) && i < start+utf8.UTFMax; i++ {
		if utf8.RuneStart(p[i]) {
			return p[i:]
		}
	}
	return p[start:]
}

// drain copies r into w until EOF or error and closes r. It reports on done.
// Through a buffer of its own, small: what it drains is an init's
// diagnostics, a line or two, and an *os.File's WriteTo would take a
// 32 KB buffer of its own for every sandbox.
func drain(r *os.File, w io.Writer, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	var buf [4 << 10]byte
	io.CopyBuffer(w, struct{ io.Reader }{r}, buf[:])
}

// Live keeps the newest output of a running call, for progress messages:
// the last liveBytes of whichever stream wrote last.
type Live struct {
	mu     sync.Mutex
	stderr bool
	tail   []byte
	seq    uint64
}

// liveBytes is how much of the newest output a Live keeps.
const liveBytes = 400

func (l *Live) write(stderr bool, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if stderr != l.stderr {
		l.stderr, l.tail = stderr, l.tail[:0]
	}
	if len(p) >= liveBytes {
		p = p[len(p)-liveBytes:]
	}
	if over := len(l.tail) + len(p) - liveBytes; over > 0 {
		l.tail = append(l.tail[:0], l.tail[over:]...)
	}
	l.tail = append(l.tail, p...)
	l.seq++
}

// Last returns the newest output: the stream's name ("stdout" or
// "stderr"), its last bytes, and how many writes came before, which only
// grows (0: none yet).
func (l *Live) Last() (stream string, tail []byte, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stream = "stdout"
	if l.stderr {
		stream = "stderr"
	}
	return stream, append([]byte(nil), l.tail...), l.seq
}
