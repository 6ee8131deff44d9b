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
