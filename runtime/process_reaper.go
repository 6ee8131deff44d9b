package runtime

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// What the root process runtime keeps of its calls between them, apart
// from the calls themselves: the pool of per-call uids, and the server as
// the subreaper of its calls' processes, which kills what a dead call's
// init left behind.

// uidPool hands out the root process runtime's per-call uids: call slots,
// claimed host-wide like libcontainer's, kept for reuse while nothing of
// their last call is left.
type uidPool struct {
	claims slotClaims
	mu     sync.Mutex
	free   []*claim
}

func (p *uidPool) get() (*claim, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	return p.claims.claim()
}

// put takes a uid back; one that still has processes is kept from every
// call, here and on the host, for the life of the instance.
func (p *uidPool) put(c *claim, clean bool) {
	if !clean {
		return
	}
	p.mu.Lock()
	p.free = append(p.free, c)
	p.mu.Unlock()
}

func (p *uidPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.free {
		c.release()
	}
	p.free = nil
}

// subreaper makes the server the subreaper of its calls' processes: a
// process whose call's init died — the init being what kills the code
// when a call ends — comes back to the server, which kills it. A child of
// the server's is a call's orphan when the runtime did not start it
// itself and it runs as a call's uid (root) or, with every call the
// server's own uid, outside the server's process group (each call has a
// group of its own; what the server starts otherwise stays in its group).
type subreaper struct {
	mu   sync.Mutex
	own  map[int]bool // the runtime's own children: inits and helpers
	uids map[int]int  // root: the uids of calls under way
	root bool
	self int
	pgid int
	sig  chan os.Signal
	quit chan struct{}
	done chan struct{}
}

// subreapers counts the process runtimes of this process that made it a
// subreaper: the last to close makes it an ordinary parent again, so
// that orphans it no longer sweeps go to init rather than pile up here.
var subreapers struct {
	sync.Mutex
	n int
}

func startSubreaper(uids *uidPool) *subreaper {
	r := &subreaper{own: map[int]bool{}, uids: map[int]int{}, root: uids != nil, self: os.Getpid(), pgid: syscall.Getpgrp(),
		sig: make(chan os.Signal, 1), quit: make(chan struct{}), done: make(chan struct{})}
	subreapers.Lock()
	defer subreapers.Unlock()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil
	}
	subreapers.n++
	notifyChild(r.sig)
	go r.loop()
	return r
}

func notifyChild(c chan os.Signal) { signal.Notify(c, syscall.SIGCHLD) }

func (r *subreaper) loop() {
	defer close(r.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.sig:
		case <-tick.C:
		case <-r.quit:
			return
		}
		r.sweep()
	}
}

// start starts cmd as one of the runtime's own children: the sweep never
// sees it unregistered.
func (r *subreaper) start(cmd *exec.Cmd) error {
	if r == nil {
		return cmd.Start()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.own[cmd.Process.Pid] = true
	return nil
}

// exited forgets an own child once it has been waited for, and looks for
// the orphans it may have left.
func (r *subreaper) exited(pid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	delete(r.own, pid)
	r.mu.Unlock()
	r.sweep()
}

func (r *subreaper) addUID(uid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.uids[uid]++
	r.mu.Unlock()
}

func (r *subreaper) removeUID(uid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.uids[uid]--; r.uids[uid] <= 0 {
		delete(r.uids, uid)
	}
	r.mu.Unlock()
}

// killUID kills every process of a call's uid, wherever it is (initproto.KillMarker,
// started as that uid), and reports whether none is left.
func (r *subreaper) killUID(uid int) error {
	cmd := exec.Command("/proc/self/exe", initproto.KillMarker)
	cmd.Args[0] = "mcp-exec-kill"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
	if err := r.start(cmd); err != nil {
		return fmt.Errorf("killing what is left of uid %d: %w", uid, err)
	}
	err := cmd.Wait()
	r.exited(cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("killing what is left of uid %d: %w", uid, err)
	}
	return nil
}

// sweep kills and reaps every orphan of a call that has come back to the
// server.
func (r *subreaper) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || r.own[pid] {
			continue
		}
		ppid, pgid, uid, ok := procParent(pid)
		if !ok || ppid != r.self {
			continue
		}
		orphan := pgid != r.pgid && uid == os.Getuid()
		if r.root {
			orphan = r.uids[uid] > 0
		}
		if orphan {
			unix.Kill(pid, unix.SIGKILL)
			unix.Wait4(pid, nil, unix.WNOHANG, nil)
		}
	}
}

func (r *subreaper) stop() {
	if r == nil {
		return
	}
	close(r.quit)
	<-r.done
	signal.Stop(r.sig)
	r.sweep()
	subreapers.Lock()
	defer subreapers.Unlock()
	if subreapers.n--; subreapers.n == 0 {
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	}
}

// procParent reads a process's parent, process group and real uid.
func procParent(pid int) (ppid, pgid, uid int, ok bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	rp := strings.LastIndexByte(string(stat), ')')
	if rp < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(stat[rp+1:]))
	if len(f) < 4 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgid, _ = strconv.Atoi(f[2])
	status, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	defer status.Close()
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				uid, _ = strconv.Atoi(fields[0])
				return ppid, pgid, uid, true
			}
		}
	}
	return 0, 0, 0, false
}
