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

// Grace periods of the supervision, all counted on the host's clock.
const (
	// readyTimeout bounds the start of a sandbox up to its interpreter
	// waiting for code (gVisor's boot included).
	readyTimeout = 60 * time.Second
	// killGrace is how long the init has, after a timeout, to kill the
	// code and report, before the whole container is killed.
	killGrace = 2 * time.Second
	// exportTimeout bounds the export of output files after the exit.
	exportTimeout = 10 * time.Second
	// watchdogGrace is how far past its timeout the watchdog lets a call's
	// code run before it kills the container itself.
	watchdogGrace = killGrace + time.Second
	// interruptGrace is how long a session's code has, after the
	// KeyboardInterrupt of its timeout, to stop before its sandbox is
	// killed.
	interruptGrace = time.Second
)

// supervisionTimer can be turned off by a test, to play a server whose own
// timer failed: the watchdog must then end the call.
var supervisionTimer = true

// socketPoll is how often the supervision reads a container's socket
// memory on cgroup v1, where the kernel lets every socket keep a buffer
// past the bound (a receive queue that is empty takes one skb whatever
// the limit, so that the connection makes progress): a call opening
// thousands of loopback connections would add up those minimums far past
// it. Past half the bound again, the container is killed, as the memory
// limit would kill it; loopback moves about a gigabyte a second, so the
// poll is frequent (a read of one cgroup file).
const socketPoll = 5 * time.Millisecond

// socketsOver reports whether used socket memory is past the kill mark.
func socketsOver(used, limit int64) bool { return limit > 0 && used > limit+limit/2 }

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
}

// callOutput is what the init sent of one call besides its verdict.
type callOutput struct {
	stdout, stderr *cappedBuffer
	files          []File
	skipped        bool
	notes          []string
	value          []byte
}

func newCallOutput() callOutput {
	return callOutput{stdout: newCappedBuffer(initproto.MaxFrame), stderr: newCappedBuffer(initproto.MaxFrame)}
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
	go drain(diag, s.diag, make(chan struct{}))
	go s.read(from)
	return s
}

// read turns frames into output, files and events until the init's stdout
// ends; then it sends a zero event and stops.
func (s *initConn) read(from *os.File) {
	defer from.Close()
	defer func() { s.events <- event{at: time.Now()} }()
	r := bufio.NewReaderSize(from, 64<<10)
	var head [5]byte
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
			s.output(head[0], payload)
		case initproto.IOutFile:
			f, err := decodeFile(payload, true)
			if err != nil {
				s.events <- event{kind: initproto.IError, msg: err.Error()}
				return
			}
			s.mu.Lock()
			s.out.files = append(s.out.files, f)
			s.mu.Unlock()
		case initproto.ISkipped:
			s.mu.Lock()
			s.out.skipped = true
			s.mu.Unlock()
		case initproto.IResult:
			s.mu.Lock()
			s.out.value = payload
			s.mu.Unlock()
		case initproto.IIdle:
			out := s.take()
			s.events <- event{kind: initproto.IIdle, at: time.Now(), out: &out}
		case initproto.IExit:
			if n != initproto.ExitFrameLen {
				s.events <- event{kind: initproto.IError, msg: fmt.Sprintf("the init sent an exit frame of %d bytes, want %d", n, initproto.ExitFrameLen)}
				return
			}
			s.events <- event{kind: initproto.IExit, at: time.Now(), status: syscall.WaitStatus(binary.BigEndian.Uint32(payload)),
				outTotal: int64(binary.BigEndian.Uint64(payload[4:])), errTotal: int64(binary.BigEndian.Uint64(payload[12:])),
				ran: time.Duration(binary.BigEndian.Uint64(payload[20:])), flags: binary.BigEndian.Uint32(payload[28:])}
		case initproto.INote:
			s.mu.Lock()
			if len(s.out.notes) < 16 {
				s.out.notes = append(s.out.notes, string(payload[:min(len(payload), 1024)]))
			}
			s.mu.Unlock()
		case initproto.IError:
			s.events <- event{kind: initproto.IError, msg: string(payload)}
		case initproto.IForked, initproto.IReaped:
			if n == 4 {
				s.events <- event{kind: head[0], at: time.Now(), status: syscall.WaitStatus(binary.BigEndian.Uint32(payload))}
			}
		default:
			s.events <- event{kind: head[0], at: time.Now()}
		}
	}
}

// output keeps a chunk of the call's stdout or stderr, and shows it to
// whoever watches the call.
func (s *initConn) output(typ byte, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if typ == initproto.IStdout {
		s.out.stdout.Write(p)
	} else {
		s.out.stderr.Write(p)
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
		w := bufio.NewWriterSize(s.to, 64<<10)
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
		writeFrame(w, initproto.HCPU, []byte(strconv.FormatInt(int64(math.Ceil(req.Timeout.Seconds())), 10)))
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
	for {
		select {
		case ev := <-s.events:
			switch ev.kind {
			case initproto.IReady:
				return nil
			case initproto.IError:
				return fmt.Errorf("the sandbox's init: %s", ev.msg)
			case initproto.IExit, 0:
				// The interpreter ended before it read any code.
				return fmt.Errorf("the interpreter did not start: %s", s.failure())
			}
		case <-timer.C:
			return fmt.Errorf("the interpreter was not ready within %v", readyTimeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("the sandbox's init exited before the interpreter was ready: %s", s.failure())
		}
	}
}

// failure describes what the init and the interpreter said before they
// failed, for the operator's log.
func (s *initConn) failure() string {
	s.mu.Lock()
	out := s.out
	s.mu.Unlock()
	for _, b := range []*cappedBuffer{s.diag, out.stderr, out.stdout} {
		if msg, _, _ := b.result(); len(msg) > 0 {
			return lastLines(msg, 5)
		}
	}
	return "no message"
}

// supervise runs one call on a ready sandbox: it hands the init the call,
// counts the timeout from when the code has it, kills on timeout or
// cancellation, and collects the verdict. The container's watchdog is told
// the deadline past which it may kill the container itself. exited is
// closed once the init has exited and been reaped. idle says a session's
// sandbox took the call and waits for the next; otherwise it is over.
//
// A session's call is interrupted (KeyboardInterrupt) on timeout or
// cancellation, and its sandbox killed only if the code is still running
// interruptGrace later: code that stops keeps its session.
func supervise(ctx context.Context, c container, exited <-chan struct{}, s *initConn, req Request) (res Result, idle bool, err error) {
	if err := c.foreground(); err != nil {
		return res, false, fmt.Errorf("%w: giving the sandbox a call's CPU weight: %w", ErrSandbox, err)
	}
	s.watch(req.Live)
	defer s.watch(nil)
	s.send(req)

	var (
		start     time.Time
		timer     <-chan time.Time
		grace     <-chan time.Time
		exitEv    *event
		out       *callOutput
		cpu0      time.Duration
		cpu1      time.Duration
		ended     bool // the init's stdout ended, or it said it is done
		done      bool // the init said it is done
		ctxErr    error
		initError string
		exitAt    time.Time // when the code's exit was told
	)
	stopTimer := func() {}
	// stop ends the code: a session's by an interrupt first.
	stop := func() {
		if req.Persistent && exitEv == nil && !start.IsZero() {
			s.interrupt()
			grace = time.After(interruptGrace)
			return
		}
		s.kill()
		grace = time.After(killGrace)
	}
	var sockTick <-chan time.Time
	if _, _, ok := c.sockets(); ok {
		t := time.NewTicker(socketPoll)
		defer t.Stop()
		sockTick = t.C
	}
	for !ended {
		select {
		case <-sockTick:
			if used, limit, _ := c.sockets(); socketsOver(used, limit) {
				sockTick = nil
				res.OOMKilled, res.SocketsKilled = true, true
				c.kill()
			}
		case ev := <-s.events:
			switch ev.kind {
			case initproto.IStarted:
				start = ev.at
				cpu0 = c.cpu()
				if supervisionTimer {
					t := time.NewTimer(time.Until(start.Add(req.Timeout)))
					timer, stopTimer = t.C, func() { t.Stop() }
				}
				c.deadline(start.Add(req.Timeout + watchdogGrace))
			case initproto.IExit:
				exitEv = &ev
				exitAt = ev.at
				res.Duration = ev.ran
				cpu1 = c.cpu()
				stopTimer()
				timer = nil
				grace = time.After(exportTimeout)
				// The code is over; the init exports its files.
				c.deadline(time.Now().Add(exportTimeout + time.Second))
			case initproto.IError:
				if start.IsZero() {
					// The call could not be set up (an input file failed):
					// nothing of it runs.
					initError = ev.msg
					c.kill()
				}
			case initproto.IIdle:
				// A session's call is over; its sandbox waits for the next.
				out, idle, ended = ev.out, true, true
			case initproto.IDone:
				// The init has sent all there is: the result is complete
				// without waiting for its exit, which teardown sees to.
				done, ended = true, true
			case 0:
				ended = true
			}
		case <-timer:
			res.TimedOut = true
			timer = nil
			stop()
		case <-grace:
			grace = nil
			c.kill()
		case <-ctx.Done():
			ctxErr = ctx.Err()
			ctx = context.Background()
			if req.Persistent && grace == nil {
				stop()
			} else {
				c.kill()
			}
		}
	}
	stopTimer()
	if idle {
		c.deadline(time.Time{})
	} else {
		s.closeInput()
		if !done || c.waitsForExit() {
			select {
			case <-exited:
			case <-time.After(teardownTimeout):
				c.kill()
			}
		}
		o := s.take()
		out = &o
	}

	res.Stdout, res.StdoutTruncated, res.StdoutBytes = out.stdout.result()
	res.Stderr, res.StderrTruncated, res.StderrBytes = out.stderr.result()
	res.Stdout, res.Stderr = capped(res.Stdout, req.MaxOutputBytes, &res.StdoutTruncated), capped(res.Stderr, req.MaxOutputBytes, &res.StderrTruncated)
	res.Stderr = withNotes(res.Stderr, out.notes, req.MaxOutputBytes, &res.StderrTruncated)
	res.Files, res.FilesTruncated = out.files, out.skipped
	res.Value = capped(out.value, req.MaxOutputBytes, &res.ValueTruncated)
	killedForSockets := res.SocketsKilled
	c.verdict(&res)
	if killedForSockets {
		res.OOMKilled, res.SocketsKilled = true, true
	}
	// The code's CPU time: from when it had its code to its exit, not the
	// interpreter's start-up before (or gVisor's boot).
	if exitEv == nil {
		cpu1 = res.CPUTime
	}
	if !start.IsZero() && cpu1 >= cpu0 {
		res.CPUTime = cpu1 - cpu0
	}
	req.phases(start, exitAt)
	switch {
	case ctxErr != nil:
		return res, idle, ctxErr
	case initError != "":
		return res, false, fmt.Errorf("%w: %s", ErrSandbox, initError)
	case start.IsZero():
		return res, false, fmt.Errorf("%w: %w: %s", ErrSandbox, errNotStarted, s.failure())
	case exitEv != nil:
		ws := exitEv.status
		res.ExitCode = exitCode(ws.Exited(), ws.ExitStatus(), ws.Signaled(), int(ws.Signal()))
		// The init counted everything; it sent only what fits the cap.
		res.StdoutBytes, res.StderrBytes = max(res.StdoutBytes, exitEv.outTotal), max(res.StderrBytes, exitEv.errTotal)
		res.StdoutTruncated = res.StdoutTruncated || exitEv.outTotal > int64(len(res.Stdout))
		res.StderrTruncated = res.StderrTruncated || exitEv.errTotal > int64(len(res.Stderr))
	default:
		// The init died with the code running: the memory limit's OOM
		// killer, or under gVisor the whole sandbox ending, or a kill after
		// the grace. The container was killed: say so as a signal would.
		res.Duration = time.Since(start)
		res.ExitCode = 128 + int(syscall.SIGKILL)
	}
	return res, idle, nil
}

// phases tells the request the run (start to the code's exit, or to now
// when it was killed) and the collection after it.
func (req Request) phases(start, exited time.Time) {
	now := time.Now()
	if exited.IsZero() {
		exited = now
	}
	req.Phases.span(PhaseRun, start, exited)
	req.Phases.span(PhaseCollect, exited, now)
}

// withNotes ends stderr with the init's notes for the caller, each on a
// line of its own, within the cap: what the code wrote makes room for
// them, as they say why its run ended as it did.
func withNotes(stderr []byte, notes []string, max int64, truncated *bool) []byte {
	if len(notes) == 0 {
		return stderr
	}
	var add []byte
	if len(stderr) > 0 && stderr[len(stderr)-1] != '\n' {
		add = append(add, '\n')
	}
	for _, n := range notes {
		add = append(add, "mcp-exec: "+n+"\n"...)
	}
	if int64(len(add)) > max {
		add = add[:max]
	}
	if keep := max - int64(len(add)); int64(len(stderr)) > keep {
		stderr, *truncated = stderr[:keep], true
	}
	return append(stderr[:len(stderr):len(stderr)], add...)
}

// capped keeps at most n bytes of b.
func capped(b []byte, n int64, truncated *bool) []byte {
	if int64(len(b)) > n {
		*truncated = true
		return b[:n]
	}
	return b
}

func lastLines(b []byte, n int) string {
	lines := splitLines(b)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += " | "
		}
		out += l
	}
	return out
}

func splitLines(b []byte) []string {
	var lines []string
	start := 0
	for i, c := range b {
		if c == '\n' {
			if i > start {
				lines = append(lines, string(b[start:i]))
			}
			start = i + 1
		}
	}
	if start < len(b) {
		lines = append(lines, string(b[start:]))
	}
	return lines
}
