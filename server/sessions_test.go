package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/runtime"
)

// fakeSession keeps variables between calls, in the fake's language:
//
//	set:K=V   keep V under K
//	get:K     stdout V
//	quit      the interpreter exits (sys.exit)
//	anything else runs as a fresh call of the fake engine
type fakeSession struct {
	eng  *fakeEngine
	mu   sync.Mutex
	vars map[string]string
	// order records the calls' codes as they ran.
	order  *[]string
	done   chan struct{}
	closed sync.Once
	ended  runtime.SessionEnd
}

func (f *fakeEngine) NewSession(ctx context.Context) (Session, error) {
	f.sessions.Add(1)
	return &fakeSession{eng: f, vars: map[string]string{}, order: &f.order, done: make(chan struct{})}, nil
}

func (s *fakeSession) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	select {
	case <-s.done:
		return runtime.Result{}, &runtime.EndedError{Reason: runtime.EndExited}
	default:
	}
	s.eng.mu.Lock()
	*s.order = append(*s.order, string(req.Code))
	s.eng.mu.Unlock()
	cmd, arg, _ := strings.Cut(string(req.Code), ":")
	res := runtime.Result{Duration: time.Millisecond}
	switch cmd {
	case "set":
		k, v, _ := strings.Cut(arg, "=")
		s.mu.Lock()
		s.vars[k] = v
		s.mu.Unlock()
		res.Value = []byte(fmt.Sprintf("%q", v))
	case "get":
		s.mu.Lock()
		res.Stdout = []byte(s.vars[arg])
		s.mu.Unlock()
	case "quit":
		res.Ended = runtime.EndExited
	case "interrupted":
		// A timeout the code stopped for: the session lives on.
		res.TimedOut, res.ExitCode = true, 130
	default:
		r, err := s.eng.Run(ctx, req)
		if r.TimedOut {
			r.Ended = runtime.EndTimeout
		}
		return r, err
	}
	return res, nil
}

func (s *fakeSession) Done() <-chan struct{}     { return s.done }
func (s *fakeSession) Ended() runtime.SessionEnd { return "" }
func (s *fakeSession) EndDetail() string         { return "" }
func (s *fakeSession) Close() error {
	s.closed.Do(func() { close(s.done) })
	return nil
}

// callErr runs exec and returns its isError text ("" when it is none).
func callErr(t *testing.T, cs *mcp.ClientSession, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%v): %v", args, err)
	}
	if !res.IsError {
		return ""
	}
	return text(res)
}

func sessionOptions() Options {
	o := testOptions()
	o.PersistentMax, o.PersistentIdle, o.PersistentLifetime = 2, time.Minute, time.Hour
	o.PersistentPerClient = 2 // one client makes them all here
	return o
}

func TestSessionLifecycle(t *testing.T) {
	eng := newFakeEngine()
	_, cs := connect(t, eng, sessionOptions(), nil)
	out, res := call(t, cs, map[string]any{"code": "set:df=loaded", "session": "new"})
	h := out.Session
	if !handleRE.MatchString(h) || out.SessionEnded != "" || out.Result != `"loaded"` || !strings.Contains(text(res), "--- result ---\n\"loaded\"") {
		t.Fatalf("new session: %+v\n%s", out, text(res))
	}
	if out, _ = call(t, cs, map[string]any{"code": "get:df", "session": h}); out.Stdout != "loaded" || out.Session != h {
		t.Errorf("second call: %+v", out)
	}
	// A fresh call beside it is fresh, and says no session.
	if out, _ = call(t, cs, map[string]any{"code": "print:x"}); out.Session != "" || out.SessionEnded != "" {
		t.Errorf("a call without session: %+v", out)
	}
	// Another session does not see the first's variables.
	other, _ := call(t, cs, map[string]any{"code": "get:df", "session": "new"})
	if other.Stdout != "" || other.Session == h {
		t.Errorf("another session: %+v", other)
	}
	// The maximum (2) is reached: a third "new" is refused, naming it.
	if msg := callErr(t, cs, map[string]any{"code": "print:x", "session": "new"}); !strings.Contains(msg, "MCP_EXEC_PERSISTENT_MAX=2") {
		t.Errorf("past the maximum: %q", msg)
	}
	if out, _ = call(t, cs, map[string]any{"code": "", "session": other.Session, "end_session": true}); out.SessionEnded != "closed" {
		t.Errorf("end_session without code: %+v", out)
	}
	if msg := callErr(t, cs, map[string]any{"code": "get:df", "session": other.Session}); !strings.Contains(msg, "session") || !strings.Contains(msg, "closed") {
		t.Errorf("an ended handle: %q", msg)
	}
	// The interpreter's exit ends it.
	if out, _ = call(t, cs, map[string]any{"code": "quit", "session": h}); out.SessionEnded != "exited" {
		t.Errorf("sys.exit: %+v", out)
	}
	if msg := callErr(t, cs, map[string]any{"code": "get:df", "session": h}); !strings.Contains(msg, "exited") {
		t.Errorf("after the exit: %q", msg)
	}
	for _, bad := range []string{"ps_123", "x", "ps_" + strings.Repeat("g", 32)} {
		if msg := callErr(t, cs, map[string]any{"code": "print:x", "session": bad}); !strings.HasPrefix(msg, "session: ") || !strings.Contains(msg, "not a session handle") {
			t.Errorf("malformed %q: %q", bad, msg)
		}
	}
	if msg := callErr(t, cs, map[string]any{"code": "print:x", "session": newHandle()}); !strings.Contains(msg, "no persistent session") {
		t.Errorf("unknown handle: %q", msg)
	}
	if msg := callErr(t, cs, map[string]any{"code": "print:x", "end_session": true}); !strings.Contains(msg, "end_session needs session") {
		t.Errorf("end_session alone: %q", msg)
	}
}

func TestSessionsOff(t *testing.T) {
	o := testOptions()
	_, cs := connect(t, newFakeEngine(), o, nil)
	if msg := callErr(t, cs, map[string]any{"code": "print:x", "session": "new"}); !strings.Contains(msg, "MCP_EXEC_PERSISTENT_MAX=0") {
		t.Errorf("sessions off: %q", msg)
	}
}

func TestSessionCallsTakeTurns(t *testing.T) {
	eng := newFakeEngine()
	_, cs := connect(t, eng, sessionOptions(), nil)
	h := first(t, cs)
	var wg sync.WaitGroup
	// The first sleeps; the next arrive while it runs, in order.
	wg.Go(func() { call(t, cs, map[string]any{"code": "sleep:300ms", "session": h}) })
	testenv.Eventually(t, "the first call to run", func() bool { return eng.running.Load() == 1 })
	for i := range 3 {
		wg.Go(func() { call(t, cs, map[string]any{"code": fmt.Sprintf("set:k=%d", i), "session": h}) })
		testenv.Eventually(t, "the call to wait its turn", func() bool { return waiting(eng, i+1) })
	}
	wg.Wait()
	eng.mu.Lock()
	defer eng.mu.Unlock()
	want := []string{"set:a=1", "sleep:300ms", "set:k=0", "set:k=1", "set:k=2"}
	if fmt.Sprint(eng.order) != fmt.Sprint(want) {
		t.Errorf("calls ran in the order %q, want %q", eng.order, want)
	}
	if p := eng.peak.Load(); p != 1 {
		t.Errorf("%d calls of one session ran at once", p)
	}
}

func first(t *testing.T, cs *mcp.ClientSession) string {
	out, _ := call(t, cs, map[string]any{"code": "set:a=1", "session": "new"})
	return out.Session
}

// waiting: n calls wait for their turn in the server's one session.
func waiting(eng *fakeEngine, n int) bool {
	return eng.srv != nil && eng.srv.waiting.Load() == int64(n)
}

func TestSessionIdleAndLifetime(t *testing.T) {
	o := sessionOptions()
	o.PersistentIdle = 200 * time.Millisecond
	srv, cs := connect(t, newFakeEngine(), o, nil)
	h := first(t, cs)
	// Asked without a call, which would keep it alive.
	testenv.Eventually(t, "the idle session to end", func() bool {
		_, err := srv.persist.lookup(h)
		return err != nil
	})
	if msg := callErr(t, cs, map[string]any{"code": "get:a", "session": h}); !strings.Contains(msg, "idle") || !strings.Contains(msg, "MCP_EXEC_PERSISTENT_IDLE_S") {
		t.Errorf("an idle session's handle: %q", msg)
	}

	o = sessionOptions()
	o.PersistentLifetime = 300 * time.Millisecond
	_, cs = connect(t, newFakeEngine(), o, nil)
	h = first(t, cs)
	testenv.Eventually(t, "the session to reach its lifetime", func() bool {
		msg := callErr(t, cs, map[string]any{"code": "get:a", "session": h})
		return strings.Contains(msg, "lifetime") && strings.Contains(msg, "MCP_EXEC_PERSISTENT_LIFETIME_S")
	})
}

func TestSessionsEndAtShutdown(t *testing.T) {
	eng := newFakeEngine()
	s, err := New(eng, sessionOptions())
	if err != nil {
		t.Fatal(err)
	}
	sess, _ := eng.NewSession(context.Background())
	h, err := s.persist.reserve("test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.persist.open(h, sess); err != nil {
		t.Fatal(err)
	}
	s.persist.release(h, "")
	s.drain()
	if _, err := s.persist.lookup(h.handle); err == nil || !strings.Contains(err.Error(), "shutdown") {
		t.Errorf("after shutdown: %v", err)
	}
	select {
	case <-sess.Done():
	default:
		t.Error("the session's sandbox outlived the server's shutdown")
	}
}

func TestSessionAudit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	audit, err := OpenAudit(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	opts := sessionOptions()
	opts.Audit = audit
	_, cs := connect(t, newFakeEngine(), opts, nil)
	out, _ := call(t, cs, map[string]any{"code": "set:a=1", "session": "new"})
	call(t, cs, map[string]any{"code": "get:a", "session": out.Session, "end_session": true})

	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), out.Session) {
		t.Errorf("the audit log holds a session handle, which lets its reader in: %s", data)
	}
	var events []string
	id := sessionID(out.Session)
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r auditRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Session != id {
			t.Errorf("a record of the session names %q, want its digest %q: %s", r.Session, id, line)
		}
		events = append(events, r.Event+"/"+string(r.SessionEnded))
	}
	// The start, the first call, then the end, written as the second call
	// ends it, before that call's record.
	if want := []string{"session_start/", "/", "session_end/closed", "/closed"}; fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("audit events %q, want %q", events, want)
	}
}

func TestDescriptionSessions(t *testing.T) {
	on, err := New(newFakeEngine(), sessionOptions())
	if err != nil {
		t.Fatal(err)
	}
	if d := on.description(); !strings.Contains(d, `session "new"`) || !strings.Contains(d, "end_session") || !strings.Contains(d, "at most 2 are open") || !strings.Contains(d, "KeyboardInterrupt") {
		t.Errorf("the description does not say how to use persistent sessions: %s", d)
	}
	off, err := New(newFakeEngine(), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if d := off.description(); strings.Contains(d, "persistent session") {
		t.Errorf("sessions are off, yet the description offers them: %s", d)
	}
}

func TestSessionProgressWhileWaiting(t *testing.T) {
	opts := sessionOptions()
	opts.Progress = 50 * time.Millisecond
	var mu sync.Mutex
	var msgs []string
	eng := newFakeEngine()
	_, cs := connect(t, eng, opts, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			msgs = append(msgs, req.Params.Message)
			mu.Unlock()
		},
	})
	h := first(t, cs)
	var wg sync.WaitGroup
	wg.Go(func() { call(t, cs, map[string]any{"code": "sleep:500ms", "session": h}) })
	testenv.Eventually(t, "the first call to run", func() bool { return eng.running.Load() == 1 })
	params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:300ms", "session": h}}
	params.SetProgressToken("tok-2")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, "waiting for the persistent session's earlier calls") || !strings.Contains(all, "running for") {
		t.Errorf("progress messages of a call that waited its turn, then ran:\n%s", all)
	}
}

// clientAs connects another go-sdk client to s, over in-memory transports,
// named owner: a client of its own (an MCP session, which its persistent
// sessions count against).
func clientAs(t *testing.T, s *Server, owner string) *mcp.ClientSession {
	t.Helper()
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: owner} })
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: owner, Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	return cs
}

// One client holds at most PersistentPerClient sessions, half of
// PersistentMax by default: its fifth "new" of eight is refused, naming
// the variable, while another client still gets one; ending one of its
// own makes room again. (Where no client is known, stateless HTTP, only
// PersistentMax bounds them: TestSessionsPerClientOverHTTP.)
func TestSessionsPerClient(t *testing.T) {
	o := sessionOptions()
	o.PersistentMax, o.PersistentPerClient = 8, 0 // the default share: half
	srv, _ := connect(t, newFakeEngine(), o, nil)
	a, b := clientAs(t, srv, "a"), clientAs(t, srv, "b")
	var held []string
	for range 4 {
		out, _ := call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
		held = append(held, out.Session)
	}
	if msg := callErr(t, a, map[string]any{"code": "set:x=1", "session": "new"}); !strings.Contains(msg, "MCP_EXEC_PERSISTENT_PER_CLIENT=4") {
		t.Errorf("a client's fifth session: %q, want a refusal naming MCP_EXEC_PERSISTENT_PER_CLIENT=4", msg)
	}
	if out, _ := call(t, b, map[string]any{"code": "set:x=1", "session": "new"}); out.Session == "" {
		t.Errorf("another client's first session: %+v", out)
	}
	// A client may use, and end, a session another made; it counts
	// against the one that made it.
	call(t, b, map[string]any{"code": "", "session": held[0], "end_session": true})
	if out, _ := call(t, a, map[string]any{"code": "set:x=1", "session": "new"}); out.Session == "" {
		t.Errorf("a client's session after one of its own ended: %+v", out)
	}

	o.PersistentPerClient = 2
	srv, _ = connect(t, newFakeEngine(), o, nil)
	a = clientAs(t, srv, "a")
	call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
	call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
	if msg := callErr(t, a, map[string]any{"code": "set:x=1", "session": "new"}); !strings.Contains(msg, "MCP_EXEC_PERSISTENT_PER_CLIENT=2") {
		t.Errorf("past MCP_EXEC_PERSISTENT_PER_CLIENT=2: %q", msg)
	}
}

// Over streamable HTTP a client is an HTTP session: two of them each get
// their share, and the third session of one is refused. In stateless
// mode no request names a client: the server's maximum alone bounds them.
func TestSessionsPerClientOverHTTP(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			o := sessionOptions()
			o.PersistentMax, o.Transport, o.AuthToken, o.Stateless = 4, HTTP, testToken, stateless
			s, err := New(newFakeEngine(), o)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- s.ServeHTTP(ctx, ln) }()
			t.Cleanup(func() { cancel(); <-served })
			url := "http://" + ln.Addr().String() + "/mcp"
			clients := make([]*mcp.ClientSession, 2)
			for i := range clients {
				cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
					&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{}}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cs.Close() })
				clients[i] = cs
			}
			a, b := clients[0], clients[1]
			call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
			call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
			msg := callErr(t, a, map[string]any{"code": "set:x=1", "session": "new"})
			switch {
			case !stateless && !strings.Contains(msg, "MCP_EXEC_PERSISTENT_PER_CLIENT=2"):
				t.Errorf("an HTTP session's third session: %q, want a refusal naming MCP_EXEC_PERSISTENT_PER_CLIENT=2", msg)
			case stateless && msg != "":
				t.Errorf("stateless, a client's third session: %q, want one (no client is known)", msg)
			}
			if msg := callErr(t, b, map[string]any{"code": "set:x=1", "session": "new"}); msg != "" {
				t.Errorf("another HTTP session's first session: %q", msg)
			}
		})
	}
}

// bearer adds the test token to each request.
type bearer struct{}

func (bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+testToken)
	return http.DefaultTransport.RoundTrip(r)
}

// A session is paused between calls unless the operator said otherwise,
// and the description says which, with a client's share.
func TestDescriptionSessionsPause(t *testing.T) {
	o := sessionOptions()
	o.PersistentMax, o.PersistentPerClient = 8, 0 // the default share: half
	s, err := New(newFakeEngine(), o)
	if err != nil {
		t.Fatal(err)
	}
	if d := s.description(); !strings.Contains(d, "at most 8 are open, 4 per client") || !strings.Contains(d, "Between calls a session is paused") {
		t.Errorf("the description does not say a session pauses between calls, nor a client's share: %s", d)
	}
	o.PersistentBackground = true
	if s, err = New(newFakeEngine(), o); err != nil {
		t.Fatal(err)
	}
	if d := s.description(); strings.Contains(d, "paused") {
		t.Errorf("sessions run in the background, yet the description says they pause: %s", d)
	}
	o.PersistentPerClient = 9
	if _, err := New(newFakeEngine(), o); err == nil || !strings.Contains(err.Error(), "{PersistentPerClient}") {
		t.Errorf("a client's share above the maximum: %v, want an error naming {PersistentPerClient}", err)
	}
}

// A client's persistent sessions end with its MCP session (deleted, idled
// out, its stream closed): nobody can call them any more, and they give
// their places back. Without it one client could hold every place after
// it left (red team F3).
func TestSessionsEndWithTheirClient(t *testing.T) {
	o := sessionOptions()
	srv, _ := connect(t, newFakeEngine(), o, nil)
	a, b := clientAs(t, srv, "a"), clientAs(t, srv, "b")
	var held []string
	for range 2 {
		out, _ := call(t, a, map[string]any{"code": "set:x=1", "session": "new"})
		held = append(held, out.Session)
	}
	if msg := callErr(t, b, map[string]any{"code": "set:x=1", "session": "new"}); !strings.Contains(msg, "MCP_EXEC_PERSISTENT_MAX=2") {
		t.Fatalf("with every place taken: %q", msg)
	}
	a.Close()
	testenv.EventuallyWithin(t, 10*time.Second, "the gone client's sessions to end", func() bool {
		return callErr(t, b, map[string]any{"code": "set:x=1", "session": "new"}) == ""
	})
	if msg := callErr(t, b, map[string]any{"code": "get:x", "session": held[0]}); !strings.Contains(msg, "has ended (closed") {
		t.Errorf("a call to the gone client's session: %q, want it ended, closed", msg)
	}
}

// Past MCP_EXEC_MAX_SESSIONS a new HTTP session closes the least recently
// used one it may: never one with a call under way, nor one holding
// persistent sessions, which another client could otherwise take away by
// opening sessions (red team F11); when none may go, the new one is
// refused. An idle one still makes room.
func TestHTTPSessionsNotTakenFromBusyClients(t *testing.T) {
	o := sessionOptions()
	o.Transport, o.AuthToken, o.MaxSessions = HTTP, testToken, 2
	s, err := New(newFakeEngine(), o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeHTTP(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	url := "http://" + ln.Addr().String() + "/mcp"
	dial := func() (*mcp.ClientSession, error) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{}}}, nil)
		if err == nil {
			t.Cleanup(func() { cs.Close() })
		}
		return cs, err
	}
	a, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	b, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	handle, _ := call(t, b, map[string]any{"code": "set:x=kept", "session": "new"})
	long := make(chan string, 1)
	go func() {
		res, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:2s"}})
		if err != nil || res.IsError {
			long <- fmt.Sprintf("%v %v", err, res)
			return
		}
		long <- ""
	}()
	testenv.Eventually(t, "a's call to be under way", func() bool { return s.waiting.Load() == 0 && len(s.sem) == 1 })
	if _, err := dial(); err == nil || !strings.Contains(err.Error(), "Service Unavailable") {
		t.Errorf("a third client, with one busy and one holding a session: %v, want 503", err)
	}
	if msg := <-long; msg != "" {
		t.Errorf("the busy client's call: %s", msg)
	}
	if out, _ := call(t, b, map[string]any{"code": "get:x", "session": handle.Session}); out.Stdout != "kept" {
		t.Errorf("the session holder's session after the third client: %+v", out)
	}
	// The busy client's call is over once its request has ended, a moment
	// after its answer.
	testenv.Eventually(t, "a fourth client, with one idle, to be let in (the idle one closed to make room)", func() bool {
		_, err := dial()
		return err == nil
	})
}
