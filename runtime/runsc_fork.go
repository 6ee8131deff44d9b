package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/runtime/initproto"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Forked sandboxes under runsc: fork.go's design inside gVisor. A
// template is a gVisor sandbox (one `runsc run`, a runscContainer like
// any call's, of a template bundle) whose interpreter is a zygote; each
// call is a fork of it into new pid, mount, network, ipc and uts
// namespaces of gVisor's kernel (gVisor has no cgroup namespaces), made a
// fresh container's by the call's init (init_forked.c) and confined by
// the zygote and checked by the init as under libcontainer. The
// descriptors of a call (its init's standard streams, sockets, as runsc's
// stdio are) go to the template over its stdin with SCM_RIGHTS, which
// gVisor takes into the sandbox as host files.
//
// What differs is where a call's limits are enforced. gVisor's own
// cgroups accept a memory or pids limit but enforce neither, and the host
// sees only the sentry, its gofer and their stubs. So a template serves
// one call at a time, in a call slot of its own, and for that call its
// whole gVisor sandbox moves into host cgroups of the call's own, made
// with the call's limits as a fresh runsc call's are (newCallCgroup): the
// host kernel enforces memory, pids and the CPU quota on the sentry that
// runs the call, and the verdict is read from them, exactly as a fresh
// call's. Their memory counts what the sandbox allocates from the fork
// on (the pages the template held stay charged to its own cgroups). An
// OOM kill or the pids limit ends the whole gVisor sandbox, as a fresh
// runsc call's, and the template is replaced. At the call's end the
// sandbox moves back to the template's cgroups, and the call's are
// removed; a process that would not move ends the template.
//
// The host cannot tell the call's processes from the template's (all of
// them are the sentry's), so the call is killed from inside: H_KILL has
// the template's init SIGKILL the call's init, pid 1 of the call's pid
// namespace, whose end ends every process of the call. A template that
// does not report the call reaped within reapTimeout of the first kill
// is killed whole and replaced, as is one whose fork or teardown fails in
// any other way: no call keeps a template, or leaves it anything.

// runscZygote is a runsc template: its sandbox, and what every fork of it
// is given.
type runscZygote struct {
	zygote
	rc *runscContainer // the template's sandbox: its host cgroups are its calls'
}

// startTemplate makes a template for the sandboxes of call's
// configuration: a gVisor sandbox of its own, ready once its zygote is.
func (r *RunscRuntime) startTemplate(ctx context.Context, call *bundle.Bundle) (templateBox, error) {
	cfg := call.Config
	cfg.Ahead, cfg.Template = false, true
	tb, err := newBundle(r.inst.templateDir(), r.inst.initDir(), cfg, TemplatePrefix+uuid.NewString())
	if err != nil {
		return nil, fmt.Errorf("%w: the template's: %w", errFork, err)
	}
	setup, err := forkSetupOf(call, r.inst.cgroupPath("template"), func(s *specs.LinuxSeccomp) ([]byte, error) {
		return r.filters.compile(editedSeccomp(r.inst.id, s))
	}, true)
	if err != nil {
		tb.Remove()
		return nil, fmt.Errorf("%w: %w: %w", ErrSandbox, errFork, err)
	}
	tb.Spec.Linux.Seccomp = editedSeccomp(r.inst.id, tb.Spec.Linux.Seccomp)
	rc := &runscContainer{rt: r, b: tb, ended: make(chan struct{})}
	sb, err := prepare(ctx, &r.live, tb, rc)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.templates.failed(err)
		return nil, fmt.Errorf("%w: starting a template: %w", errFork, err)
	}
	if rc.cg == nil || rc.cg.paths["memory"] == "" && rc.cg.paths[""] == "" {
		sb.Close()
		return nil, fmt.Errorf("%w: %w: the template's sandbox has no memory cgroup", ErrSandbox, errFork)
	}
	return &runscZygote{zygote: zygote{sb: sb.(*sandbox), fork: setup}, rc: rc}, nil
}

// prepareForked prepares b's sandbox as a fork of a template, trying a
// second template when the first failed. When no template could, it
// hands back the bundle (fb), for a sandbox of its own.
func (r *RunscRuntime) prepareForked(ctx context.Context, b *bundle.Bundle) (Sandbox, *bundle.Bundle, error) {
	var ferr error
	for attempt := 0; attempt < 2; attempt++ {
		tpl, err := r.templates.acquire(ctx, b)
		if err != nil {
			return nil, b, err
		}
		z := tpl.box.(*runscZygote)
		sb, err := prepare(ctx, &r.live, b, &runscFork{rt: r, b: b, tpl: tpl, z: z})
		if err == nil || !errors.Is(err, errFork) {
			return sb, nil, err
		}
		ferr = err
		// The failed sandbox removed b: the same again.
		if b, err = newBundle(r.inst.bundleDir(), r.inst.initDir(), b.Config, b.ID); err != nil {
			return nil, nil, err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, b, ferr
}

// PrepareSession prepares a persistent session's sandbox, with forking
// on: a gVisor sandbox of its own, which can be paused and parked on its
// own, as without forking (nil without: the pool's are such).
func (r *RunscRuntime) PrepareSession(ctx context.Context, cfg bundle.Config) (Sandbox, error) {
	if r.templates == nil {
		return nil, nil // the pool's are gVisor sandboxes of their own
	}
	b, err := newBundle(r.inst.bundleDir(), r.inst.initDir(), cfg, uuid.NewString())
	if err != nil {
		return nil, err
	}
	return prepare(ctx, &r.live, b, &runscContainer{rt: r, b: b, ended: make(chan struct{})})
}

// Forking says whether sandboxes are forked from templates, and how that
// went.
func (r *RunscRuntime) Forking() ForkStatus {
	if r.templates == nil {
		return ForkStatus{}
	}
	return r.templates.status()
}

// runscFork is one forked sandbox under runsc: the call's init and code,
// forked from a template inside its gVisor sandbox.
type runscFork struct {
	rt  *RunscRuntime
	b   *bundle.Bundle
	tpl *template
	z   *runscZygote // tpl's

	// forked: the template took the fork; its init's end is awaited.
	forked bool
	reaped chan struct{}
	broken bool // the template failed this fork
	// bounded: the wait for reaped is bounded (killed once); gaveUp: the
	// template did not report in time and was killed.
	bounded sync.Once
	gaveUp  atomic.Bool
	// hit: the call met its memory or pids limit.
	hit atomic.Bool
	// cg: the call's host cgroups, which the template's sandbox is in
	// (moved) from create to destroy.
	cg    *callCgroup
	moved bool
}

// create makes the call's host cgroups, with the limits of its spec, and
// moves the template's whole sandbox into them.
func (fc *runscFork) create(context.Context) error {
	fc.b.Spec.Linux.CgroupsPath = fc.rt.inst.cgroupPath(fc.b.ID)
	cg, err := newCallCgroup(fc.b)
	if err != nil {
		return fmt.Errorf("%w: creating cgroups of %s: %w", ErrSandbox, fc.b.ID, err)
	}
	fc.cg = cg
	if err := limitSockets(cg.paths, socketBytes(fc.b.Spec)); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	fc.moved = true
	if err := moveCgroupProcs(fc.z.rc.cg.paths, cg.paths); err != nil {
		fc.broken = true
		return fmt.Errorf("%w: %w: moving the template's sandbox into the call's cgroups: %w", ErrSandbox, errFork, err)
	}
	return nil
}

// moveCgroupProcs moves every process of the cgroups from into the
// cgroups to of the same controllers, until none is left in from (a
// process that a moved one forks meanwhile is in to already, or is moved
// in the next round). A process that ended meanwhile is no error. Only
// the controllers a call's cgroups differ in move (callControllers, as a
// libcontainer fork's, or cgroup v2's one hierarchy): each move is a
// write per process to each hierarchy, and a wait for the kernel's
// cgroup lock.
func moveCgroupProcs(from, to map[string]string) error {
	for ctrl, src := range from {
		dst, ok := to[ctrl]
		if !ok || src == dst || ctrl != "" && !slices.Contains(callControllers, ctrl) {
			continue
		}
		for round := 0; ; round++ {
			data, err := cgroupRead(filepath.Join(src, "cgroup.procs"))
			if err != nil {
				return err
			}
			pids := strings.Fields(string(data))
			if len(pids) == 0 {
				break
			}
			if round == 10 {
				return fmt.Errorf("the processes of %s did not all move (%s left)", src, strings.Join(pids, " "))
			}
			for _, pid := range pids {
				if err := cgroupWrite(filepath.Join(dst, "cgroup.procs"), pid); err != nil && !errors.Is(err, unix.ESRCH) {
					return fmt.Errorf("moving %s to %s: %w", pid, dst, err)
				}
			}
		}
	}
	return nil
}

// stdio: sockets, as a runsc sandbox's own (runscContainer.stdio).
func (fc *runscFork) stdio() (child, parent [3]*os.File, err error) {
	return socketStdio()
}

// start has the template fork the sandbox: the call's init gets child as
// its stdio. No cgroup.procs file goes in: inside gVisor a write to one
// would move a host process of the same number.
func (fc *runscFork) start(child [3]*os.File) error {
	fds := []int{int(child[0].Fd()), int(child[1].Fd()), int(child[2].Fd())}
	req := binary.BigEndian.AppendUint32(nil, uint32(len(fds)))
	uid := forkUIDOf(fc.rt.inst.id, fc.b)
	req = binary.BigEndian.AppendUint32(req, uid)
	req = binary.BigEndian.AppendUint32(req, fc.b.Init.GID)
	req = append(req, fc.z.fork.bpf...)
	fc.reaped = make(chan struct{})
	err := fc.z.sb.conn.forkRequest(req, fds)
	if err == nil {
		err = awaitForked(&fc.z.zygote)
	}
	if err != nil {
		fc.broken = true
		close(fc.reaped)
		return fmt.Errorf("%w: %w: %w", ErrSandbox, errFork, err)
	}
	fc.forked = true
	go func() {
		defer close(fc.reaped)
		if !awaitReaped(&fc.z.zygote) {
			fc.broken = true
		}
	}()
	return nil
}

func (fc *runscFork) wait() { <-fc.reaped }

// started: the call's init is in the template's sandbox, whose host
// cgroups are the call's by construction.
func (fc *runscFork) started() error { return nil }

func (fc *runscFork) initConfig() (*initproto.Config, error) {
	cfg := containerInit(fc.b)
	cfg.Forked, cfg.Seccomp = fc.z.fork.config, fc.z.fork.bpf
	return cfg, nil
}

// kill has the template kill the call's init, and with it every process
// of the call. From the first kill on, the template has reapTimeout to
// say they are gone.
func (fc *runscFork) kill() {
	if !fc.forked {
		return
	}
	select {
	case <-fc.reaped:
		return // nothing of the call is left; the next call's must not be hit
	default:
	}
	if !fc.z.sb.conn.killCall() {
		// The template does not read: it cannot kill the call either.
		fc.z.sb.c.kill()
	}
	fc.bounded.Do(func() { go fc.boundReap() })
}

// boundReap kills the template's whole gVisor sandbox when it has not
// reported the call reaped in time (boundReap).
func (fc *runscFork) boundReap() {
	boundReap(fc.reaped, &fc.gaveUp, fc.rt.cfg.Logger, fc.z.sb, fc.b.ID)
}

// verdict is read from the call's cgroups, as a fresh runsc call's.
func (fc *runscFork) verdict(res *Result) {
	if fc.cg == nil {
		return
	}
	fc.cg.stats(res)
	if res.OOMKilled || res.PidsLimitHit {
		// What the limit cut short may have left the sentry in any
		// state: the template serves no other call.
		fc.hit.Store(true)
	}
}

func (fc *runscFork) cpu() time.Duration {
	if fc.cg == nil {
		return 0
	}
	return cgroupCPU(fc.cg.paths)
}

// sockets: gVisor's network stack keeps its buffers in the sentry's own
// memory, which the memory limit covers.
func (fc *runscFork) sockets() (int64, int64, bool) { return 0, 0, false }

func (fc *runscFork) foreground() error {
	if fc.cg == nil || !preparedAhead(fc.b.Spec) {
		return nil
	}
	return cgroupForeground(fc.cg.paths)
}

// deadline arms the watchdog on the call's cgroups: past it, the whole
// gVisor sandbox in them is killed, and replaced.
func (fc *runscFork) deadline(at time.Time) {
	path := fc.b.Spec.Linux.CgroupsPath
	if at.IsZero() {
		fc.rt.inst.wd.disarm(path)
	} else {
		fc.rt.inst.wd.arm(path, at)
	}
}

func (fc *runscFork) waitsForExit() bool { return false }

// explain says why a forked sandbox never got ready: a failure of the
// template, whose next call gets another.
func (fc *runscFork) explain(err error) error {
	fc.broken = true
	if msg := fc.z.sb.conn.failure(); msg != "no message" {
		return fmt.Errorf("%w: %w (the template: %s)", errFork, err, msg)
	}
	return fmt.Errorf("%w: %w", errFork, err)
}

// freeze and thaw pause the template's whole sandbox, which serves this
// call only (a persistent session's between its calls).
func (fc *runscFork) freeze() error { return fc.z.rc.freeze() }
func (fc *runscFork) thaw() error   { return fc.z.rc.thaw() }

// destroy gives the template back once nothing of the call is left in
// it, its sandbox moved back to its own cgroups, and removes the call's;
// a template that failed, did not move back whole, or met the call's
// memory or pids limit is replaced.
func (fc *runscFork) destroy() error {
	if fc.reaped != nil {
		<-fc.reaped
	}
	ok := !fc.broken && !fc.gaveUp.Load() && !fc.hit.Load()
	if fc.moved && ok {
		if err := moveCgroupProcs(fc.cg.paths, fc.z.rc.cg.paths); err != nil {
			fc.rt.cfg.Logger.Warn("a template's sandbox did not move back to its cgroups; replacing it", "template", fc.z.sb.id, "err", err)
			ok = false
		}
	}
	if fc.tpl != nil {
		fc.rt.templates.release(fc.tpl, ok)
	}
	if fc.cg == nil {
		return nil
	}
	// What is left in the call's cgroups (a template being replaced) is
	// killed with them.
	return fc.cg.remove()
}
