package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
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
// started as the slot's uid (runtime/sandboxinit's init_userns.c), which
// unshares a user namespace and waits; the server writes its uid and gid maps, and every
// sandbox of the slot joins it by path. A slot is used by one sandbox at a
// time and reused after that sandbox is gone.

// DefaultUIDBase is the first host uid of the slots: slot i maps the
// sandbox's root to base+2i and its user to base+2i+1. It lies above the
// ranges systemd gives to containers and dynamic users.
const DefaultUIDBase = 0x7000_0000

// DefaultSlotDir is where call slots are claimed, host-wide: slot i is an
// instance's while it holds an flock on the file named i there. The dir
// is fixed, whatever the state dir, so that two live instances (each stdio
// client starts one, and so does each mcp-exec run) never share a slot's
// host uids; a dead instance's claims end with its open files.
const DefaultSlotDir = "/run/mcp-exec-slots"

// slotClaims hands out slot indices no live instance on the host holds.
type slotClaims struct {
	dir  string
	base int
}

// claim is one slot index held host-wide until release.
type claim struct {
	index int
	lock  *os.File
}

// claim takes the lowest index no live instance holds.
func (c *slotClaims) claim() (*claim, error) {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: creating the call slots' dir: %w", ErrSandbox, err)
	}
	if err := checkPrivateDir(c.dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	for i := 0; c.base+2*i+1 <= 1<<32-2; i++ {
		f, err := os.OpenFile(filepath.Join(c.dir, strconv.Itoa(i)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("%w: claiming call slot %d: %w", ErrSandbox, i, err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &claim{index: i, lock: f}, nil
		}
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: claiming call slot %d: %w", ErrSandbox, i, err)
		}
	}
	return nil, fmt.Errorf("%w: no host uid left for a call slot above base %d", ErrSandbox, c.base)
}

func (cl *claim) release() { cl.lock.Close() }

// ids are the host uids (and gids) of slot index i: the sandbox's root
// and its user.
func (c *slotClaims) ids(i int) (root, user int) { return c.base + 2*i, c.base + 2*i + 1 }

type slot struct {
	claim   *claim
	rootID  int // host uid and gid of the sandbox's root
	userID  int // host uid and gid of the sandbox's user, the namespace's owner
	holder  *exec.Cmd
	release *os.File // closing it ends the holder
	nsPath  string
	dead    chan struct{}
}

type slots struct {
	claims slotClaims
	exe    string

	mu     sync.Mutex
	free   []*slot
	all    map[*slot]bool
	closed bool

	spawns chan spawnRequest
	stop   chan struct{}
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func newSlots(base int, dir string) *slots {
	s := &slots{claims: slotClaims{dir: dir, base: base}, exe: "/proc/self/exe", all: map[*slot]bool{},
		spawns: make(chan spawnRequest), stop: make(chan struct{})}
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

// acquire returns a slot no other sandbox on the host uses, claiming one
// and starting its holder when this instance has none free.
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
			// Killed from outside: its claim goes, a new one is taken.
			delete(s.all, sl)
			sl.claim.release()
			continue
		default:
		}
		s.mu.Unlock()
		return sl, nil
	}
	s.mu.Unlock()

	cl, err := s.claims.claim()
	if err != nil {
		return nil, err
	}
	sl, err := s.start(cl)
	if err != nil {
		cl.release()
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		// Closed while the holder started: close did not see it.
		sl.stop()
		return nil, fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	s.all[sl] = true
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
		delete(s.all, sl)
		sl.claim.release()
	default:
		s.free = append(s.free, sl)
	}
}

func (s *slots) start(cl *claim) (_ *slot, retErr error) {
	rootID, userID := s.claims.ids(cl.index)
	sl := &slot{claim: cl, rootID: rootID, userID: userID, dead: make(chan struct{})}
	index := cl.index
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
	cmd := exec.Command(s.exe, initproto.HoldMarker)
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
			sl.stopHolder()
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

// stopHolder ends the slot's holder.
func (sl *slot) stopHolder() {
	if sl.release != nil {
		sl.release.Close()
	}
	if sl.holder != nil && sl.holder.Process != nil {
		sl.holder.Process.Kill()
		<-sl.dead
	}
}

// stop ends the holder and gives up the slot's claim.
func (sl *slot) stop() {
	sl.stopHolder()
	sl.claim.release()
}

// close ends every holder and gives up every claim. The sandboxes are
// gone by then.
func (s *slots) close() error {
	s.mu.Lock()
	s.closed = true
	all := s.all
	s.all, s.free = map[*slot]bool{}, nil
	s.mu.Unlock()
	for sl := range all {
		sl.stop()
	}
	close(s.stop)
	return nil
}
