package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
)

// The pool's bookkeeping, on sandboxes that are only tokens (the sandbox
// properties of pooled sandboxes are tested on real ones in the harness).

type tokenSandbox struct {
	id     int
	closed atomic.Bool
}

func (s *tokenSandbox) Run(context.Context, Request) (Result, error) { return Result{}, nil }
func (s *tokenSandbox) Close() error                                 { s.closed.Store(true); return nil }

// gatedPrepare prepares sandbox n once release(n, err) is called.
type gatedPrepare struct {
	mu      sync.Mutex
	calls   int
	gates   map[int]chan error
	started chan int
	// inFlight counts preparations that have not returned.
	inFlight atomic.Int32
}

func newGatedPrepare() *gatedPrepare {
	return &gatedPrepare{started: make(chan int, 16), gates: map[int]chan error{}}
}

func (g *gatedPrepare) gate(n int) chan error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[n] == nil {
		g.gates[n] = make(chan error, 1)
	}
	return g.gates[n]
}

func (g *gatedPrepare) release(n int, err error) { g.gate(n) <- err }

// gatedPrepare is the pool's runtime.
func (g *gatedPrepare) Kind() Kind   { return "token" }
func (g *gatedPrepare) Close() error { return nil }

func (g *gatedPrepare) Prepare(ctx context.Context, _ bundle.Config) (Sandbox, error) {
	g.mu.Lock()
	g.calls++
	n := g.calls
	g.mu.Unlock()
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	g.started <- n
	select {
	case err := <-g.gate(n):
		if err != nil {
			return nil, err
		}
		return &tokenSandbox{id: n}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *gatedPrepare) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

func waitStarted(t *testing.T, g *gatedPrepare, want int) {
	t.Helper()
	select {
	case n := <-g.started:
		if n != want {
			t.Fatalf("preparation %d started, want %d", n, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("preparation %d never started", want)
	}
}

// waitWaiting waits until n calls wait for a preparation.
func waitWaiting(t *testing.T, p *Pool, n int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%d calls to wait for a preparation", n), func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.waiting) == n
	})
}

type got struct {
	sb   Sandbox
	warm bool
	err  error
}

func getAsync(p *Pool, ctx context.Context) chan got {
	ch := make(chan got, 1)
	go func() {
		sb, warm, done, err := p.Get(ctx)
		if done != nil {
			done()
		}
		ch <- got{sb, warm, err}
	}()
	return ch
}

// A call that finds none ready while one is being prepared takes that one
// when it is done, rather than start a second preparation.
func TestPoolCallWaitsForPreparation(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	defer p.Close()
	waitStarted(t, g, 1)
	res := getAsync(p, context.Background())
	waitWaiting(t, p, 1)
	g.release(1, nil)
	r := <-res
	if r.err != nil || !r.warm || r.sb.(*tokenSandbox).id != 1 {
		t.Fatalf("Get = %+v, want sandbox 1, warm", r)
	}
	// The refill is the second preparation; none other started.
	waitStarted(t, g, 2)
	if n := g.count(); n != 2 {
		t.Errorf("%d preparations, want 2 (the first served the call, the second refills)", n)
	}
	g.release(2, nil)
}

// When the preparation a call waits for fails, the call prepares its own.
func TestPoolWaiterPreparesWhenPreparationFails(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	defer p.Close()
	waitStarted(t, g, 1)
	res := getAsync(p, context.Background())
	waitWaiting(t, p, 1)
	g.release(1, errors.New("broken host"))
	waitStarted(t, g, 2) // the call's own
	g.release(2, nil)
	r := <-res
	if r.err != nil || r.sb == nil || r.warm {
		t.Fatalf("Get = %+v, want a sandbox prepared for the call (cold)", r)
	}
}

// A waiting call that is cancelled returns at once; the sandbox it waited
// for stays ready for the next call.
func TestPoolWaiterCancelled(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	defer p.Close()
	waitStarted(t, g, 1)
	ctx, cancel := context.WithCancel(context.Background())
	res := getAsync(p, ctx)
	waitWaiting(t, p, 1)
	cancel()
	if r := <-res; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Get = %+v, want context.Canceled", r)
	}
	g.release(1, nil)
	waitReady(t, p, 1)
	sb, warm, done, err := p.Get(context.Background())
	if err != nil || !warm || sb.(*tokenSandbox).id != 1 {
		t.Fatalf("Get = %v %v %v, want sandbox 1, warm", sb, warm, err)
	}
	done()
}

// Close ends a waiting call and destroys what was ready.
func TestPoolCloseEndsWaiters(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	waitStarted(t, g, 1)
	res := getAsync(p, context.Background())
	waitWaiting(t, p, 1)
	go p.Close()
	// The waiter falls back to preparing its own, as a call on a closed
	// runtime would, and fails there.
	waitStarted(t, g, 2)
	g.release(2, errors.New("runtime is closed"))
	if r := <-res; r.err == nil {
		t.Fatalf("Get after Close = %+v, want an error", r)
	}
	g.release(1, nil) // the first preparation ends; Close destroys it
}

// A call that took a ready sandbox has its replacement started when it
// ends — before done returns, so a call right after it waits for that one
// rather than preparing its own — or, if it runs long, while it runs.
func TestPoolRefillsAfterTheCall(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	defer p.Close()
	waitStarted(t, g, 1)
	g.release(1, nil)
	waitReady(t, p, 1)

	p.mu.Lock()
	p.refillDelay = time.Hour
	p.mu.Unlock()
	sb, warm, done, err := p.Get(context.Background())
	if err != nil || !warm || sb.(*tokenSandbox).id != 1 {
		t.Fatalf("Get = %v, %v, %v; want sandbox 1, warm", sb, warm, err)
	}
	done()
	p.mu.Lock()
	filling := p.filling
	p.mu.Unlock()
	if filling != 1 {
		t.Fatalf("after the call: %d being prepared, want 1", filling)
	}
	next := getAsync(p, context.Background())
	waitWaiting(t, p, 1)
	waitStarted(t, g, 2)
	g.release(2, nil)
	if r := <-next; r.err != nil || !r.warm || r.sb.(*tokenSandbox).id != 2 {
		t.Fatalf("the next call got %+v, want the replacement (2), warm", r)
	}
	waitStarted(t, g, 3)
	g.release(3, nil)
	waitReady(t, p, 1)

	// A long call: its replacement starts while it runs.
	p.mu.Lock()
	p.refillDelay = time.Millisecond
	p.mu.Unlock()
	_, _, done, err = p.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	waitStarted(t, g, 4)
	g.release(4, nil)
}

// waitReady waits until n sandboxes are ready.
func waitReady(t *testing.T, p *Pool, n int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%d sandboxes to be ready", n), func() bool {
		_, r := p.Stats()
		return r == n
	})
}

// Close cancels a preparation under way and returns only once it has
// returned: the runtime is closed right after the pool, and a preparation
// still running then would make a container in it.
func TestPoolCloseWaitsForPreparations(t *testing.T) {
	g := newGatedPrepare()
	p := NewPool(PoolConfig{Size: 1, Runtime: g})
	waitStarted(t, g, 1)
	p.Close()
	if n := g.inFlight.Load(); n != 0 {
		t.Fatalf("%d preparations still running after Close", n)
	}
	if st, _ := p.Stats(); st.Failed != 0 {
		t.Errorf("a preparation cancelled by Close counted as failed: %+v", st)
	}
}

// The adaptive size keeps its spare only while calls came in the window:
// an idle server holds one sandbox, a used one one more than its peak.
func TestPoolSpareOnlyWhileUsed(t *testing.T) {
	p := &Pool{cfg: PoolConfig{Size: 4, Adaptive: true, Spare: 1, Window: time.Minute}}
	now := time.Now()
	if got := p.target(now); got != 1 {
		t.Errorf("idle: target %d, want 1", got)
	}
	p.peaks = []peakEvent{{now.Add(-time.Second), 2}}
	if got := p.target(now); got != 3 {
		t.Errorf("after 2 calls at once: target %d, want 3", got)
	}
	if got := p.target(now.Add(2 * time.Minute)); got != 1 {
		t.Errorf("a window after: target %d, want 1", got)
	}
}
