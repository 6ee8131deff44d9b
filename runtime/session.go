package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// A Session is one sandbox kept for a sequence of calls, one at a time: a
// persistent session. Its interpreter, the code's variables, imports,
// working directory and /tmp stay from one call to the next; everything
// else is as for a single call: the same container, limits and verdicts,
// held for the session's whole life. A call that hits the memory or
// process limit, times out past its interrupt, or ends the interpreter
// ends the session (Result.Ended).
type Session struct {
	sb *sandbox

	mu    sync.Mutex // one call at a time
	ended EndReason
}

// ErrSessionEnded is the error of a call to a session that has ended.
var ErrSessionEnded = errors.New("the session has ended")

// EndedError says why a session can take no call.
type EndedError struct{ Reason EndReason }

func (e *EndedError) Error() string { return fmt.Sprintf("%v (%s)", ErrSessionEnded, e.Reason) }
func (e *EndedError) Unwrap() error { return ErrSessionEnded }

// NewSession starts a session on a sandbox of the pool: one prepared
// ahead, else one prepared now.
func (p *Pool) NewSession(ctx context.Context) (*Session, error) {
	sb, _, done, err := p.Get(ctx)
	if err != nil {
		return nil, err
	}
	done()
	s, ok := sb.(*sandbox)
	if !ok {
		p.closeLater(sb)
		return nil, fmt.Errorf("%w: this runtime's sandboxes cannot hold a session", ErrSandbox)
	}
	return &Session{sb: s}, nil
}

// Run runs one call in the session. A session whose sandbox ended between
// calls (its interpreter exited, or the memory limit killed it) gives an
// *EndedError.
func (s *Session) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	req.Persistent = true
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.check() != "" {
		return Result{}, &EndedError{s.ended}
	}
	res, err := s.sb.run(ctx, req)
	if errors.Is(err, errNotStarted) {
		// It died between calls, and this one never started.
		s.ended = s.endedAlone()
		return Result{}, &EndedError{s.ended}
	}
	s.ended = res.Ended
	return res, err
}

// endedAlone is why a session's sandbox ended between calls.
func (s *Session) endedAlone() EndReason {
	var res Result
	s.sb.c.verdict(&res)
	if res.OOMKilled || res.PidsLimitHit {
		return EndOOM
	}
	return EndExited
}

// Done is closed once the session's sandbox has ended on its own or been
// closed.
func (s *Session) Done() <-chan struct{} { return s.sb.done }

// Ended says why the session ended; "" while it lives.
func (s *Session) Ended() EndReason {
	if !s.mu.TryLock() {
		return "" // a call runs: it will say
	}
	defer s.mu.Unlock()
	return s.check()
}

// check notes an end between calls, and returns why the session ended
// ("": it lives). s.mu is held.
func (s *Session) check() EndReason {
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
func (s *Session) Close() error { return s.sb.Close() }
