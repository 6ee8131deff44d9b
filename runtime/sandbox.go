package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The one Sandbox of every runtime: the conversation with the init, the
// locked-thread start, waiting for ready, the call and teardown are the
// same for libcontainer, runsc and the process runtime, and written here.
// What a runtime contributes is a container: how its init is made,
// started, killed and measured, and what its teardown removes.

// status is a sandbox's place in its life, as gVisor's container status:
// each transition is checked in one place (sandbox.move).
type status int

const (
	// preparing: the container is being made and its init started.
	preparing status = iota
	// ready: the interpreter waits for its code.
	ready
	// running: a call has begun. A sandbox runs code once, unless it is
	// a session's, which goes back to ready after each call.
	running
	// frozen: a persistent session's sandbox between its calls, every
	// process of it stopped where it stood (container.freeze) until its
	// next call thaws it: nothing of it runs outside a call.
	frozen
	// parked: a frozen session's sandbox saved to disk, its processes
	// gone (park.go), until its next call restores it.
	parked
	// closing: teardown is under way.
	closing
	// closed: nothing of it is left.
	closed
)

var statusNames = [...]string{"preparing", "ready", "running", "frozen", "parked", "closing", "closed"}

func (s status) String() string { return statusNames[s] }

// container is what a runtime contributes to a sandbox.
type container interface {
	// create makes everything the init needs before it starts.
	create(ctx context.Context) error
	// stdio returns the init's standard streams: the child's ends and the
	// sandbox's (stdin, stdout, stderr).
	stdio() (child, parent [3]*os.File, err error)
	// start starts the init on child's streams. It runs on an OS thread
	// that stays locked until wait returns: a parent-death signal follows
	// the thread that forked, and Go may retire threads.
	start(child [3]*os.File) error
	// wait blocks until the init has been reaped.
	wait()
	// started runs once the init runs, before it is configured.
	started() error
	// initConfig is the init's configuration.
	initConfig() (*initproto.Config, error)
	// kill SIGKILLs every process of the container, the init included.
	kill()
	// verdict fills the OOM and pids flags, CPU time and peak memory.
	verdict(res *Result)
	// cpu is the CPU time the container has used so far.
	cpu() time.Duration
	// sockets reports the kernel's socket buffers charged to the container
	// and their bound, where they are counted apart from the memory limit
	// (cgroup v1); ok is false elsewhere.
	sockets() (used, limit int64, ok bool)
	// foreground gives a container prepared ahead the CPU weight of a
	// running call (policy.CPUSharesCall); the process runtime's, its
	// process limit where the uid is shared, set as the call is claimed.
	foreground() error
	// deadline tells an outside watchdog when the call's code must be
	// over, or that it is (zero time); a no-op without a watchdog.
	deadline(at time.Time)
	// waitsForExit: the result waits for the init to end on its own, not
	// only for its "done".
	waitsForExit() bool
	// explain adds what the runtime knows of why the sandbox never got
	// ready (runsc's own log) to err.
	explain(err error) error
	// freeze stops every process of the container where it stands, and
	// returns once none runs; thaw lets them go on. kill still kills a
	// frozen container. (A persistent session between its calls.)
	freeze() error
	thaw() error
	// destroy removes what the container holds, once its init is gone.
	destroy() error
}

// sandbox is one prepared container; it runs code once.
type sandbox struct {
	id   string
	b    *bundle.Bundle
	c    container
	live *liveSet
	conn *initConn

	mu    sync.Mutex
	state status
	// launched: the init was started; done is closed once it is reaped.
	launched bool
	done     chan struct{}

	closer teardownOnce
}

// move takes the sandbox from one of from to to, or says why it cannot.
func (sb *sandbox) move(to status, from ...status) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, f := range from {
		if sb.state == f {
			sb.state = to
			return nil
		}
	}
	return fmt.Errorf("sandbox %s is %s, not %v", sb.id, sb.state, from)
}

func (sb *sandbox) status() status {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.state
}

// prepare makes the sandbox of b with c and returns once its interpreter
// waits for code. The sandbox owns b from the start: on failure it is
// torn down, b with it.
func prepare(ctx context.Context, live *liveSet, b *bundle.Bundle, c container) (_ Sandbox, retErr error) {
	sb := &sandbox{id: b.ID, b: b, c: c, live: live, done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			sb.Close()
		}
	}()
	if err := live.add(sb); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.create(ctx); err != nil {
		return nil, err
	}
	cfg, err := c.initConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	child, parent, err := c.stdio()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.launch(child); err != nil {
		closeAll(parent[:])
		return nil, err
	}
	sb.conn = newInitConn(parent[0], parent[1], parent[2])
	if err := c.started(); err != nil {
		return nil, err
	}
	if err := sb.conn.configure(cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.conn.waitReady(ctx, sb.done); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: sandbox %s: %w", ErrSandbox, b.ID, c.explain(err))
	}
	if err := sb.move(ready, preparing); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	return sb, nil
}

// launch starts the init from a thread locked until it is reaped, and
// closes the child's ends of its streams in this process: EOF comes when
// the container's last holder is gone.
func (sb *sandbox) launch(child [3]*os.File) error {
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		if err := sb.c.start(child); err != nil {
			started <- err
			close(sb.done)
			return
		}
		sb.mu.Lock()
		sb.launched = true
		closing := sb.state >= closing
		sb.mu.Unlock()
		if closing {
			sb.c.kill() // Close raced the start: it must not run on
		}
		started <- nil
		sb.c.wait()
		close(sb.done)
	}()
	err := <-started
	closeAll(child[:])
	if err != nil {
		return fmt.Errorf("%w: starting the init of %s: %w", ErrSandbox, sb.id, err)
	}
	return nil
}

// Run runs the code of a valid request.
func (sb *sandbox) Run(ctx context.Context, req Request) (Result, error) {
	defer req.closeEgress()
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	return sb.run(ctx, req)
}

// run runs req, which the caller validated. A session's sandbox is ready
// again after a call its interpreter lived through, unless the call hit
// the memory or process limit, which ends the session too; otherwise
// res.Ended says why it can take no more. A frozen one is thawed first.
func (sb *sandbox) run(ctx context.Context, req Request) (Result, error) {
	if err := sb.begin(); err != nil {
		return Result{}, err
	}
	res, idle, err := supervise(ctx, sb.c, sb.done, sb.conn, req)
	if !req.Persistent {
		return res, err
	}
	switch {
	case res.OOMKilled || res.PidsLimitHit:
		res.Ended = EndOOM
	case idle:
		if merr := sb.move(ready, running); merr != nil {
			res.Ended = EndExited
		}
	case res.CPULimited:
		res.Ended = EndCPU
	case res.TimedOut:
		res.Ended = EndTimeout
	default:
		res.Ended = EndExited
	}
	if res.Ended != "" {
		sb.c.kill()
	}
	return res, err
}

// begin takes a ready or frozen sandbox to running; a frozen one is
// thawed before anything of the call reaches it.
func (sb *sandbox) begin() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch sb.state {
	case ready:
	case frozen:
		if err := sb.c.thaw(); err != nil {
			// It cannot go on; it must not stay half thawed either.
			sb.c.kill()
			return fmt.Errorf("%w: thawing sandbox %s: %w", ErrSandbox, sb.id, err)
		}
	case parked:
		parent, err := sb.c.(parker).unpark()
		if err != nil {
			sb.c.kill()
			return fmt.Errorf("%w: restoring the parked session %s: %w", ErrSandbox, sb.id, err)
		}
		// The restored init talks on new streams; the old ones ended with
		// the sandbox that was saved.
		sb.conn.closeInput()
		sb.conn = newInitConn(parent[0], parent[1], parent[2])
	default:
		return fmt.Errorf("sandbox %s is %s, not ready", sb.id, sb.state)
	}
	sb.state = running
	return nil
}

// park saves a frozen sandbox to disk and ends its processes, when its
// container can (parker); ok is false when it cannot, and it stays
// frozen. A park that fails leaves it frozen too, or, if its processes
// are gone, dead (its next call fails and ends the session).
func (sb *sandbox) park() (ok bool, err error) {
	p, can := sb.c.(parker)
	if !can {
		return false, nil
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state != frozen {
		return false, nil
	}
	if err := p.park(); err != nil {
		return false, fmt.Errorf("parking sandbox %s: %w", sb.id, err)
	}
	sb.state = parked
	return true, nil
}

// freeze stops every process of a ready sandbox, a persistent session's
// between its calls, until its next call (begin): its threads and
// processes use no CPU outside a call, where no concurrency slot counts
// them. Under sb.mu, so that teardown, which kills (and so thaws), comes
// after it whole. A sandbox that cannot be frozen is killed.
func (sb *sandbox) freeze() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state != ready {
		return fmt.Errorf("sandbox %s is %s, not ready", sb.id, sb.state)
	}
	if err := sb.c.freeze(); err != nil {
		sb.c.kill()
		return fmt.Errorf("freezing sandbox %s between its calls: %w", sb.id, err)
	}
	sb.state = frozen
	return nil
}

// Close tears the sandbox down, whatever state it is in, under its own
// deadline; it is safe to call more than once.
func (sb *sandbox) Close() error {
	return sb.closer.do("sandbox "+sb.id, sb.teardown)
}

// teardown kills every process of the container, waits for its init to
// be reaped (killing again, should a start race the first kill), then has
// the runtime remove what the container holds, and removes the bundle.
func (sb *sandbox) teardown() error {
	sb.mu.Lock()
	ran := sb.state == running
	sb.state = closing
	launched := sb.launched
	sb.mu.Unlock()
	sb.c.kill()
	if sb.conn != nil {
		sb.conn.closeInput()
	}
	if launched {
		tick := time.NewTicker(50 * time.Millisecond)
	wait:
		for {
			select {
			case <-sb.done:
				break wait
			case <-tick.C:
				sb.c.kill()
			}
		}
		tick.Stop()
	}
	errs := []error{sb.c.destroy()}
	if ran {
		sb.c.deadline(time.Time{})
	}
	makeWritable(sb.b.Dir)
	errs = append(errs, sb.b.Remove())
	sb.live.remove(sb)
	sb.mu.Lock()
	sb.state = closed
	sb.mu.Unlock()
	return errors.Join(errs...)
}

// pipes are an init's standard streams as plain pipes: os.File ends the
// child gets as they are, with no copying goroutine that a wait would
// wait for.
func pipes() (child, parent [3]*os.File, err error) {
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(child[:])
			closeAll(parent[:])
			return child, parent, err
		}
		if i == 0 {
			child[i], parent[i] = r, w
		} else {
			child[i], parent[i] = w, r
		}
	}
	return child, parent, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// liveSet tracks a runtime's prepared sandboxes, so that closing the
// runtime tears down whatever is still running, and refuses new ones after.
type liveSet struct {
	mu     sync.Mutex
	live   map[*sandbox]struct{}
	closed bool
}

// add registers sb; it fails once the runtime is closed.
func (l *liveSet) add(sb *sandbox) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	if l.live == nil {
		l.live = map[*sandbox]struct{}{}
	}
	l.live[sb] = struct{}{}
	return nil
}

func (l *liveSet) remove(sb *sandbox) {
	l.mu.Lock()
	delete(l.live, sb)
	l.mu.Unlock()
}

// closeAll marks the set closed and closes every sandbox still in it.
func (l *liveSet) closeAll() error {
	l.mu.Lock()
	l.closed = true
	live := make([]*sandbox, 0, len(l.live))
	for sb := range l.live {
		live = append(live, sb)
	}
	l.mu.Unlock()
	var errs []error
	for _, sb := range live {
		errs = append(errs, sb.Close())
	}
	return errors.Join(errs...)
}

// teardownOnce runs a sandbox's teardown once, under its own deadline, and
// remembers the outcome for later calls.
type teardownOnce struct {
	once sync.Once
	err  error
}

func (t *teardownOnce) do(what string, teardown func() error) error {
	t.once.Do(func() {
		done := make(chan error, 1)
		go func() { done <- teardown() }()
		select {
		case t.err = <-done:
		case <-time.After(teardownTimeout):
			t.err = fmt.Errorf("tearing down %s: timed out after %v", what, teardownTimeout)
		}
	})
	return t.err
}

// subvertInits makes the init of every call's sandbox play one the code
// subverted (initproto.Config.NoParentDeath): the watchdog's tests set it
// in a server of their own, nothing else.
var subvertInits atomic.Bool

// containerInit is the configuration of the init of a container: the
// bundle's, as it is.
func containerInit(b *bundle.Bundle) *initproto.Config {
	return &initproto.Config{Init: b.Init, NoParentDeath: subvertInits.Load() && !b.Config.Template}
}
