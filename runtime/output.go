package runtime

import (
	"io"
	"os"
	"sync"
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

// drain copies r into w until EOF or error and closes r. It reports on done.
func drain(r *os.File, w io.Writer, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	buf := make([]byte, 64<<10)
	io.CopyBuffer(w, r, buf)
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
