package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
)

// The template registry's bookkeeping, on templates that are only tokens
// (the forks themselves are tested on real templates in fork_test.go, as
// root): which template a call gets, when one is retired or replaced, and
// when forking stops. None of it needs root or a container.

// tokenTemplate is a template's sandbox as the registry sees it.
type tokenTemplate struct {
	n      int
	dead   atomic.Bool
	closed atomic.Bool
}

func (t *tokenTemplate) alive() bool  { return !t.dead.Load() && !t.closed.Load() }
func (t *tokenTemplate) Close() error { t.closed.Store(true); return nil }

// tokenStarts starts token templates, or fails as told.
type tokenStarts struct {
	mu      sync.Mutex
	started []*tokenTemplate
	err     error
}

func (s *tokenStarts) start(ctx context.Context, _ *bundle.Bundle) (templateBox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	t := &tokenTemplate{n: len(s.started) + 1}
	s.started = append(s.started, t)
	return t, nil
}

func (s *tokenStarts) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started)
}

func newTokenTemplates(t *testing.T, cfg ForkConfig) (*templates, *tokenStarts) {
	starts := &tokenStarts{}
	ts := newTemplates(cfg, slog.New(slog.DiscardHandler), starts.start)
	t.Cleanup(ts.close)
	return ts, starts
}

func callBundle(cfg bundle.Config) *bundle.Bundle {
	return &bundle.Bundle{ID: "call", Config: cfg}
}

var tokenCfg = bundle.Config{Rootfs: "/r", Python: "/p", InitDir: "/i", Limits: policy.DefaultLimits(), CallCaps: policy.DefaultCallCaps()}

func acquireOK(t *testing.T, ts *templates, cfg bundle.Config) *template {
	t.Helper()
	tpl, err := ts.acquire(context.Background(), callBundle(cfg))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return tpl
}

func tokenOf(tpl *template) *tokenTemplate { return tpl.box.(*tokenTemplate) }

// retired waits for the registry to close a template it retired (it
// closes them in the background).
func retired(t *testing.T, tok *tokenTemplate) {
	t.Helper()
	// Well within the sweep's first tick, which would retire it anyway.
	testenv.EventuallyWithin(t, 10*time.Second, fmt.Sprintf("template %d to be closed", tok.n), tok.closed.Load)
}

// aged sets when a template was made or last used, as the registry's
// clock would have it.
func aged(ts *templates, set func()) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	set()
}

// A call's template is idle again once the call is over, and the next
// call of the same configuration takes it rather than start another; a
// sandbox prepared ahead (another CPU weight) is of the same template.
func TestTemplatesReuseIdle(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	a := acquireOK(t, ts, tokenCfg)
	if st := ts.status(); st.Busy != 1 || st.Idle != 0 {
		t.Fatalf("one call: busy %d, idle %d; want 1, 0", st.Busy, st.Idle)
	}
	ts.release(a, true)
	if st := ts.status(); st.Busy != 0 || st.Idle != 1 || st.Forks != 1 {
		t.Fatalf("after it: busy %d, idle %d, forks %d; want 0, 1, 1", st.Busy, st.Idle, st.Forks)
	}
	ahead := tokenCfg
	ahead.Ahead = true
	if b := acquireOK(t, ts, ahead); b != a || starts.count() != 1 {
		t.Fatalf("the next call got another template (%d started), want the idle one", starts.count())
	}
}

// A busy template serves one call: a second call at once gets a template
// of its own; a call of another configuration never gets one of this.
func TestTemplatesBusyAndKeyed(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	a := acquireOK(t, ts, tokenCfg)
	b := acquireOK(t, ts, tokenCfg)
	if a == b || starts.count() != 2 {
		t.Fatalf("two calls at once shared a template (%d started)", starts.count())
	}
	ts.release(a, true)
	other := tokenCfg
	other.Limits.MemoryBytes *= 2
	if c := acquireOK(t, ts, other); c == a || starts.count() != 3 {
		t.Fatalf("a call with another memory limit got a template of the first configuration")
	}
}

// Every field of the configuration but a call's CPU weight and the
// template's own mark makes a template: sandboxes that differ in any get
// templates of their own (the key is checked field by field, so that a
// field added to bundle.Config is never left out of it unseen).
func TestTemplatesKey(t *testing.T) {
	base := keyOf(tokenCfg)
	v := reflect.ValueOf(&tokenCfg).Elem()
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		cfg := tokenCfg
		f := reflect.ValueOf(&cfg).Elem().Field(i)
		change(t, name, f)
		same := keyOf(cfg) == base
		if not := name == "Ahead" || name == "Template"; same != not {
			t.Errorf("changing %s: same key %v, want %v", name, same, not)
		}
	}
}

// change changes a field's value, whatever its type.
func change(t *testing.T, name string, f reflect.Value) {
	switch f.Kind() {
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Bool:
		f.SetBool(!f.Bool())
	case reflect.Slice:
		f.Set(reflect.Append(f, reflect.ValueOf("A=b")))
	case reflect.Struct:
		change(t, name+"."+f.Type().Field(0).Name, f.Field(0))
	case reflect.Int, reflect.Int64:
		f.SetInt(f.Int() + 1)
	case reflect.Uint64:
		f.SetUint(f.Uint() + 1)
	case reflect.Float64:
		f.SetFloat(f.Float() + 1)
	case reflect.Pointer:
		if f.IsNil() {
			f.Set(reflect.New(f.Type().Elem()))
		}
		change(t, name, f.Elem())
	default:
		t.Fatalf("%s: no change for a %s", name, f.Kind())
	}
}

// A template serves MaxCalls calls, then is retired once its call ends;
// the next call starts another.
func TestTemplatesRetireAfterMaxCalls(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{MaxCalls: 2})
	a := acquireOK(t, ts, tokenCfg)
	ts.release(a, true)
	if acquireOK(t, ts, tokenCfg) != a {
		t.Fatal("the second call did not get the template")
	}
	ts.release(a, true)
	retired(t, tokenOf(a))
	if b := acquireOK(t, ts, tokenCfg); b == a || starts.count() != 2 {
		t.Fatalf("the third call got the spent template (%d started)", starts.count())
	}
}

// A template past MaxAge is retired once its call ends.
func TestTemplatesRetireAfterMaxAge(t *testing.T) {
	ts, _ := newTokenTemplates(t, ForkConfig{MaxAge: time.Hour})
	a := acquireOK(t, ts, tokenCfg)
	aged(ts, func() { a.born = time.Now().Add(-2 * time.Hour) })
	ts.release(a, true)
	retired(t, tokenOf(a))
	if st := ts.status(); st.Idle != 0 {
		t.Fatalf("an aged template waits idle (%d)", st.Idle)
	}
}

// A template that died while it waited is replaced when a call comes for
// it; one whose fork failed is retired, never given another call.
func TestTemplatesReplaceDead(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	a := acquireOK(t, ts, tokenCfg)
	ts.release(a, true)
	tokenOf(a).dead.Store(true)
	b := acquireOK(t, ts, tokenCfg)
	if b == a || starts.count() != 2 {
		t.Fatal("a call got a dead template")
	}
	retired(t, tokenOf(a))
	ts.release(b, false)
	retired(t, tokenOf(b))
	if st := ts.status(); st.Idle != 0 || st.Forks != 1 {
		t.Fatalf("after a failed fork: idle %d, forks %d; want 0, 1", st.Idle, st.Forks)
	}
}

// Failures in a row stop forking for good, past forkFailuresToStop; a
// fork that works in between starts the count again.
func TestTemplatesFailuresStopForking(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	boom := errors.New("the zygote died")
	for range forkFailuresToStop - 1 {
		ts.failed(boom)
	}
	ts.release(acquireOK(t, ts, tokenCfg), true)
	for range forkFailuresToStop - 1 {
		ts.failed(boom)
	}
	if !ts.on() {
		t.Fatal("forking stopped, though a fork worked between the failures")
	}
	ts.failed(boom)
	if ts.on() {
		t.Fatalf("forking goes on after %d failures in a row", forkFailuresToStop)
	}
	n := starts.count()
	_, err := ts.acquire(context.Background(), callBundle(tokenCfg))
	if !errors.Is(err, errFork) || !errors.Is(err, ErrSandbox) || starts.count() != n {
		t.Fatalf("acquire once forking stopped: %v (started %d more)", err, starts.count()-n)
	}
	if st := ts.status(); st.Disabled != boom.Error() || st.LastError != boom.Error() {
		t.Fatalf("status: %+v; want it disabled by %q", st, boom)
	}
}

// Idle templates unused for templateIdle are swept; a recent one stays.
func TestTemplatesSweepIdle(t *testing.T) {
	ts, _ := newTokenTemplates(t, ForkConfig{})
	a := acquireOK(t, ts, tokenCfg)
	b := acquireOK(t, ts, tokenCfg)
	ts.release(a, true)
	ts.release(b, true)
	aged(ts, func() { a.lastUsed = time.Now().Add(-templateIdle - time.Second) })
	ts.sweepOnce(time.Now())
	retired(t, tokenOf(a))
	if st := ts.status(); st.Idle != 1 || tokenOf(b).closed.Load() {
		t.Fatalf("after a sweep: idle %d, the recent one closed %v; want 1, false", st.Idle, tokenOf(b).closed.Load())
	}
}

// Close retires the idle templates and refuses calls after it; a busy
// template closes with its call's sandbox, and is retired when given
// back.
func TestTemplatesClose(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	a := acquireOK(t, ts, tokenCfg)
	b := acquireOK(t, ts, tokenCfg)
	ts.release(a, true)
	ts.close()
	if !tokenOf(a).closed.Load() {
		t.Error("an idle template outlived close")
	}
	if tokenOf(b).closed.Load() {
		t.Error("close closed a busy template under its call")
	}
	ts.release(b, true)
	retired(t, tokenOf(b))
	n := starts.count()
	if _, err := ts.acquire(context.Background(), callBundle(tokenCfg)); err == nil || starts.count() != n {
		t.Fatal("a template was acquired after close")
	}
}

// A template that could not start is no one's: the error is the call's,
// and nothing is busy.
func TestTemplatesStartFails(t *testing.T) {
	ts, starts := newTokenTemplates(t, ForkConfig{})
	starts.err = errors.New("no zygote")
	if _, err := ts.acquire(context.Background(), callBundle(tokenCfg)); err != starts.err {
		t.Fatalf("acquire: %v, want the start's error", err)
	}
	if st := ts.status(); st.Busy != 0 || st.Idle != 0 {
		t.Fatalf("after a failed start: busy %d, idle %d", st.Busy, st.Idle)
	}
}
