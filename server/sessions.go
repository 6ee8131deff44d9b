package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inhuman/mcp-exec/runtime"
	"github.com/modelcontextprotocol/go-sdk/mcp"
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
	Ended() runtime.SessionEnd
	// EndDetail says in words what ended it when the reason alone would
	// mislead; "" otherwise.
	EndDetail() string
	Close() error
}

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

	mu       sync.Mutex
	live     map[string]*held // by handle: opening, idle, busy or ending
	watching map[*mcp.ServerSession]bool
	ended    map[string]endedAs
	order    []string // ended handles, oldest first
	closed   bool
}

// heldState is where a persistent session is in its life. Every change
// goes through move, which refuses what cannot happen.
type heldState int

const (
	// opening: reserved by a "new" call, its sandbox being made.
	opening heldState = iota
	// idle: between calls (frozen); its idle timer runs.
	idle
	// busy: a call has its turn; later calls queue.
	busy
	// ending: past its lifetime during a call; it ends when the call does.
	ending
	// ended: gone, its sandbox torn down; its handle names why.
	ended
)

var heldMoves = map[heldState][]heldState{
	opening: {busy, ended},
	idle:    {busy, ended},
	busy:    {idle, ending, ended},
	ending:  {ended},
}

// held is one persistent session, from its reservation to its end.
type held struct {
	handle, id string
	client     string             // for the log and audit log
	owner      *mcp.ServerSession // the client it counts against and lives no longer than; nil when none is known
	created    time.Time
	sess       Session // nil while opening

	mu       sync.Mutex
	state    heldState
	why      runtime.SessionEnd // why it ended (ended)
	detail   string             // and in words, when why alone would mislead
	queue    []chan struct{}    // calls waiting for their turn, in arrival order
	idle     *time.Timer
	lifetime *time.Timer
}

// move changes h's state, or says it cannot. h.mu is held.
func (h *held) move(to heldState) bool {
	for _, ok := range heldMoves[h.state] {
		if ok == to {
			h.state = to
			return true
		}
	}
	return false
}

// endedAs is why a session ended: a reason of the contract's, and, when
// that alone would mislead, what happened.
type endedAs struct {
	why    runtime.SessionEnd
	detail string
}

func newSessions(s *Server) *sessions {
	return &sessions{srv: s, live: map[string]*held{}, watching: map[*mcp.ServerSession]bool{}, ended: map[string]endedAs{}}
}

// reserve makes room for a new session of owner, or says why there is
// none: the session is opening until open or unreserve.
func (ss *sessions) reserve(client string, owner *mcp.ServerSession) (*held, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	o := ss.srv.opts
	switch n := ss.owned(owner); {
	case ss.closed:
		return nil, errors.New("the server is shutting down")
	case len(ss.live) >= o.PersistentMax:
		return nil, fmt.Errorf("session: %d persistent sessions are open, the most allowed (MCP_EXEC_PERSISTENT_MAX=%d); end one with end_session, or call without session", len(ss.live), o.PersistentMax)
	case owner != nil && n >= o.perClient():
		return nil, fmt.Errorf("session: this client holds %d persistent sessions, the most one client may (MCP_EXEC_PERSISTENT_PER_CLIENT=%d); end one with end_session, or call without session", n, o.perClient())
	}
	h := &held{handle: newHandle(), client: client, owner: owner, created: time.Now(), state: opening}
	h.id = sessionID(h.handle)
	ss.live[h.handle] = h
	if owner != nil && !ss.watching[owner] {
		ss.watching[owner] = true
		go ss.endWithOwner(owner)
	}
	return h, nil
}

// owned counts the sessions owner holds or is opening. ss.mu is held.
func (ss *sessions) owned(owner *mcp.ServerSession) int {
	n := 0
	for _, h := range ss.live {
		if h.owner == owner {
			n++
		}
	}
	return n
}

// endWithOwner ends owner's sessions once its MCP session has ended
// (the client deleted it, it idled out, its stream closed): nobody can
// call them any more, and they would hold their places for nothing.
func (ss *sessions) endWithOwner(owner *mcp.ServerSession) {
	owner.Wait()
	ss.mu.Lock()
	delete(ss.watching, owner)
	var theirs []*held
	for _, h := range ss.live {
		if h.owner == owner {
			theirs = append(theirs, h)
		}
	}
	ss.mu.Unlock()
	for _, h := range theirs {
		ss.expire(h, runtime.EndClosed)
	}
}

// holds says whether the MCP session of id has persistent sessions.
func (ss *sessions) holds(id string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, h := range ss.live {
		if h.owner != nil && h.owner.ID() == id {
			return true
		}
	}
	return false
}

// open gives a reserved session its sandbox; the call that made it has
// the first turn.
func (ss *sessions) open(h *held, sess Session) error {
	o := ss.srv.opts
	h.mu.Lock()
	h.sess = sess
	ok := h.move(busy)
	h.idle = time.AfterFunc(o.PersistentIdle, func() { ss.expire(h, runtime.EndIdle) })
	h.idle.Stop()
	h.lifetime = time.AfterFunc(o.PersistentLifetime, func() { ss.expire(h, runtime.EndLifetime) })
	h.mu.Unlock()
	if !ok {
		// Ended while opening: the server is shutting down.
		sess.Close()
		return fmt.Errorf("%w: the server is shutting down", runtime.ErrSandbox)
	}
	go func() {
		<-sess.Done()
		if r := sess.Ended(); r != "" {
			ss.endWith(h, endedAs{r, sess.EndDetail()})
		}
	}()
	ss.srv.auditSession(h, "session_start", "", "")
	ss.srv.log.Info("persistent session started", "session", h.id, "client", h.client)
	return nil
}

// unreserve gives back a reservation whose sandbox could not be made.
func (ss *sessions) unreserve(h *held) {
	h.mu.Lock()
	h.move(ended)
	h.mu.Unlock()
	ss.mu.Lock()
	delete(ss.live, h.handle)
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
	if e, ok := ss.ended[handle]; ok {
		return nil, fmt.Errorf("session: that persistent session has ended (%s); start another with session \"new\"", describeEnd(e.why, e.detail, ss.srv.opts))
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
	if h.state == ended || h.state == opening {
		h.mu.Unlock()
		return fmt.Errorf("session: that persistent session has ended (%s)", describeEnd(h.why, h.detail, ss.srv.opts))
	}
	if h.move(busy) {
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
		if h.state == ended {
			ss.passTurn(h)
			return fmt.Errorf("session: that persistent session has ended (%s)", describeEnd(h.why, h.detail, ss.srv.opts))
		}
		return nil
	case <-ctx.Done():
		h.mu.Lock()
		defer h.mu.Unlock()
		if i := slices.Index(h.queue, ch); i >= 0 {
			h.queue = slices.Delete(h.queue, i, i+1)
			return ctx.Err()
		}
		// The turn came as the call was cancelled: hand it on.
		ss.passTurn(h)
		return ctx.Err()
	}
}

// passTurn gives the turn to the next waiting call, or makes h idle. h.mu
// is held.
func (ss *sessions) passTurn(h *held) {
	if len(h.queue) > 0 {
		next := h.queue[0]
		h.queue = h.queue[1:]
		close(next)
		return
	}
	if h.move(idle) {
		h.idle.Reset(ss.srv.opts.PersistentIdle)
	}
}

// release ends a call's turn; why, when not "", ends the session, as does
// a lifetime that passed during the call.
func (ss *sessions) release(h *held, why runtime.SessionEnd) { ss.releaseWith(h, endedAs{why: why}) }

// releaseWith is release with what ended the session in words.
func (ss *sessions) releaseWith(h *held, e endedAs) {
	h.mu.Lock()
	if e.why == "" && h.state == ending {
		e.why = runtime.EndLifetime
	}
	h.mu.Unlock()
	if e.why != "" {
		ss.endWith(h, e)
	}
	h.mu.Lock()
	ss.passTurn(h)
	h.mu.Unlock()
}

// expire ends a session between its calls (idle, lifetime, its client
// gone); during a call, a lifetime ends it when the call does, and the
// call's client ends it by its own end.
func (ss *sessions) expire(h *held, why runtime.SessionEnd) {
	h.mu.Lock()
	if h.state == busy {
		if why == runtime.EndLifetime {
			h.move(ending)
		}
		h.mu.Unlock()
		if why == runtime.EndClosed {
			ss.end(h, why) // its client is gone: its call is cancelled too
		}
		return
	}
	h.mu.Unlock()
	ss.end(h, why)
}

// end ends a session once, for why: its sandbox is torn down, its handle
// remembered with the reason.
func (ss *sessions) end(h *held, why runtime.SessionEnd) { ss.endWith(h, endedAs{why: why}) }

// endWith is end with what happened in words, when why alone would
// mislead.
func (ss *sessions) endWith(h *held, e endedAs) {
	why := e.why
	h.mu.Lock()
	if !h.move(ended) {
		h.mu.Unlock()
		return
	}
	h.why, h.detail = why, e.detail
	sess := h.sess
	if h.idle != nil {
		h.idle.Stop()
		h.lifetime.Stop()
	}
	h.mu.Unlock()

	ss.mu.Lock()
	delete(ss.live, h.handle)
	ss.ended[h.handle] = e
	ss.order = append(ss.order, h.handle)
	if len(ss.order) > rememberEnded {
		delete(ss.ended, ss.order[0])
		ss.order = ss.order[1:]
	}
	ss.mu.Unlock()
	if sess == nil {
		return // it was opening: its call closes what it made
	}
	if err := sess.Close(); err != nil {
		ss.srv.log.Error("tearing down a persistent session", "session", h.id, "err", err)
	}
	ss.srv.auditSession(h, "session_end", why, e.detail)
	if e.detail != "" {
		ss.srv.log.Warn("persistent session ended", "session", h.id, "why", why, "detail", e.detail, "lived", time.Since(h.created).Round(time.Millisecond))
		return
	}
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
		wg.Go(func() { ss.end(h, runtime.EndShutdown) })
	}
	wg.Wait()
}

// call runs a call in a persistent session, a new one or the one its
// handle names: its turn after the session's earlier calls, a
// concurrency slot, the sandbox made (for "new"), the run, the release.
func (ss *sessions) call(ctx context.Context, req *mcp.CallToolRequest, in execInput, o origin) (runtime.Result, time.Duration, sessionOut, error) {
	s := ss.srv
	endOnly := in.EndSession && in.Code == ""
	timeout, files, err := ss.check(req, in, endOnly)
	if err != nil {
		return runtime.Result{}, 0, sessionOut{}, err
	}
	var stage atomic.Int32
	stage.Store(waitingTurn)
	live := s.live(req)
	defer s.progress(ctx, req, &stage, live)()
	h, err := ss.claim(ctx, req, in, o)
	if err != nil || endOnly {
		if err == nil {
			ss.release(h, runtime.EndClosed)
			return runtime.Result{}, 0, sessionOut{handle: h.handle, ended: runtime.EndClosed}, nil
		}
		return runtime.Result{}, timeout, sessionOut{}, err
	}
	stage.Store(waitingSlot)
	if err := s.acquire(ctx); err != nil {
		ss.giveBack(h)
		return runtime.Result{}, timeout, sessionOut{}, err
	}
	defer func() { <-s.sem }()
	stage.Store(running)
	if h.sess == nil {
		if err := ss.make(ctx, h); err != nil {
			return runtime.Result{}, timeout, sessionOut{}, err
		}
	}
	res, err := h.sess.Run(ctx, s.request(ctx, in, files, timeout, live))
	e, err := ss.verdict(res, err, in.EndSession)
	ss.releaseWith(h, e)
	return res, timeout, sessionOut{h.handle, e.why, e.detail}, err
}

// check refuses a session call that cannot be made, and checks a call
// that runs code.
func (ss *sessions) check(req *mcp.CallToolRequest, in execInput, endOnly bool) (time.Duration, []runtime.File, error) {
	switch {
	case in.Session == "":
		return 0, nil, &inputError{errors.New(`end_session needs session: the handle of the persistent session to end`)}
	case ss.srv.opts.PersistentMax == 0:
		return 0, nil, &inputError{errors.New("session: persistent sessions are off on this server (MCP_EXEC_PERSISTENT_MAX=0); call without session for a fresh sandbox")}
	case endOnly && in.Session == "new":
		return 0, nil, &inputError{errors.New(`end_session with session "new" and no code: there is no session to end`)}
	case endOnly:
		return 0, nil, nil
	}
	return ss.srv.validateCall(in, ss.srv.scopeOf(req.Session))
}

// claim reserves a new session, or waits for the turn of the one in's
// handle names.
func (ss *sessions) claim(ctx context.Context, req *mcp.CallToolRequest, in execInput, o origin) (*held, error) {
	if in.Session == "new" {
		h, err := ss.reserve(o.client, ss.srv.scopeOf(req.Session))
		if err != nil {
			return nil, &inputError{err}
		}
		return h, nil
	}
	h, err := ss.lookup(in.Session)
	if err != nil {
		return nil, &inputError{err}
	}
	if err := ss.turn(ctx, h); err != nil {
		if errors.Is(err, errBusy) || ctx.Err() != nil {
			return nil, err
		}
		return nil, &inputError{err}
	}
	return h, nil
}

// giveBack undoes claim for a call that got no slot.
func (ss *sessions) giveBack(h *held) {
	if h.sess == nil {
		ss.unreserve(h)
		return
	}
	ss.release(h, "")
}

// make makes a reserved session's sandbox.
func (ss *sessions) make(ctx context.Context, h *held) error {
	sess, err := ss.srv.eng.NewSession(ctx)
	if err != nil {
		ss.unreserve(h)
		return err
	}
	return ss.open(h, sess)
}

// verdict is why a session call's result ends its session (why "" when
// it lives on), and the error the caller gets.
func (ss *sessions) verdict(res runtime.Result, err error, endSession bool) (endedAs, error) {
	e := endedAs{res.Ended, res.EndDetail}
	var gone *runtime.EndedError
	switch {
	case errors.As(err, &gone):
		e = endedAs{gone.Reason, gone.Detail}
		err = &inputError{fmt.Errorf("session: that persistent session has ended (%s); start another with session \"new\"", describeEnd(e.why, e.detail, ss.srv.opts))}
	case errors.Is(err, runtime.ErrSandbox) && e.why == "":
		// The sandbox could not run the call: the session goes with it.
		e = endedAs{runtime.EndExited, "the sandbox could not run the call"}
	case e.why == "" && endSession:
		e.why = runtime.EndClosed
	}
	return e, err
}

// describeEnd says what an end reason means; detail, when given, says
// what happened instead of the reason's usual meaning.
func describeEnd(why runtime.SessionEnd, detail string, o Options) string {
	if detail != "" {
		return string(why) + ": " + detail
	}
	switch why {
	case runtime.EndClosed:
		return "closed: a call ended it with end_session, or the MCP session that opened it ended"
	case runtime.EndIdle:
		return fmt.Sprintf("idle: no call for %s s (MCP_EXEC_PERSISTENT_IDLE_S)", fmtSeconds(o.PersistentIdle))
	case runtime.EndLifetime:
		return fmt.Sprintf("lifetime: it was open for %s s, the most (MCP_EXEC_PERSISTENT_LIFETIME_S)", fmtSeconds(o.PersistentLifetime))
	case runtime.EndShutdown:
		return "shutdown: the server stopped"
	case runtime.EndTimeout:
		return "timeout: a call was still running a second after its KeyboardInterrupt, and the sandbox was killed"
	case runtime.EndOOM:
		return "oom: the memory or process limit was hit"
	case runtime.EndExited:
		return "exited: the interpreter ended (sys.exit or a crash)"
	}
	return string(why)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
