package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Freezing a persistent session between its calls (sandbox.freeze), so
// that nothing of it runs outside a call, where no concurrency slot
// counts it. Each container freezes its own way:
//
//   - libcontainer (fresh or forked): the sandbox's freezer cgroup. The
//     kernel stops every task of it, the init included, and no signal the
//     code can send or arrange wakes one. A frozen task does die of
//     SIGKILL, on cgroup v1 once thawed: every killer here (kill, the
//     watchdog, the sweep) kills, then thaws.
//   - runsc: runsc pause, which stops every task of gVisor's kernel.
//   - process: no cgroup. The code's processes are stopped with SIGSTOP
//     (stopTree); since a stopped process can be woken by a SIGCONT it
//     arranged for itself beforehand (a POSIX timer, F_SETSIG, a sibling's
//     kill), they are watched while stopped, thread by thread (stopWatch:
//     a process whose leader exited runs on in its other threads), and the
//     sandbox is killed should one of them run again.

// freezeTimeout bounds a freeze: the cgroup's tasks stopping, or the
// process runtime's stopping one by one.
const freezeTimeout = 5 * time.Second

// freezeCgroups freezes a sandbox's cgroups (frozen) or thaws them: the
// v1 freezer's, or the unified v2 one. A freeze returns once the kernel
// says every task is frozen, or, after freezeTimeout, thaws them again and
// fails. Not libcontainer's Pause (or its cgroup library's Freeze): to
// freeze a v1 cgroup whose tasks keep forking, that thaws it again every
// few dozen tries, and on this 2-core host, busy, a session's spinning
// threads were never all frozen within its thousand tries; written once
// and left alone, the cgroup was frozen within some 50 ms.
func freezeCgroups(paths map[string]string, frozen bool) error {
	var file, on, off string
	var done func(dir string) bool
	if p, ok := paths["freezer"]; ok {
		file, on, off = filepath.Join(p, "freezer.state"), "FROZEN", "THAWED"
		done = func(dir string) bool {
			st, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
			return err == nil && strings.TrimSpace(string(st)) == "FROZEN"
		}
	} else if p, ok := paths[""]; ok {
		file, on, off = filepath.Join(p, "cgroup.freeze"), "1", "0"
		done = func(dir string) bool { return readKeyed(filepath.Join(dir, "cgroup.events"), "frozen") == 1 }
	} else {
		return errors.New("the sandbox has no freezer cgroup")
	}
	if !frozen {
		return os.WriteFile(file, []byte(off), 0)
	}
	if err := os.WriteFile(file, []byte(on), 0); err != nil {
		return err
	}
	dir := filepath.Dir(file)
	deadline := time.Now().Add(freezeTimeout)
	for !done(dir) {
		if time.Now().After(deadline) {
			os.WriteFile(file, []byte(off), 0)
			return fmt.Errorf("the cgroup %s was not frozen within %v", dir, freezeTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// stopWatchEvery is how often the process runtime looks at a stopped
// session's processes.
const stopWatchEvery = 100 * time.Millisecond

// stopTree stops every process below root (root itself, the init, runs on:
// it is the runtime's, and it must see its host go) and returns, once
// every thread of each is stopped, how each thread stands (tasks).
func stopTree(root int) (map[int]string, error) {
	deadline := time.Now().Add(freezeTimeout)
	for {
		procs := descendants(root)
		running := 0
		for _, pid := range procs {
			if !threadsStopped(pid) {
				running++
				unix.Kill(pid, unix.SIGSTOP)
			}
		}
		if running == 0 {
			// What a sibling woke between the reads of its state and of
			// its marks is seen as running here, or by the watch.
			if marks, stopped := tasks(root); stopped {
				return marks, nil
			}
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d processes of the sandbox still ran after %v of SIGSTOP", running, freezeTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// contTree continues every process below root.
func contTree(root int) {
	for _, pid := range descendants(root) {
		unix.Kill(pid, unix.SIGCONT)
	}
}

// tasks marks every thread of every process below root, by its thread id
// (/proc/PID/task/TID, a zombie leader's live threads included): its
// state, and what the scheduler counts of it (run time, timeslices) or,
// where the kernel keeps no schedstat, its CPU ticks and context switches.
// A thread that runs at all changes its mark. stopped says whether every
// one of them is stopped or dead.
func tasks(root int) (marks map[int]string, stopped bool) {
	marks = map[int]string{}
	stopped = true
	for _, pid := range descendants(root) {
		dir := fmt.Sprintf("/proc/%d/task", pid)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // gone: the next walk does not list it
		}
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			f := statFields(filepath.Join(dir, e.Name(), "stat"))
			if len(f) < 13 {
				continue // it exited meanwhile
			}
			switch f[0] {
			case "T", "t", "Z", "X":
			default:
				stopped = false
			}
			sched, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
			if err != nil {
				sched, _ = os.ReadFile(filepath.Join(dir, e.Name(), "status"))
				sched = append([]byte(f[11]+" "+f[12]+" "), switches(sched)...)
			}
			marks[tid] = f[0] + " " + strings.TrimSpace(string(sched))
		}
	}
	return marks, stopped
}

// switches is the context switch counts of a status file.
func switches(status []byte) string {
	var out []string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.Contains(l, "ctxt_switches") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, " ")
}

// stopWatch watches the threads stopTree stopped until stop is called:
// should one of them have run since (it was woken, by something it set up
// before the stop: a POSIX timer's SIGCONT, F_SETSIG, a sibling's kill),
// or a thread or process appear or go, it calls ran, once, saying which.
// Every look walks the tree anew: a process forked in a moment of running
// is there too.
type stopWatch struct {
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func watchStopped(root int, stopped map[int]string, ran func(what string)) *stopWatch {
	w := &stopWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(stopWatchEvery)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
			if what := changed(stopped, root); what != "" {
				ran(what)
				return
			}
		}
	}()
	return w
}

// changed says how the threads below root differ from was: "" when none
// has run, appeared or gone.
func changed(was map[int]string, root int) string {
	now, _ := tasks(root)
	for tid, mark := range now {
		old, ok := was[tid]
		if !ok {
			return "a new process or thread appeared"
		}
		if mark != old {
			return "a thread was woken and ran"
		}
	}
	for tid := range was {
		if _, ok := now[tid]; !ok {
			return "a thread ended"
		}
	}
	return ""
}

// stop ends the watch, and returns once it has ended; nil is a no-op.
func (w *stopWatch) stop() {
	if w == nil {
		return
	}
	w.once.Do(func() { close(w.quit) })
	<-w.done
}

// descendants lists every process below root: from the kernel's lists of
// each task's children where it keeps them (CONFIG_PROC_CHILDREN; a walk
// of the tree alone, where one of all /proc took some 1.5 ms here), else
// from a walk of /proc. Either is a snapshot that a process of the tree
// still running may change: stopTree walks again until all stand still.
func descendants(root int) []int {
	if childrenFiles() {
		return descendantsByChildren(root)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// childrenFiles says whether the kernel lists each task's children
// (/proc/PID/task/TID/children).
var childrenFiles = sync.OnceValue(func() bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d/children", os.Getpid(), os.Getpid()))
	return err == nil
})

// descendantsByChildren lists every process below root from the children
// of each of their threads: a child belongs to the thread that made it.
func descendantsByChildren(root int) []int {
	var out []int
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		if err != nil {
			continue // gone
		}
		for _, t := range tasks {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", p, t.Name()))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(data)) {
				if c, err := strconv.Atoi(f); err == nil && !seen[c] {
					seen[c] = true
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// statFields are the fields of a /proc stat file after the command's
// closing parenthesis: state, ppid, ….
func statFields(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	rp := strings.LastIndexByte(string(data), ')')
	if rp < 0 {
		return nil
	}
	return strings.Fields(string(data[rp+1:]))
}

func parentOf(pid int) (int, bool) {
	f := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// threadsStopped reports whether every thread of pid is stopped (or
// dead): a group stop reaches each thread on its own, and the leader's
// state alone says nothing of the others (a leader that exited is a
// zombie while its threads run on).
func threadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true // gone
	}
	for _, t := range tasks {
		f := statFields(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "stat"))
		if len(f) == 0 {
			continue // exited meanwhile
		}
		switch f[0] {
		case "T", "t", "Z", "X":
		default:
			return false
		}
	}
	return true
}

// The process runtime's: the code's processes stopped, the init not.

func (pc *procContainer) freeze() error {
	pc.mu.Lock()
	cmd := pc.cmd
	pc.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New("the sandbox's init has not started")
	}
	stopped, err := stopTree(cmd.Process.Pid)
	if err != nil {
		contTree(cmd.Process.Pid)
		return err
	}
	w := watchStopped(cmd.Process.Pid, stopped, func(what string) {
		pc.mu.Lock()
		pc.ranFrozen = what
		pc.mu.Unlock()
		pc.kill()
	})
	pc.mu.Lock()
	pc.watch = w
	pc.mu.Unlock()
	return nil
}

func (pc *procContainer) thaw() error {
	pc.mu.Lock()
	w, cmd := pc.watch, pc.cmd
	pc.watch = nil
	pc.mu.Unlock()
	w.stop()
	contTree(cmd.Process.Pid)
	return nil
}

// endDetail says why the sandbox ended when the watch ended it: a thread
// of it ran while it was frozen.
func (pc *procContainer) endDetail() string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.ranFrozen == "" {
		return ""
	}
	return "killed by the server: a process of the session ran while the session was frozen between calls (" + pc.ranFrozen + ")"
}

// unwatch ends the watch of a stopped session's processes: it is being
// torn down.
func (pc *procContainer) unwatch() {
	pc.mu.Lock()
	w := pc.watch
	pc.watch = nil
	pc.mu.Unlock()
	w.stop()
}

// The container runtimes': the sandbox's cgroups frozen, the init with
// the code. Each of their killers thaws what it killed.

// A fresh container and a forked one: their own cgroups, the freezer
// among them (a forked sandbox's template runs on, as it must for the
// sandbox's teardown). A fresh container's init is frozen with the code,
// and cannot notice its host gone meanwhile: the watchdog thaws what it
// kills.
func (lc *lcContainer) freeze() error   { return freezeCgroups(lc.paths(), true) }
func (lc *lcContainer) thaw() error     { return freezeCgroups(lc.paths(), false) }
func (fc *forkContainer) freeze() error { return freezeCgroups(fc.paths, true) }
func (fc *forkContainer) thaw() error   { return freezeCgroups(fc.paths, false) }

// A gVisor sandbox: runsc pause, which stops every task of gVisor's
// kernel, and resume (some 10 ms each here). Not the freezer cgroup: the
// sentry drives its platform's stub processes with timeouts, and frozen
// beside them under systrap it killed one and the sandbox with it. Paused,
// the sentry itself idles (measured: about 0.3 ms of CPU a second).
func (rc *runscContainer) freeze() error { return rc.runscState("pause") }
func (rc *runscContainer) thaw() error   { return rc.runscState("resume") }

func (rc *runscContainer) runscState(cmd string) error {
	ctx, cancel := context.WithTimeout(context.Background(), freezeTimeout)
	defer cancel()
	if out, err := rc.rt.runsc(ctx, cmd, rc.b.ID); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", cmd, err, bytes.TrimSpace(out))
	}
	return nil
}
