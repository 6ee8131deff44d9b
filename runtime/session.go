package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
)

// A Session is one sandbox kept for a sequence of calls, one at a time: a
// persistent session. Its interpreter, the code's variables, imports,
// working directory and /tmp stay from one call to the next; everything
// else is as for a single call: the same container, limits and verdicts,
// held for the session's whole life. A call that hits the memory or
// process limit, times out past its interrupt, or ends the interpreter
// ends the session (Result.Ended).
//
// Between its calls a session's sandbox is frozen: its threads and
// processes, and a call's code that made the init believe the call was
// over, run only while a call runs, counted by the caller's concurrency
// (SessionConfig.Background says otherwise).
type Session struct {
	sb         *sandbox
	background bool
	parkAfter  time.Duration
	log        *slog.Logger

	mu    sync.Mutex // one call at a time
	ended SessionEnd
	park  *time.Timer // parks the frozen sandbox once it has been idle parkAfter
	// parkFailed counts the parks of this idle spell that failed.
	parkFailed int
	// detail says in words why, when the reason's usual meaning does not:
	// a session the runtime ended for running while frozen is exited,
	// but not by its code.
	detail string
}

// ErrSessionEnded is the error of a call to a session that has ended.
var ErrSessionEnded = errors.New("the session has ended")

// EndedError says why a session can take no call.
type EndedError struct {
	Reason SessionEnd
	// Detail says what happened when Reason alone would mislead; else "".
	Detail string
}

func (e *EndedError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("%v (%s: %s)", ErrSessionEnded, e.Reason, e.Detail)
	}
	return fmt.Sprintf("%v (%s)", ErrSessionEnded, e.Reason)
}
func (e *EndedError) Unwrap() error { return ErrSessionEnded }

// detailer is a container that can say why it ended when the reason's
// usual meaning would mislead.
type detailer interface{ endDetail() string }

// SessionConfig configures a persistent session.
type SessionConfig struct {
	// Background lets what the code started (threads, processes) run on
	// between calls, as a notebook's kernel does; each such session may
	// then use its CPU quota at any time. By default the sandbox is frozen
	// between calls.
	Background bool
	// Park: a frozen session idle this long is parked, saved to disk with
	// its processes ended, and restored by its next call (park.go), where
	// the runtime can (runsc); 0 never.
	Park time.Duration
	// Logger hears of parks that failed (the session stays frozen); nil
	// discards.
	Logger *slog.Logger
}

// NewSession starts a session on a sandbox of the pool: one prepared
// ahead, else one prepared now. Unless cfg.Background, the sandbox is
// frozen until the first call: one that cannot be frozen is refused here,
// before it ran anything.
func (p *Pool) NewSession(ctx context.Context, cfg SessionConfig) (*Session, error) {
	var sb Sandbox
	if sp, ok := sessionPreparerOf(p.cfg.Runtime); ok {
		// Its calls' sandboxes may not hold a session as it should be
		// held: one made for it, then.
		var err error
		if sb, err = sp.PrepareSession(ctx, p.cfg.Config); err != nil {
			return nil, err
		}
	}
	if sb == nil {
		var done func()
		var err error
		if sb, _, done, err = p.Get(ctx); err != nil {
			return nil, err
		}
		done()
	}
	s, ok := sb.(*sandbox)
	if !ok {
		p.closeLater(sb)
		return nil, fmt.Errorf("%w: this runtime's sandboxes cannot hold a session", ErrSandbox)
	}
	if !cfg.Background {
		if err := s.freeze(); err != nil {
			p.closeLater(sb)
			return nil, fmt.Errorf("%w: %w; without a freezer, sessions can only run between their calls ({PersistentBackground})", ErrSandbox, err)
		}
	}
	sess := &Session{sb: s, background: cfg.Background, parkAfter: cfg.Park, log: cfg.Logger}
	if sess.log == nil {
		sess.log = slog.New(slog.DiscardHandler)
	}
	sess.mu.Lock()
	sess.armPark()
	sess.mu.Unlock()
	return sess, nil
}

// SessionPreparer is a runtime whose persistent sessions take a sandbox
// of another kind than its calls: runsc's forks (runsc_fork.go) share a
// template's gVisor sandbox, which cannot be parked on its own, so a
// session gets a gVisor sandbox of its own, as without forking. A nil
// sandbox (and no error): the pool's serve sessions too.
type SessionPreparer interface {
	PrepareSession(ctx context.Context, cfg bundle.Config) (Sandbox, error)
}

// sessionPreparerOf finds a SessionPreparer in rt, or in what rt wraps
// (Unwrap).
func sessionPreparerOf(rt Runtime) (SessionPreparer, bool) {
	for rt != nil {
		if sp, ok := rt.(SessionPreparer); ok {
			return sp, true
		}
		u, ok := rt.(interface{ Unwrap() Runtime })
		if !ok {
			return nil, false
		}
		rt = u.Unwrap()
	}
	return nil, false
}

// armPark parks the session once it has been frozen parkAfter, if its
// sandbox can be parked at all. s.mu is held.
func (s *Session) armPark() {
	if s.parkAfter <= 0 || s.background {
		return
	}
	if _, ok := s.sb.c.(parker); !ok {
		return
	}
	s.parkFailed = 0
	s.park = time.AfterFunc(s.parkAfter, s.parkIdle)
}

// parkRetries is how many times a park that failed is tried again, each
// after twice the wait of the one before: a checkpoint can fail for a
// while (a host under heavy load), and a session left frozen holds its
// memory until its next call, which may never come.
const parkRetries = 3

// parkIdle parks the sandbox, unless a call came meanwhile (it holds
// s.mu, or took the timer away).
func (s *Session) parkIdle() {
	if !s.mu.TryLock() {
		return // a call runs; it arms the timer again when it ends
	}
	defer s.mu.Unlock()
	if s.park == nil || s.ended != "" {
		return
	}
	s.park = nil
	if _, err := s.sb.park(); err != nil {
		if s.parkFailed < parkRetries {
			s.parkFailed++
			again := s.parkAfter << s.parkFailed
			s.log.Warn("a persistent session could not be parked; it stays frozen until it is tried again", "sandbox", s.sb.id, "err", err, "again_in", again)
			s.park = time.AfterFunc(again, s.parkIdle)
			return
		}
		s.log.Warn("a persistent session could not be parked; it stays frozen", "sandbox", s.sb.id, "err", err, "tries", s.parkFailed+1)
	}
}

// disarmPark stops the park timer. s.mu is held.
func (s *Session) disarmPark() {
	if s.park != nil {
		s.park.Stop()
		s.park = nil
	}
}

// Parked says whether the session is parked (saved to disk, nothing of it
// in memory).
func (s *Session) Parked() bool { return s.sb.status() == parked }

// Run runs one call in the session. A session whose sandbox ended between
// calls (its interpreter exited, or the memory limit killed it) gives an
// *EndedError.
func (s *Session) Run(ctx context.Context, req Request) (Result, error) {
	defer req.closeEgress()
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	req.Persistent = true
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disarmPark()
	if s.check() != "" {
		return Result{}, &EndedError{s.ended, s.detail}
	}
	res, err := s.sb.run(ctx, req)
	if errors.Is(err, errNotStarted) {
		// It died between calls, and this one never started.
		s.ended = s.endedAlone()
		return Result{}, &EndedError{s.ended, s.detail}
	}
	s.ended = res.Ended
	if res.Ended == "" && !s.background && s.sb.status() == ready {
		// Nothing of it runs until the next call: not a thread it left,
		// nor code that told the init the call was over and ran on.
		if ferr := s.sb.freeze(); ferr != nil {
			s.ended, res.Ended = EndExited, EndExited
			s.detail = "killed by the server: its processes could not all be stopped between calls"
			res.EndDetail = s.detail
			err = errors.Join(err, ferr)
		} else {
			s.armPark()
		}
	}
	return res, err
}

// endedAlone is why a session's sandbox ended between calls; it notes
// the detail a container gives.
func (s *Session) endedAlone() SessionEnd {
	var res Result
	s.sb.c.verdict(&res)
	if d, ok := s.sb.c.(detailer); ok && s.detail == "" {
		s.detail = d.endDetail()
	}
	if res.OOMKilled || res.PidsLimitHit {
		return EndOOM
	}
	return EndExited
}

// EndDetail says in words why the session ended, when its reason alone
// would mislead (a session the server killed for running while frozen is
// exited, but not by its code); "" otherwise, and while it lives.
func (s *Session) EndDetail() string {
	if !s.mu.TryLock() {
		return ""
	}
	defer s.mu.Unlock()
	s.check()
	return s.detail
}

// Done is closed once the session's sandbox has ended on its own or been
// closed.
func (s *Session) Done() <-chan struct{} { return s.sb.done }

// Ended says why the session ended; "" while it lives.
func (s *Session) Ended() SessionEnd {
	if !s.mu.TryLock() {
		return "" // a call runs: it will say
	}
	defer s.mu.Unlock()
	return s.check()
}

// check notes an end between calls, and returns why the session ended
// ("": it lives). s.mu is held.
func (s *Session) check() SessionEnd {
	if s.ended == "" {
		select {
		case <-s.sb.done:
			s.ended = s.endedAlone()
		default:
		}
	}
	return s.ended
}

// Close tears the session's sandbox down; it is safe to call more than
// once and while a call runs (which it kills).
func (s *Session) Close() error {
	if s.mu.TryLock() {
		s.disarmPark()
		s.mu.Unlock()
	}
	return s.sb.Close()
}
