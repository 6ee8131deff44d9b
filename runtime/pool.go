package runtime

import (
	"context"
	"errors"
	"log/slog"
	goruntime "runtime"
	"slices"
	"sync"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
)

// A Pool keeps sandboxes prepared ahead — container made, cgroups and
// seccomp filter in place, the interpreter started and waiting for its
// code — so that a call pays only for running its code. Each sandbox is
// used for exactly one call and then destroyed; the pool makes new ones in
// the background. A prepared sandbox is the very same as a cold one: cold
// calls are prepared the same way, just on the call's time.
//
// Sizing: a fixed size keeps that many ready. Adaptive keeps as many as
// the most calls that ran at once in the last window, at least one and at
// most max, and shrinks to one after an idle window: an idle server holds
// one sandbox's memory, a busy one as many as it uses.

// refillAfter is how long a call that took a ready sandbox runs alone
// before the pool starts replacing it, if the call has not ended by then.
const refillAfter = 100 * time.Millisecond

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Runtime prepares the sandboxes, of Config: ahead of a call for the
	// pool (Config.Ahead), or for a call waiting now.
	Runtime Runtime
	Config  bundle.Config
	// Size is the fixed number of sandboxes kept ready; with Adaptive it
	// is the most.
	Size     int
	Adaptive bool
	// Spare is how many more the adaptive size keeps ready than its
	// peak while there were calls in the window: with sandboxes cheap to
	// make (forked ones), one more means a call that comes right after
	// another finds one ready.
	Spare int
	// Window is how far back the adaptive size looks; a minute when 0.
	Window time.Duration
	Logger *slog.Logger
}

// Pool is a set of prepared single-use sandboxes.
type Pool struct {
	cfg PoolConfig

	mu      sync.Mutex
	ready   []Sandbox
	filling int
	// waiting are calls that found none ready while some were being
	// prepared: each takes the next one to finish, which is sooner than
	// one it would start itself, and costs no second preparation. There
	// are never more than filling.
	waiting []chan Sandbox
	active  int         // calls that took a sandbox and are not done
	peaks   []peakEvent // recent concurrency, for the adaptive size
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	// parallel is how many sandboxes are prepared at once at most.
	parallel int
	// refillDelay is refillAfter, but for tests.
	refillDelay time.Duration
	// Preparations under way: Close cancels them and waits for them, so
	// that none outlives the pool (and makes a container in a runtime
	// being closed).
	preparing sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc
	stats     PoolStats
	// closing are the teardowns of used sandboxes under way, off their
	// calls' time: Close waits for them.
	closing sync.WaitGroup
}

type peakEvent struct {
	at time.Time
	n  int
}

// PoolStats counts what the pool did.
type PoolStats struct {
	Warm, Cold, Failed int64
}

// NewPool starts a pool and its filler.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, wake: make(chan struct{}, 1), done: make(chan struct{}), parallel: max(1, goruntime.NumCPU()), refillDelay: refillAfter}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.fill()
	p.poke()
	return p
}

// Run runs one call: on a sandbox prepared ahead, else the next of those
// being prepared, else one prepared now; either is used for this call
// only. It validates the request, once; a prepared sandbox found dead
// before the code started (killed from outside while it waited) gives way
// to a fresh one; and the sandbox is torn down after the call in the
// background, off the call's time, with or without sandboxes kept ready.
func (p *Pool) Run(ctx context.Context, req Request) (Result, error) {
	defer req.closeEgress()
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		sb, warm, done, err := p.Get(ctx)
		req.Phases.span(PhasePrepare, began, time.Now())
		if err != nil {
			return Result{}, err
		}
		res, err := runValid(ctx, sb, req)
		res.Pooled = warm
		done()
		p.closeTimed(sb, req.Phases)
		if warm && attempt == 0 && errors.Is(err, errNotStarted) && ctx.Err() == nil {
			p.cfg.Logger.Warn("a prepared sandbox was dead; preparing another", "err", err)
			continue
		}
		return res, err
	}
}

// closeLater tears a used sandbox down in the background.
func (p *Pool) closeLater(sb Sandbox) { p.closeTimed(sb, nil) }

// closeTimed is closeLater telling phases how long the teardown took.
func (p *Pool) closeTimed(sb Sandbox, phases PhaseFunc) {
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		began := time.Now()
		if err := sb.Close(); err != nil {
			p.cfg.Logger.Error("tearing down a sandbox", "err", err)
		}
		phases.span(PhaseTeardown, began, time.Now())
	}()
}

// Get returns a prepared sandbox: one ready, else the next of those being
// prepared, else one prepared now. warm says it was prepared ahead. The
// caller runs it once and closes it; done must be called when the call is
// over.
func (p *Pool) Get(ctx context.Context) (sb Sandbox, warm bool, done func(), err error) {
	p.mu.Lock()
	p.active++
	p.peaks = append(p.peaks, peakEvent{time.Now(), p.active})
	var wait chan Sandbox
	took := false
	if n := len(p.ready); n > 0 {
		sb = p.ready[n-1]
		p.ready = p.ready[:n-1]
		p.stats.Warm++
		took = true
	} else if p.filling > len(p.waiting) && !p.closed {
		wait = make(chan Sandbox, 1)
		p.waiting = append(p.waiting, wait)
	}
	p.mu.Unlock()
	if took {
		// Preparing the replacement costs several times the CPU of a short
		// call: started now, it would slow this call down. It starts when
		// the call ends (done), or after refillAfter for a longer call.
		time.AfterFunc(p.refillDelay, p.poke)
	} else {
		p.poke()
	}
	done = func() {
		p.mu.Lock()
		p.active--
		p.mu.Unlock()
		// Started here, not by the filler later: a call that comes right
		// after this one finds the replacement under way and waits for it
		// rather than preparing a second.
		p.topUp()
	}
	if wait != nil {
		select {
		case sb = <-wait:
		case <-ctx.Done():
			p.mu.Lock()
			if i := slices.Index(p.waiting, wait); i >= 0 {
				p.waiting = slices.Delete(p.waiting, i, i+1)
			} else if sb = <-wait; sb != nil && !p.closed {
				// Handed over as we gave up: it stays ready for another.
				p.ready = append(p.ready, sb)
				sb = nil
			}
			p.mu.Unlock()
			if sb != nil {
				sb.Close()
			}
			done()
			return nil, false, nil, ctx.Err()
		}
	}
	if sb != nil {
		if wait != nil {
			p.mu.Lock()
			p.stats.Warm++
			p.mu.Unlock()
		}
		return sb, true, done, nil
	}
	p.mu.Lock()
	p.stats.Cold++
	p.mu.Unlock()
	sb, err = p.prepare(ctx, false)
	if err != nil {
		done()
		return nil, false, nil, err
	}
	return sb, false, done, nil
}

// prepare makes one sandbox ready for a call: ahead of it, or for a call
// waiting now.
func (p *Pool) prepare(ctx context.Context, ahead bool) (Sandbox, error) {
	cfg := p.cfg.Config
	cfg.Ahead = ahead
	return p.cfg.Runtime.Prepare(ctx, cfg)
}

// Stats reports how many calls found a sandbox ready, and how many ready.
func (p *Pool) Stats() (PoolStats, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats, len(p.ready)
}

// target is how many sandboxes the pool wants ready now.
func (p *Pool) target(now time.Time) int {
	if !p.cfg.Adaptive {
		return p.cfg.Size
	}
	peak := 1
	keep := p.peaks[:0]
	for _, e := range p.peaks {
		if now.Sub(e.at) <= p.cfg.Window {
			keep = append(keep, e)
			peak = max(peak, e.n)
		}
	}
	p.peaks = keep
	spare := 0
	if len(keep) > 0 {
		spare = p.cfg.Spare // not when idle: an idle server holds one
	}
	return min(max(peak, 1), p.cfg.Size) + spare
}

func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fill keeps the ready set at its target: it prepares sandboxes, at most
// as many at once as there are CPUs, and destroys those over the target.
func (p *Pool) fill() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.Window / 4)
	defer tick.Stop()
	for {
		select {
		case <-p.wake:
		case <-tick.C:
		}
		if !p.topUp() {
			return
		}
	}
}

// topUp starts preparing what the ready set lacks, at most as many at once
// as there are CPUs, and destroys what it holds over the target. It
// reports false once the pool is closed.
func (p *Pool) topUp() bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	want := p.target(time.Now())
	var extra []Sandbox
	for len(p.ready) > want {
		extra = append(extra, p.ready[0])
		p.ready = p.ready[1:]
	}
	start := 0
	for len(p.ready)+p.filling+start < want && p.filling+start < p.parallel {
		start++
	}
	p.filling += start
	p.preparing.Add(start)
	p.mu.Unlock()
	for _, sb := range extra {
		go sb.Close()
	}
	for range start {
		go p.prepareOne()
	}
	return true
}

func (p *Pool) prepareOne() {
	defer p.preparing.Done()
	sb, err := p.prepare(p.ctx, true)
	p.mu.Lock()
	p.filling--
	if err != nil && p.closed {
		p.mu.Unlock()
		return // cancelled by Close
	}
	if err != nil {
		p.stats.Failed++
		// A waiter this preparation would have served prepares its own.
		if n := len(p.waiting); n > p.filling {
			p.waiting[n-1] <- nil
			p.waiting = p.waiting[:n-1]
		}
		p.mu.Unlock()
		p.cfg.Logger.Warn("preparing a sandbox for the pool", "err", err)
		// No tight loop on a broken host: the next call tries cold, and
		// the tick tries again.
		return
	}
	if len(p.waiting) > 0 {
		w := p.waiting[0]
		p.waiting = p.waiting[1:]
		w <- sb
		p.mu.Unlock()
		p.poke()
		return
	}
	if p.closed {
		p.mu.Unlock()
		sb.Close()
		return
	}
	p.ready = append(p.ready, sb)
	n := len(p.ready)
	p.mu.Unlock()
	p.cfg.Logger.Debug("sandbox prepared ahead", "ready", n)
	p.poke()
}

// Close destroys the ready sandboxes, stops the filler and cancels the
// preparations under way; it returns once they are gone, so the runtime
// can be closed after it with nothing of the pool's left in it.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	// Waiters prepare their own (and fail: the runtime is closing).
	for _, w := range p.waiting {
		w <- nil
	}
	p.waiting = nil
	p.mu.Unlock()
	p.cancel()
	p.poke()
	<-p.done
	for _, sb := range ready {
		sb.Close()
	}
	p.preparing.Wait()
	p.closing.Wait()
}
