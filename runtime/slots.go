package runtime

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/inhuman/mcp-exec/policy"
)

// A call slot is an identity on the host that one libcontainer sandbox at
// a time uses: a user namespace owned by an unprivileged host uid of its
// own, which maps the sandbox's uid 0 (its init) and policy.UID (the code)
// to two host uids of the slot. The kernel keeps many limits per user —
// inotify instances, POSIX message queue bytes, pipe buffer pages, pending
// signals, processes — and charges them to the host uid and, through the
// namespace, to its owner; were all sandboxes one host uid, one call could
// exhaust them for every other. With a slot each, they share nothing.
//
// The namespace must be created by its owner, not by root: a namespace
// root creates charges its counts to root, whose limits every root
// process of the host shares. So each slot has a holder, this executable
// started as the slot's uid (sandboxinit.c), which unshares a user
// namespace and waits; the server writes its uid and gid maps, and every
// sandbox of the slot joins it by path. A slot is used by one sandbox at a
// time and reused after that sandbox is gone.

// DefaultUIDBase is the first host uid of the slots: slot i maps the
// sandbox's root to base+2i and its user to base+2i+1. It lies above the
// ranges systemd gives to containers and dynamic users.
const DefaultUIDBase = 0x7000_0000

type slot struct {
	index   int
	rootID  int // host uid and gid of the sandbox's root
	userID  int // host uid and gid of the sandbox's user, the namespace's owner
	holder  *exec.Cmd
	release *os.File // closing it ends the holder
	nsPath  string
	dead    chan struct{}
}

type slots struct {
	base int
	exe  string

	mu     sync.Mutex
	free   []*slot
	all    []*slot
	closed bool

	spawns chan spawnRequest
	stop   chan struct{}
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func newSlots(base int) *slots {
	s := &slots{base: base, exe: "/proc/self/exe", spawns: make(chan spawnRequest), stop: make(chan struct{})}
	// Holders die with the thread that forked them (their parent-death
	// signal), and Go may retire threads: fork them all from one thread
	// locked for the life of the runtime.
	go func() {
		goruntime.LockOSThread()
		for {
			select {
			case r := <-s.spawns:
				r.done <- r.cmd.Start()
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// acquire returns a slot no other sandbox uses, starting a holder when
// none is free.
func (s *slots) acquire() (*slot, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	for len(s.free) > 0 {
		sl := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		select {
		case <-sl.dead:
			continue // killed from outside: its index is taken anew below
		default:
		}
		s.mu.Unlock()
		return sl, nil
	}
	index := len(s.all)
	for i, sl := range s.all {
		if sl == nil {
			index = i
			break
		}
	}
	if index == len(s.all) {
		s.all = append(s.all, nil)
	}
	s.all[index] = &slot{index: index} // reserved
	s.mu.Unlock()

	sl, err := s.start(index)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		// Closed while the holder started: close did not see it.
		if err == nil {
			sl.stop()
		}
		return nil, fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	if err != nil {
		s.all[index] = nil
		return nil, err
	}
	s.all[index] = sl
	return sl, nil
}

// release gives a slot back once its sandbox is gone.
func (s *slots) release(sl *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	select {
	case <-sl.dead:
		s.all[sl.index] = nil
	default:
		s.free = append(s.free, sl)
	}
}

func (s *slots) start(index int) (_ *slot, retErr error) {
	sl := &slot{index: index, rootID: s.base + 2*index, userID: s.base + 2*index + 1, dead: make(chan struct{})}
	if sl.userID > 1<<32-2 {
		return nil, fmt.Errorf("%w: no host uid left for call slot %d above base %d", ErrSandbox, index, s.base)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return nil, err
	}
	defer outR.Close()
	cmd := exec.Command(s.exe, holdMarker)
	cmd.Args[0] = "mcp-exec-userns"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout = inR, outW
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(sl.userID), Gid: uint32(sl.userID), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	done := make(chan error, 1)
	select {
	case s.spawns <- spawnRequest{cmd, done}:
	case <-s.stop:
		inW.Close()
		outW.Close()
		return nil, fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	err = <-done
	outW.Close()
	if err != nil {
		inW.Close()
		return nil, fmt.Errorf("%w: starting the user namespace holder of slot %d: %w", ErrSandbox, index, err)
	}
	sl.holder, sl.release = cmd, inW
	go func() {
		cmd.Wait()
		close(sl.dead)
	}()
	defer func() {
		if retErr != nil {
			sl.stop()
		}
	}()
	line, _ := bufio.NewReader(outR).ReadString('\n')
	if strings.TrimSpace(line) != "ok" {
		return nil, fmt.Errorf("%w: the user namespace holder of slot %d (uid %d) failed: %s", ErrSandbox, index, sl.userID, strings.TrimSpace(line))
	}
	pid := cmd.Process.Pid
	maps := fmt.Sprintf("0 %d 1\n%d %d 1\n", sl.rootID, policy.UID, sl.userID)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(maps), 0); err != nil {
			return nil, fmt.Errorf("%w: writing the %s of slot %d: %w", ErrSandbox, f, index, err)
		}
	}
	sl.nsPath = fmt.Sprintf("/proc/%d/ns/user", pid)
	return sl, nil
}

func (sl *slot) stop() {
	if sl.release != nil {
		sl.release.Close()
	}
	if sl.holder != nil && sl.holder.Process != nil {
		sl.holder.Process.Kill()
		<-sl.dead
	}
}

// close ends every holder. The sandboxes are gone by then.
func (s *slots) close() error {
	s.mu.Lock()
	s.closed = true
	all := s.all
	s.all, s.free = nil, nil
	s.mu.Unlock()
	for _, sl := range all {
		if sl != nil && sl.holder != nil {
			sl.stop()
		}
	}
	close(s.stop)
	return nil
}
