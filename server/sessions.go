package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/inhuman/mcp-exec/runtime"
)

// Persistent sessions: a sandbox held for one caller between calls, named
// by a handle the server made and only the caller was told. The handle is
// the whole of the access control (as a bearer token is): it is 128 random
// bits, never logged (the audit log has a digest of it), and it names a
// session of this server only.

// Session is a persistent session's sandbox: runtime.Session.
type Session interface {
	Run(ctx context.Context, req runtime.Request) (runtime.Result, error)
	// Done is closed once the sandbox has ended, on its own or closed.
	Done() <-chan struct{}
	// Ended says why it ended on its own; "" while it lives.
	Ended() runtime.EndReason
	Close() error
}

// Why a session ends, beyond the runtime's reasons (timeout, oom, exited).
const (
	endClosed   = "closed"
	endIdle     = "idle"
	endLifetime = "lifetime"
	endShutdown = "shutdown"
)

// handlePrefix starts every handle, so that one is told apart from other
// strings at a glance.
const handlePrefix = "ps_"

var handleRE = regexp.MustCompile(`^ps_[0-9a-f]{32}$`)

func newHandle() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return handlePrefix + hex.EncodeToString(b[:])
}

// sessionID names a session in logs and the audit log without giving its
// handle away.
func sessionID(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return hex.EncodeToString(sum[:8])
}

// rememberEnded is how many ended handles the server remembers, to say why
// they ended.
const rememberEnded = 4096

// sessions are the persistent sessions of a Server.
type sessions struct {
	srv *Server

	mu        sync.Mutex
	live      map[string]*held
	opening   int            // "new" calls making their sandbox
	openingBy map[string]int // of them, by owner
	ended     map[string]string
	order     []string // ended handles, oldest first
	closed    bool
}

// held is one live session.
type held struct {
	handle, id string
	sess       Session
	client     string // for the log and audit log
	owner      string // the client it counts against (PersistentPerClient)
	created    time.Time

	mu       sync.Mutex
	busy     bool
	queue    []chan struct{} // calls waiting for their turn, in arrival order
	ended    string
	expired  string // the lifetime passed during a call: end after it
	idle     *time.Timer
	lifetime *time.Timer
}

func newSessions(s *Server) *sessions {
	return &sessions{srv: s, live: map[string]*held{}, openingBy: map[string]int{}, ended: map[string]string{}}
}

// reserve makes room for a new session of owner (the client it counts
// against; "" when none is known), or says why there is none.
func (ss *sessions) reserve(owner string) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	o := ss.srv.opts
	switch n := ss.owned(owner); {
	case ss.closed:
		return errors.New("the server is shutting down")
	case len(ss.live)+ss.opening >= o.PersistentMax:
		return fmt.Errorf("session: %d persistent sessions are open, the most allowed (MCP_EXEC_PERSISTENT_MAX=%d); end one with end_session, or call without session", len(ss.live)+ss.opening, o.PersistentMax)
	case owner != "" && n >= o.perClient():
		return fmt.Errorf("session: this client holds %d persistent sessions, the most one client may (MCP_EXEC_PERSISTENT_PER_CLIENT=%d); end one with end_session, or call without session", n, o.perClient())
	}
	ss.opening++
	ss.openingBy[owner]++
	return nil
}

// owned counts the sessions owner holds or is opening. ss.mu is held.
func (ss *sessions) owned(owner string) int {
	n := ss.openingBy[owner]
	for _, h := range ss.live {
		if h.owner == owner {
			n++
		}
	}
	return n
}

// opened ends owner's reservation. ss.mu is held.
func (ss *sessions) opened(owner string) {
	ss.opening--
	if ss.openingBy[owner]--; ss.openingBy[owner] <= 0 {
		delete(ss.openingBy, owner)
	}
}

// open registers a new session's sandbox, made after owner's reserve.
func (ss *sessions) open(sess Session, client, owner string) (*held, error) {
	o := ss.srv.opts
	h := &held{handle: newHandle(), sess: sess, client: client, owner: owner, created: time.Now()}
	h.id = sessionID(h.handle)
	ss.mu.Lock()
	ss.opened(owner)
	if ss.closed {
		ss.mu.Unlock()
		sess.Close()
		return nil, fmt.Errorf("%w: the server is shutting down", runtime.ErrSandbox)
	}
	ss.live[h.handle] = h
	ss.mu.Unlock()
	h.mu.Lock()
	h.busy = true // the call that made it runs first
	h.idle = time.AfterFunc(o.PersistentIdle, func() { ss.expire(h, endIdle) })
	h.idle.Stop()
	h.lifetime = time.AfterFunc(o.PersistentLifetime, func() { ss.expire(h, endLifetime) })
	h.mu.Unlock()
	go func() {
		<-sess.Done()
		if r := sess.Ended(); r != "" {
			ss.end(h, string(r))
		}
	}()
	ss.srv.auditSession(h, "session_start", "")
	ss.srv.log.Info("persistent session started", "session", h.id, "client", client)
	return h, nil
}

// unreserve gives back owner's reservation whose sandbox could not be
// made.
func (ss *sessions) unreserve(owner string) {
	ss.mu.Lock()
	ss.opened(owner)
	ss.mu.Unlock()
}

// lookup finds a live session by its handle, or says why there is none.
func (ss *sessions) lookup(handle string) (*held, error) {
	if !handleRE.MatchString(handle) {
		return nil, fmt.Errorf(`session: %q is not a session handle: give "new" to start a persistent session, or the session an earlier result returned`, clip(handle, 64))
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if h, ok := ss.live[handle]; ok {
		return h, nil
	}
	if why, ok := ss.ended[handle]; ok {
		return nil, fmt.Errorf("session: that persistent session has ended (%s); start another with session \"new\"", describeEnd(why, ss.srv.opts))
	}
	msg := "session: no persistent session of that handle on this server; start one with session \"new\""
	if ss.srv.opts.Stateless || ss.srv.opts.Transport != Stdio {
		msg += ". A session lives on the server that made it: behind a load balancer, route a session's calls to one replica (docs/deployment.md), or this one answers instead"
	}
	return nil, errors.New(msg)
}

// turn waits for h's calls before this one, in arrival order; the wait
// counts against MaxQueued. release must follow a nil error.
func (ss *sessions) turn(ctx context.Context, h *held) error {
	h.mu.Lock()
	if h.ended != "" {
		why := h.ended
		h.mu.Unlock()
		return fmt.Errorf("session: that persistent session has ended (%s)", describeEnd(why, ss.srv.opts))
	}
	if !h.busy {
		h.busy = true
		h.idle.Stop()
		h.mu.Unlock()
		return nil
	}
	s := ss.srv
	if n := s.waiting.Add(1); n > int64(s.opts.MaxQueued) {
		s.waiting.Add(-1)
		h.mu.Unlock()
		return fmt.Errorf("%w: %d calls are waiting already, the most allowed (MCP_EXEC_MAX_QUEUED=%d); try again later", errBusy, n-1, s.opts.MaxQueued)
	}
	defer s.waiting.Add(-1)
	ch := make(chan struct{})
	h.queue = append(h.queue, ch)
	h.mu.Unlock()
	select {
	case <-ch:
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.ended != "" {
			ss.passTurn(h)
			return fmt.Errorf("session: that persistent session has ended (%s)", describeEnd(h.ended, ss.srv.opts))
		}
		return nil
	case <-ctx.Done():
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, c := range h.queue {
			if c == ch {
				h.queue = append(h.queue[:i], h.queue[i+1:]...)
				return ctx.Err()
			}
		}
		// The turn came as the call was cancelled: hand it on.
		ss.passTurn(h)
		return ctx.Err()
	}
}

// passTurn gives the turn to the next waiting call, or frees it. h.mu is
// held.
func (ss *sessions) passTurn(h *held) {
	if len(h.queue) > 0 {
		next := h.queue[0]
		h.queue = h.queue[1:]
		close(next)
		return
	}
	h.busy = false
	if h.ended == "" {
		h.idle.Reset(ss.srv.opts.PersistentIdle)
	}
}

// release ends a call's turn; ended, when not "", ends the session.
func (ss *sessions) release(h *held, ended string) {
	h.mu.Lock()
	if ended == "" {
		ended = h.expired
	}
	h.mu.Unlock()
	if ended != "" {
		ss.end(h, ended)
	}
	h.mu.Lock()
	ss.passTurn(h)
	h.mu.Unlock()
}

// expire ends an idle session, or one past its lifetime; a call under way
// finishes first.
func (ss *sessions) expire(h *held, why string) {
	h.mu.Lock()
	if h.busy {
		if why == endLifetime {
			h.expired = why
		}
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	ss.end(h, why)
}

// end ends a session once, for why: its sandbox is torn down, its handle
// remembered with the reason.
func (ss *sessions) end(h *held, why string) {
	h.mu.Lock()
	if h.ended != "" {
		h.mu.Unlock()
		return
	}
	h.ended = why
	h.idle.Stop()
	h.lifetime.Stop()
	h.mu.Unlock()

	ss.mu.Lock()
	delete(ss.live, h.handle)
	ss.ended[h.handle] = why
	ss.order = append(ss.order, h.handle)
	if len(ss.order) > rememberEnded {
		delete(ss.ended, ss.order[0])
		ss.order = ss.order[1:]
	}
	ss.mu.Unlock()

	if err := h.sess.Close(); err != nil {
		ss.srv.log.Error("tearing down a persistent session", "session", h.id, "err", err)
	}
	ss.srv.auditSession(h, "session_end", why)
	ss.srv.log.Info("persistent session ended", "session", h.id, "why", why, "lived", time.Since(h.created).Round(time.Millisecond))
}

// closeAll ends every session (the server is shutting down) and refuses
// new ones.
func (ss *sessions) closeAll() {
	ss.mu.Lock()
	ss.closed = true
	live := make([]*held, 0, len(ss.live))
	for _, h := range ss.live {
		live = append(live, h)
	}
	ss.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range live {
		wg.Go(func() { ss.end(h, endShutdown) })
	}
	wg.Wait()
}

// describeEnd says what an end reason means.
func describeEnd(why string, o Options) string {
	switch why {
	case endClosed:
		return "closed: a call ended it with end_session"
	case endIdle:
		return fmt.Sprintf("idle: no call for %s s (MCP_EXEC_PERSISTENT_IDLE_S)", fmtSeconds(o.PersistentIdle))
	case endLifetime:
		return fmt.Sprintf("lifetime: it was open for %s s, the most (MCP_EXEC_PERSISTENT_LIFETIME_S)", fmtSeconds(o.PersistentLifetime))
	case endShutdown:
		return "shutdown: the server stopped"
	case string(runtime.EndTimeout):
		return "timeout: a call was still running a second after its KeyboardInterrupt, and the sandbox was killed"
	case string(runtime.EndOOM):
		return "oom: the memory or process limit was hit"
	case string(runtime.EndExited):
		return "exited: the interpreter ended (sys.exit or a crash)"
	}
	return why
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
