package image

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Budget bounds what applying an image's layers may cost, across every layer
// applied with it: the uncompressed bytes read from the layers, and the bytes
// written for their files. Neither bound alone stops both a decompression
// bomb (a small stream of zeros, no big file) and a sparse file (a header
// promising a terabyte, no data).
type Budget struct {
	read, wrote counter
}

// NewBudget returns a Budget of maxBytes read and maxBytes written.
func NewBudget(maxBytes int64) *Budget {
	return &Budget{
		read:  counter{max: maxBytes, what: "the image's layers unpack to"},
		wrote: counter{max: maxBytes, what: "the image's files take"},
	}
}

// counter counts bytes against a limit.
type counter struct {
	max, used int64
	what      string
}

func (c *counter) take(n int64) error {
	c.used += n
	if c.used > c.max {
		return fmt.Errorf("%s more than %d bytes, the limit", c.what, c.max)
	}
	return nil
}

// countingReader stops a layer at the read budget and when ctx is done, so
// that no layer, however it decompresses, runs unbounded.
type countingReader struct {
	ctx context.Context
	b   *Budget
	r   io.Reader
}

func (c countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if berr := c.b.read.take(int64(n)); berr != nil {
		return n, berr
	}
	return n, err
}

// readAhead reads r in a goroutine, up to a few chunks ahead of its reader:
// decompressing and hashing a layer then overlap with writing its files, as
// with tar -z's separate gzip. Reading r stops at its first error, which
// Read returns once the chunks before it are read.
type readAhead struct {
	full, free   chan []byte
	done, exited chan struct{}
	err          error // set before full is closed
	cur, back    []byte
}

func newReadAhead(r io.Reader, chunks, size int) *readAhead {
	ra := &readAhead{
		full:   make(chan []byte, chunks),
		free:   make(chan []byte, chunks),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	for range chunks {
		ra.free <- make([]byte, size)
	}
	go ra.run(r)
	return ra
}

func (ra *readAhead) run(r io.Reader) {
	defer close(ra.exited)
	defer close(ra.full)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			// There are as many slots as buffers: this never waits.
			ra.full <- buf[:n]
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.back != nil {
			ra.free <- ra.back[:cap(ra.back)]
			ra.back = nil
		}
		b, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.cur, ra.back = b, b
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// stop ends the goroutine and waits for it, so that what it reads can be
// closed.
func (ra *readAhead) stop() {
	close(ra.done)
	<-ra.exited
}
