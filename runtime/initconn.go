package runtime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The conversation with a sandbox's init, in the frames of
// runtime/initproto: what the host writes (the configuration, a call, a
// kill, a fork), and what it reads, as output kept within the caps and as
// events for the supervision (supervise.go) and the templates (fork.go).

// event is one frame from the init that the supervision waits for.
type event struct {
	kind     byte      // 0: the init's output ended
	at       time.Time // when it arrived: the supervision may see it later
	status   syscall.WaitStatus
	outTotal int64
	errTotal int64
	ran      time.Duration // exit: how long the code ran, by the init's clock
	flags    uint32        // exit: exitFlags
	msg      string
	out      *callOutput // idle: the session's call's output
	usage    *usage      // exit, in the process runtime: what the call's processes used
}

// usage is what the process runtime's init measured of a call's
// processes (IUsage): their CPU time, and the peak resident set of the
// largest of them.
type usage struct {
	cpu  time.Duration
	peak int64
}

// callOutput is what the init sent of one call besides its verdict.
type callOutput struct {
	stdout, stderr *streamBuffer
	files          []File
	skipped        bool
	leftOut        []LeftOut
	notes          []string
	value          []byte
}

func newCallOutput() callOutput {
	return callOutput{stdout: newStreamBuffer(initproto.MaxFrame), stderr: newStreamBuffer(initproto.MaxFrame)}
}

// initConn is the conversation with one sandbox's init (not an MCP
// session: docs/architecture.md says what each word means).
type initConn struct {
	to     *os.File // the init's stdin
	events chan event
	diag   *cappedBuffer // the init's stderr

	// mu guards the call's output, which the reader writes, and the
	// watcher of the call's output.
	mu   sync.Mutex
	out  callOutput
	live *Live

	// wmu orders the writers: each writes its frames whole, the
	// configuration first.
	wmu       sync.Mutex
	writeOnce sync.Once

	// relay is the sandbox's egress relay, on the server's side: its
	// frames come and go on the init's streams (relay.go).
	relay *relay
}

// newInitConn starts reading frames from the init's stdout and its stderr.
// The init sends no more of each of the code's streams than its cap (the
// bundle's); the runtime keeps at most the request's.
func newInitConn(to, from, diag *os.File) *initConn {
	s := &initConn{
		to:     to,
		events: make(chan event, 64),
		diag:   newCappedBuffer(64 << 10),
		out:    newCallOutput(),
	}
	s.relay = newRelay(to, &s.wmu)
	go drain(diag, s.diag, make(chan struct{}))
	go s.read(from)
	return s
}

// The buffers of the frames read from and written to inits, reused: a
// call's own were a fifth of what the server allocated for it, and so of
// the collector's work.
var (
	frameReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
	frameWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 64<<10) }}
)

// read turns frames into output, files and events until the init's stdout
// ends; then it sends a zero event and stops.
func (s *initConn) read(from *os.File) {
	defer from.Close()
	defer func() { s.events <- event{at: time.Now()} }()
	defer s.relay.shutdown()
	r := frameReaders.Get().(*bufio.Reader)
	r.Reset(from)
	defer frameReaders.Put(r)
	var head [5]byte
	var used *usage // the call's IUsage, for its IExit
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[1:])
		if n > initproto.MaxFrame {
			s.events <- event{kind: initproto.IError, msg: fmt.Sprintf("the init sent a frame of %d bytes", n)}
			return
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		switch head[0] {
		case initproto.IStdout, initproto.IStderr:
			s.output(head[0], -1, payload)
		case initproto.ITail:
			if n >= 9 && (payload[0] == initproto.IStdout || payload[0] == initproto.IStderr) {
				s.output(payload[0], int64(binary.BigEndian.Uint64(payload[1:])), payload[9:])
			}
		case initproto.IOutFile, initproto.ISkipped:
			if err := s.file(head[0], payload); err != nil {
				s.events <- event{kind: initproto.IError, msg: err.Error()}
				return
			}
		case initproto.IResult:
			s.mu.Lock()
			s.out.value = payload
			s.mu.Unlock()
		case initproto.IIdle:
			out := s.take()
			s.events <- event{kind: initproto.IIdle, at: time.Now(), out: &out}
		case initproto.IExit:
			ev, err := exitEvent(payload, used)
			if err != nil {
				s.events <- event{kind: initproto.IError, msg: err.Error()}
				return
			}
			s.events <- ev
			used = nil
		case initproto.IUsage:
			if n == 16 {
				used = &usage{cpu: time.Duration(binary.BigEndian.Uint64(payload)), peak: int64(binary.BigEndian.Uint64(payload[8:]))}
			}
		case initproto.INote:
			s.mu.Lock()
			if len(s.out.notes) < 16 {
				s.out.notes = append(s.out.notes, string(payload[:min(len(payload), 1024)]))
			}
			s.mu.Unlock()
		case initproto.IError:
			s.events <- event{kind: initproto.IError, msg: string(payload)}
		case initproto.INet:
			s.relay.frame(payload)
		case initproto.IForked, initproto.IReaped:
			if n == 4 {
				s.events <- event{kind: head[0], at: time.Now(), status: syscall.WaitStatus(binary.BigEndian.Uint32(payload))}
			}
		default:
			s.events <- event{kind: head[0], at: time.Now()}
		}
	}
}

// file keeps an output file the init sent (IOutFile), or notes one it
// left out (ISkipped).
func (s *initConn) file(kind byte, payload []byte) error {
	if kind == initproto.ISkipped {
		lo, named := decodeLeftOut(payload)
		s.mu.Lock()
		s.out.skipped = true
		if named && len(s.out.leftOut) < initproto.MaxLeftOut {
			s.out.leftOut = append(s.out.leftOut, lo)
		}
		s.mu.Unlock()
		return nil
	}
	f, err := decodeFile(payload, true)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.out.files = append(s.out.files, f)
	s.mu.Unlock()
	return nil
}

// exitEvent is the event of an IExit frame, with the call's IUsage (nil:
// none came).
func exitEvent(payload []byte, used *usage) (event, error) {
	if len(payload) != initproto.ExitFrameLen {
		return event{}, fmt.Errorf("the init sent an exit frame of %d bytes, want %d", len(payload), initproto.ExitFrameLen)
	}
	return event{kind: initproto.IExit, at: time.Now(), status: syscall.WaitStatus(binary.BigEndian.Uint32(payload)),
		outTotal: int64(binary.BigEndian.Uint64(payload[4:])), errTotal: int64(binary.BigEndian.Uint64(payload[12:])),
		ran: time.Duration(binary.BigEndian.Uint64(payload[20:])), flags: binary.BigEndian.Uint32(payload[28:]), usage: used}, nil
}

// output keeps a chunk of the call's stdout or stderr — of its head
// (off < 0), or from off on past it — and shows it to whoever watches the
// call.
func (s *initConn) output(typ byte, off int64, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.out.stdout
	if typ == initproto.IStderr {
		b = s.out.stderr
	}
	if off < 0 {
		b.writeHead(p)
	} else {
		b.writePast(off, p)
	}
	if s.live != nil {
		s.live.write(typ == initproto.IStderr, p)
	}
}

// take returns the output of the call so far and starts the next one's.
func (s *initConn) take() callOutput {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.out
	s.out = newCallOutput()
	return out
}

// watch has the call's output shown to live (nil: to nobody).
func (s *initConn) watch(live *Live) {
	s.mu.Lock()
	s.live = live
	s.mu.Unlock()
}

// decodeLeftOut reads a T frame: u8 why, u64 size, the path; a bare one
// (or one malformed) names nothing.
func decodeLeftOut(p []byte) (LeftOut, bool) {
	if len(p) < 10 {
		return LeftOut{}, false
	}
	why, ok := map[byte]LeftOutReason{initproto.LeftCount: LeftCount, initproto.LeftBytes: LeftBytes,
		initproto.LeftUnreadable: LeftUnreadable, initproto.LeftLimits: LeftLimits}[p[0]]
	size := binary.BigEndian.Uint64(p[1:])
	if !ok || size > math.MaxInt64 {
		return LeftOut{}, false
	}
	return LeftOut{Path: string(p[9:]), Size: int64(size), Why: why}, true
}

// decodeFile reads a file frame: a uint16 path length, the path, then (from
// the init) a uint64 size, and the data.
func decodeFile(p []byte, sized bool) (File, error) {
	if len(p) < 2 {
		return File{}, errors.New("short file frame")
	}
	pn := int(binary.BigEndian.Uint16(p))
	p = p[2:]
	if len(p) < pn {
		return File{}, errors.New("short file frame")
	}
	f := File{Path: string(p[:pn])}
	p = p[pn:]
	if sized {
		if len(p) < 8 || binary.BigEndian.Uint64(p) != uint64(len(p)-8) {
			return File{}, errors.New("file frame of the wrong size")
		}
		p = p[8:]
	}
	if err := CheckRelPath(f.Path); err != nil {
		return File{}, fmt.Errorf("the init sent an output file with a bad path: %w", err)
	}
	f.Data = p
	return f, nil
}

func frame(typ byte, payload ...[]byte) []byte {
	var b bytes.Buffer
	writeFrame(&b, typ, payload...)
	return b.Bytes()
}

// writeFrame writes a frame's header and its payload's parts in turn,
// without copying them into one buffer: a call's files are megabytes.
func writeFrame(w io.Writer, typ byte, payload ...[]byte) {
	n := 0
	for _, p := range payload {
		n += len(p)
	}
	var head [5]byte
	head[0] = typ
	binary.BigEndian.PutUint32(head[1:], uint32(n))
	w.Write(head[:])
	for _, p := range payload {
		w.Write(p)
	}
}

// configure sends the init its configuration, the first frame, from its
// own goroutine: an init that died before reading it must not hold the
// runtime up (waitReady then sees it gone).
func (s *initConn) configure(c *initproto.Config) error {
	payload, err := c.Encode()
	if err != nil {
		return err
	}
	s.wmu.Lock()
	go func() {
		defer s.wmu.Unlock()
		writeFrame(s.to, initproto.HConfig, payload)
	}()
	return nil
}

// send writes the call to the init: files, stdin, then the code. It runs
// in its own goroutine: the init reads everything at once, but a dead one
// must not hold the supervision up.
func (s *initConn) send(req Request) {
	go func() {
		s.wmu.Lock()
		defer s.wmu.Unlock()
		w := frameWriters.Get().(*bufio.Writer)
		w.Reset(s.to)
		defer frameWriters.Put(w)
		for _, f := range req.Files {
			var pn [2]byte
			binary.BigEndian.PutUint16(pn[:], uint16(len(f.Path)))
			writeFrame(w, initproto.HFile, pn[:], []byte(f.Path), f.Data)
		}
		for p := req.Stdin; len(p) > 0; {
			n := min(len(p), 64<<10)
			writeFrame(w, initproto.HStdin, p[:n])
			p = p[n:]
		}
		writeFrame(w, initproto.HStdinEnd)
		writeFrame(w, initproto.HCPU, []byte(strconv.FormatInt(cpuSeconds(req), 10)))
		if req.Persistent {
			writeFrame(w, initproto.HPersist)
		}
		if req.Live != nil {
			writeFrame(w, initproto.HLive)
		}
		writeFrame(w, initproto.HCode, req.Code)
		w.Flush()
	}()
}

// cpuSeconds is the call's RLIMIT_CPU in the process runtime, in whole
// seconds rounded up: a second past its CPU limit, where the supervision
// stops it first (the limit is of all its processes together, as the
// tree's CPU time measures it), so that each process is bounded still
// should the measure fail; without a CPU limit, its timeout.
func cpuSeconds(req Request) int64 {
	if req.CPULimit > 0 {
		return int64(math.Ceil(req.CPULimit.Seconds())) + 1
	}
	return int64(math.Ceil(req.Timeout.Seconds()))
}

// forkRequest sends a template's init a fork with the call's descriptors,
// which go over its stdin, a socket, with the frame's first bytes.
func (s *initConn) forkRequest(payload []byte, fds []int) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	msg := frame(initproto.HFork, payload)
	raw, err := s.to.SyscallConn()
	if err != nil {
		return err
	}
	var n int
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		n, serr = unix.SendmsgN(int(fd), msg, unix.UnixRights(fds...), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("sending a fork to the template: %w", serr)
	}
	if _, err := s.to.Write(msg[n:]); err != nil {
		return fmt.Errorf("sending a fork to the template: %w", err)
	}
	return nil
}

// kill asks the init to kill the code; its answer follows as usual.
func (s *initConn) kill() { s.signal(initproto.HKill) }

// killCall asks a template's init to kill its call under way, at once
// and in order with the forks: a kill sent later, as the next fork went
// out, would kill the next call. It does not wait on a template that does
// not read; false then (or when the stream is closed).
func (s *initConn) killCall() bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	raw, err := s.to.SyscallConn()
	if err != nil {
		return false
	}
	msg := frame(initproto.HKill)
	var n int
	var werr error
	if err := raw.Write(func(fd uintptr) bool {
		n, werr = unix.SendmsgN(int(fd), msg, nil, nil, unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false
	}
	return werr == nil && n == len(msg)
}

// interrupt asks the init to interrupt the code (KeyboardInterrupt).
func (s *initConn) interrupt() { s.signal(initproto.HInterrupt) }

func (s *initConn) signal(typ byte) {
	go func() {
		s.wmu.Lock()
		defer s.wmu.Unlock()
		s.to.Write(frame(typ))
	}()
}

// closeInput closes the init's stdin: an init that still waits for a call
// then kills everything and exits.
func (s *initConn) closeInput() {
	s.writeOnce.Do(func() { s.to.Close() })
}

// waitReady waits for the init to report its interpreter ready.
func (s *initConn) waitReady(ctx context.Context, exited <-chan struct{}) error {
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	// drained bounds the wait, once the init is gone, for what it said
	// before it went: its last frames (why it refused) may still be on
	// their way from its stream when its end is known (a forked init's
	// reap is reported by its template, over another stream).
	var drained <-chan time.Time
	gone := func() error {
		return fmt.Errorf("the sandbox's init exited before the interpreter was ready: %s", s.failure())
	}
	for {
		select {
		case ev := <-s.events:
			switch ev.kind {
			case initproto.IReady:
				return nil
			case initproto.IError:
				return fmt.Errorf("the sandbox's init: %s", ev.msg)
			case initproto.IExit, 0:
				if drained != nil {
					return gone()
				}
				// The interpreter ended before it read any code.
				return fmt.Errorf("the interpreter did not start: %s", s.failure())
			}
		case <-timer.C:
			return fmt.Errorf("the interpreter was not ready within %v", readyTimeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			exited, drained = nil, time.After(time.Second)
		case <-drained:
			return gone()
		}
	}
}

// failure describes what the init and the interpreter said before they
// failed, for the operator's log.
func (s *initConn) failure() string {
	s.mu.Lock()
	stderr, stdout := s.out.stderr.bytes(), s.out.stdout.bytes()
	s.mu.Unlock()
	diag, _, _ := s.diag.result()
	for _, msg := range [][]byte{diag, stderr, stdout} {
		if len(msg) > 0 {
			return lastLines(msg, 5)
		}
	}
	return "no message"
}
