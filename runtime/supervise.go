package runtime

import (
	"context"
	"fmt"
	goruntime "runtime"
	"syscall"
	"time"

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
	// cpuPollMin and cpuPollMax bound how long the supervision waits
	// between two reads of a call's CPU time, under a CPU limit: the
	// soonest the limit can be reached, were every CPU of the host
	// the call's, within these.
	cpuPollMin = 2 * time.Millisecond
	cpuPollMax = 100 * time.Millisecond
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
		return res, false, fmt.Errorf("%w: readying the sandbox for the call (its CPU weight, its process limit): %w", ErrSandbox, err)
	}
	s.watch(req.Live)
	defer s.watch(nil)
	if req.Egress != nil {
		// The code's connections are the call's from its first byte, and
		// none outlives it (a session's thread may hold one on).
		s.relay.begin(ctx, req.Egress)
		defer s.relay.end()
	}
	// The code's CPU counts from before it has its code: an interpreter
	// that has it runs it at once, and a busy server can take the init's
	// word that it started only after the code is done (a forked runsc
	// call's loop was counted 0 ms under two busy loops).
	cpu0 := c.cpu()
	s.send(req)
	k := &call{ctx: ctx, c: c, conn: s, req: req, exited: exited, stopTimer: func() {}, cpu0: cpu0}
	k.serve()
	k.collect()
	return k.result()
}

// call is one call on a ready sandbox, as the supervision sees it: the
// shape of the init's own loop (init_loop.c), one handler for each event
// — a frame of the init, the timeout, the grace after a kill or an
// interrupt, a measure of the sockets, the caller's cancellation — until
// the init has said all it will; then its result.
type call struct {
	ctx    context.Context
	c      container
	conn   *initConn
	req    Request
	exited <-chan struct{}

	res    Result
	start  time.Time // the init said the code has it; zero until then
	exitAt time.Time // the init said the code exited
	exit   *event
	out    *callOutput
	cpu0   time.Duration // as the code was given, and at the exit
	cpu1   time.Duration
	// cpuSeen is the most the CPU checks read: the process runtime's
	// measure of its process tree reads nothing once the tree is killed,
	// and a call ended at its CPU limit used that much at least.
	cpuSeen   time.Duration
	timer     <-chan time.Time // the timeout, from the start
	stopTimer func()
	cpuCheck  <-chan time.Time // the next read of the CPU time, under a CPU limit
	grace     <-chan time.Time // the kill after a stop
	idle      bool             // a session's call is over; its sandbox waits for the next
	ended     bool             // the init's stdout ended, or it said it is done or idle
	done      bool             // the init said it is done
	ctxErr    error
	initError string
}

// serve waits for what the call's state needs and hands each event on.
func (k *call) serve() {
	var sockets <-chan time.Time
	if _, _, ok := k.c.sockets(); ok {
		t := time.NewTicker(socketPoll)
		defer t.Stop()
		sockets = t.C
	}
	for !k.ended {
		select {
		case <-sockets:
			if k.onSockets() {
				sockets = nil
			}
		case ev := <-k.conn.events:
			k.onFrame(ev)
		case <-k.timer:
			k.onTimer()
		case <-k.cpuCheck:
			k.onCPUCheck()
		case <-k.grace:
			k.onGrace()
		case <-k.ctx.Done():
			k.onCancel()
		}
	}
	k.stopTimer()
}

// onSockets kills the container whose socket buffers are past their
// bound, as the memory limit would; it reports whether it did.
func (k *call) onSockets() bool {
	used, limit, _ := k.c.sockets()
	if !socketsOver(used, limit) {
		return false
	}
	k.res.OOMKilled, k.res.SocketsKilled = true, true
	k.c.kill()
	return true
}

// onFrame takes one event of the init.
func (k *call) onFrame(ev event) {
	switch ev.kind {
	case initproto.IStarted:
		k.onStarted(ev)
	case initproto.IExit:
		k.onExit(ev)
	case initproto.IError:
		if k.start.IsZero() {
			// The call could not be set up (an input file failed):
			// nothing of it runs.
			k.initError = ev.msg
			k.c.kill()
		}
	case initproto.IIdle:
		// A session's call is over; its sandbox waits for the next.
		k.out, k.idle, k.ended = ev.out, true, true
	case initproto.IDone:
		// The init has sent all there is: the result is complete
		// without waiting for its exit, which teardown sees to.
		k.done, k.ended = true, true
	case 0:
		k.ended = true
	}
}

// onStarted: the code has it; its time counts from now.
func (k *call) onStarted(ev event) {
	k.start = ev.at
	if supervisionTimer {
		t := time.NewTimer(time.Until(k.start.Add(k.req.Timeout)))
		k.timer, k.stopTimer = t.C, func() { t.Stop() }
	}
	k.c.deadline(k.start.Add(k.req.Timeout + watchdogGrace))
	if k.req.CPULimit > 0 {
		k.nextCPUCheck(0)
	}
}

// nextCPUCheck waits, before reading the call's CPU time again, for the
// least time the rest of its limit can take: the host's every CPU busy
// with it.
func (k *call) nextCPUCheck(used time.Duration) {
	wait := (k.req.CPULimit - used) / time.Duration(goruntime.NumCPU())
	k.cpuCheck = time.After(min(max(wait, cpuPollMin), cpuPollMax))
}

// onCPUCheck: the code has used its CPU time, as the host's kernel
// accounts it to the call's cgroup, or not yet. At its limit it is
// stopped as at a timeout (a session's interrupted first), and only its
// CPU limit is said to have ended it.
func (k *call) onCPUCheck() {
	now := k.c.cpu()
	k.cpuSeen = max(k.cpuSeen, now)
	used := now - k.cpu0
	if used < k.req.CPULimit {
		k.nextCPUCheck(used)
		return
	}
	k.cpuCheck = nil
	k.res.CPULimited = true
	k.stopTimer()
	k.timer = nil
	k.stop()
}

// onExit: the code is over; the init exports its files.
func (k *call) onExit(ev event) {
	k.exit = &ev
	k.exitAt = ev.at
	k.res.Duration = ev.ran
	k.cpu1 = max(k.c.cpu(), k.cpuSeen)
	k.stopTimer()
	k.timer, k.cpuCheck = nil, nil
	k.grace = time.After(exportTimeout)
	k.c.deadline(time.Now().Add(exportTimeout + time.Second))
}

func (k *call) onTimer() {
	k.res.TimedOut = true
	k.timer, k.cpuCheck = nil, nil
	k.stop()
}

func (k *call) onGrace() {
	k.grace = nil
	k.c.kill()
}

// onCancel: the caller gave up. A session's running code is interrupted
// first, as at its timeout; anything else is killed.
func (k *call) onCancel() {
	k.ctxErr = k.ctx.Err()
	k.ctx = context.Background()
	if k.req.Persistent && k.grace == nil {
		k.stop()
	} else {
		k.c.kill()
	}
}

// stop ends the code: a session's by an interrupt first.
func (k *call) stop() {
	if k.req.Persistent && k.exit == nil && !k.start.IsZero() {
		k.conn.interrupt()
		k.grace = time.After(interruptGrace)
		return
	}
	k.conn.kill()
	k.grace = time.After(killGrace)
}

// collect takes the call's output: a session's came with its end; any
// other's once the init is gone (or killed after teardownTimeout).
func (k *call) collect() {
	if k.idle {
		k.c.deadline(time.Time{})
		return
	}
	k.conn.closeInput()
	if !k.done || k.c.waitsForExit() {
		select {
		case <-k.exited:
		case <-time.After(teardownTimeout):
			k.c.kill()
		}
	}
	o := k.conn.take()
	k.out = &o
}

// result is the call's verdict: its output within the request's caps, the
// container's measures, and how the code ended.
func (k *call) result() (Result, bool, error) {
	res, req, out := &k.res, k.req, k.out
	// The init counted everything; it sent only what fits the cap.
	res.StdoutBytes, res.StderrBytes = out.stdout.seen, out.stderr.seen
	if ev := k.exit; ev != nil {
		res.StdoutBytes, res.StderrBytes = max(res.StdoutBytes, ev.outTotal), max(res.StderrBytes, ev.errTotal)
	}
	notes := notesText(out.stderr, out.notes, req.MaxOutputBytes)
	res.Stdout, res.StdoutTruncated = out.stdout.result(req.MaxOutputBytes, res.StdoutBytes)
	res.Stderr, res.StderrTruncated = out.stderr.result(req.MaxOutputBytes-int64(len(notes)), res.StderrBytes)
	res.Stderr = append(res.Stderr[:len(res.Stderr):len(res.Stderr)], notes...)
	res.Files, res.FilesTruncated, res.FilesLeftOut = out.files, out.skipped, out.leftOut
	res.Value = capped(out.value, req.MaxOutputBytes, &res.ValueTruncated)
	killedForSockets := res.SocketsKilled
	k.c.verdict(res)
	if killedForSockets {
		res.OOMKilled, res.SocketsKilled = true, true
	}
	if k.exit != nil && !k.done && !k.idle && k.ctxErr == nil {
		k.filesCut(res)
	}
	// The code's CPU time: from when it had its code to its exit, not the
	// interpreter's start-up before (or gVisor's boot).
	if k.exit == nil {
		k.cpu1 = max(res.CPUTime, k.cpuSeen)
	}
	if !k.start.IsZero() && k.cpu1 >= k.cpu0 {
		res.CPUTime = k.cpu1 - k.cpu0
	}
	// No cgroup counts for the process runtime: its init measured.
	if k.exit != nil && k.exit.usage != nil {
		cpu := k.exit.usage.cpu
		if res.CPULimited {
			// The check that ended it read at least the limit; the init's
			// figure, to a clock tick and taken a moment apart, can be
			// under it.
			cpu = max(cpu, res.CPUTime)
		}
		res.CPUTime, res.PeakMemoryBytes = cpu, k.exit.usage.peak
	}
	req.phases(k.start, k.exitAt)
	switch {
	case k.ctxErr != nil:
		return *res, k.idle, k.ctxErr
	case k.initError != "":
		return *res, false, fmt.Errorf("%w: %s", ErrSandbox, k.initError)
	case k.start.IsZero():
		return *res, false, fmt.Errorf("%w: %w: %s", ErrSandbox, errNotStarted, k.conn.failure())
	}
	k.ending()
	return *res, k.idle, nil
}

// ending fills how the code ended: as the init said, or, where the init
// died with the code running, as a kill.
func (k *call) ending() {
	res := &k.res
	if ev := k.exit; ev != nil {
		ws := ev.status
		res.ExitCode = exitCode(ws.Exited(), ws.ExitStatus(), ws.Signaled(), int(ws.Signal()))
		if ws.Signaled() {
			res.Signal = int(ws.Signal())
		}
		// The process runtime's limits are rlimits: its init says when the
		// code reached the process limit, and when the memory limit's
		// refusal (MemoryError) ended it, which a cgroup's OOM kill would
		// have (the same verdict; MemoryRefused tells them apart).
		if ev.flags&initproto.ExitPids != 0 {
			res.PidsLimitHit = true
		}
		if ev.flags&initproto.ExitMemory != 0 {
			res.OOMKilled, res.MemoryRefused = true, true
		}
		// The init counted everything; it sent only what fits the cap.
		res.StdoutBytes, res.StderrBytes = max(res.StdoutBytes, ev.outTotal), max(res.StderrBytes, ev.errTotal)
		res.StdoutTruncated = res.StdoutTruncated || ev.outTotal > int64(len(res.Stdout))
		res.StderrTruncated = res.StderrTruncated || ev.errTotal > int64(len(res.Stderr))
		// The CPU limit ended the run unless the code ended on its own
		// first: a fresh call's exited rather than being killed, a
		// session's call ended well rather than being interrupted.
		if cell := ev.flags&initproto.ExitCell != 0; res.CPULimited && (cell && ws.ExitStatus() == 0 || !cell && ws.Exited()) {
			res.CPULimited = false
		}
		return
	}
	// The init died with the code running: the memory limit's OOM killer,
	// or under gVisor the whole sandbox ending, or a kill after the
	// grace. The container was killed: say so as a signal would.
	res.Duration = time.Since(k.start)
	res.ExitCode, res.Signal = 128+int(syscall.SIGKILL), int(syscall.SIGKILL)
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

// filesCut says that the code exited but its sandbox ended before the
// init had sent all its output files (killed at the memory limit while
// it read them, or past exportTimeout): those it sent are kept, and the
// rest are not "none" but lost, which a note on stderr says
// (files_truncated is the file limits' alone).
func (k *call) filesCut(res *Result) {
	why := ""
	if res.OOMKilled {
		why = " (the memory limit killed it)"
	}
	note := "mcp-exec: the sandbox ended after the code exited, before its output files were all collected" + why + "\n"
	if p := res.Stderr; len(p) > 0 && p[len(p)-1] != '\n' {
		note = "\n" + note
	}
	if int64(len(res.Stderr)+len(note)) <= k.req.MaxOutputBytes {
		res.Stderr = append(res.Stderr, note...)
	}
}

// notesText is the init's notes for the caller, each on a line of its
// own, to end stderr with, within the cap: what the code wrote makes
// room for them, as they say why its run ended as it did.
func notesText(stderr *streamBuffer, notes []string, max int64) []byte {
	if len(notes) == 0 {
		return nil
	}
	var add []byte
	if p := stderr.bytes(); len(p) > 0 && p[len(p)-1] != '\n' {
		add = append(add, '\n')
	}
	for _, n := range notes {
		add = append(add, "mcp-exec: "+n+"\n"...)
	}
	if int64(len(add)) > max {
		add = add[:max]
	}
	return add
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
