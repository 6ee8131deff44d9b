package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// Parking a persistent session: a frozen session's sandbox idle for
// SessionConfig.Park is checkpointed to disk and its processes ended, so
// that an idle session costs disk, not memory; its next call restores it
// first, where it stood (sandbox.begin). Under runsc only: gVisor saves
// its whole kernel — every process, thread, open file, pipe and socket of
// the sandbox, its /tmp (a tmpfs in the sentry's memory) — in an image
// and restores it in a new sandbox on the same bundle, cgroups and id.
// A restored sandbox is the session's: the same memory, hash secret and
// address-space layout, as if it had stayed frozen.
//
// The image goes to the runtime's park dir (Config.ParkDir), on disk: not
// the instance's dir, a tmpfs, where it would be memory again. It is
// removed once the restored sandbox runs, and with the session. A
// session's image holds at most its memory, which the memory limit bounds,
// so the images of one server hold at most its sessions' limits.
//
// A checkpoint that fails leaves the session frozen as it was; a restore
// that fails ends the session, its call failing with runsc's reason: it
// never runs a call in any state but its own.

// DefaultParkDir is where parked sessions' images go, one dir per
// instance: /var/tmp survives a reboot as a disk's dir, where /run and
// /tmp may be memory.
const DefaultParkDir = "/var/tmp/mcp-exec-parked"

// parker is a container that can be parked.
type parker interface {
	// park saves the frozen container to disk and ends its processes;
	// its wait does not return.
	park() error
	// unpark restores it, running, and returns its init's new streams
	// (the sandbox's ends); on failure the container is dead.
	unpark() (parent [3]*os.File, err error)
}

// restoreTimeout bounds a restore, to the restored sandbox running.
const restoreTimeout = 60 * time.Second

// restoreReq asks the thread that started the sandbox, and that its
// processes die with, to restore it on child's streams.
type restoreReq struct {
	dir   string
	child [3]*os.File
	// started: nil once `runsc restore` runs, with exited closed once it
	// has ended.
	started chan error
	exited  chan struct{}
}

// park checkpoints the paused sandbox (runsc checkpoint keeps it paused),
// then ends it and removes runsc's state of it, which the restore makes
// anew under the same id.
func (rc *runscContainer) park() error {
	rc.mu.Lock()
	cmd := rc.cmd
	rc.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New("the sandbox has not started")
	}
	dir, err := rc.rt.parkDir(rc.b.ID)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	if out, err := rc.rt.runsc(ctx, "checkpoint", "--exclude-committed-zero-pages", "--image-path="+dir, rc.b.ID); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("runsc checkpoint: %w: %s", err, trimOutput(out))
	}
	rc.mu.Lock()
	rc.image = dir
	rc.parked = true
	rc.restores = make(chan restoreReq)
	rc.mu.Unlock()
	// Paused, it never runs again: the run process's end ends the sandbox
	// and the gofer (their parent-death signal), the cgroup's kill the
	// rest.
	cmd.Process.Signal(os.Kill)
	if rc.cg != nil {
		rc.cg.kill()
	}
	if !rc.awaitEmpty() {
		return errors.New("the checkpointed sandbox's processes did not end")
	}
	// What the cgroup still charges is page cache (the image the sentry
	// wrote, the rootfs it read): given back now, so that a parked
	// session holds no memory at all, not even reclaimable memory.
	if rc.cg != nil {
		if p, ok := rc.cg.paths["memory"]; ok {
			cgroupWrite(filepath.Join(p, "memory.force_empty"), "0")
		} else if p, ok := rc.cg.paths[""]; ok {
			cgroupWrite(filepath.Join(p, "memory.reclaim"), "1G")
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), teardownTimeout/2)
	defer dcancel()
	if rc.stateLeft() {
		rc.rt.runsc(dctx, "delete", "--force", rc.b.ID)
		removeRunscState(rc.rt.root, rc.b.ID)
	}
	return nil
}

// awaitEmpty waits until no process is left in the call's cgroups.
func (rc *runscContainer) awaitEmpty() bool {
	if rc.cg == nil {
		return true
	}
	deadline := time.Now().Add(freezeTimeout)
	for {
		empty := true
		for _, p := range rc.cg.paths {
			if cgroupHasProcs(p) {
				empty = false
			}
		}
		if empty {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		rc.cg.kill()
		time.Sleep(2 * time.Millisecond)
	}
}

// unpark has the sandbox's thread restore it, and returns once the
// restored sandbox runs.
func (rc *runscContainer) unpark() (parent [3]*os.File, err error) {
	rc.mu.Lock()
	restores, dir := rc.restores, rc.image
	rc.mu.Unlock()
	// Once restored, or not, the image is of no more use: restore reads
	// it whole before the sandbox runs (without --background).
	defer rc.removeImage()
	if restores == nil {
		return parent, errors.New("the sandbox is not parked")
	}
	child, parent, err := rc.stdio()
	if err != nil {
		return parent, err
	}
	req := restoreReq{dir: dir, child: child, started: make(chan error, 1), exited: make(chan struct{})}
	select {
	case restores <- req:
		err = <-req.started
	case <-rc.ended:
		err = errors.New("the parked sandbox ended")
	case <-time.After(restoreTimeout):
		err = errors.New("the sandbox's thread did not take the restore")
	}
	closeAll(child[:])
	if err == nil {
		err = rc.awaitRestored(req.exited)
	}
	if err != nil {
		closeAll(parent[:])
		if msg := runscFailure(rc.logf); msg != "" {
			err = fmt.Errorf("%w; runsc said: %s", err, msg)
		}
		return parent, err
	}
	return parent, nil
}

// awaitRestored waits for runsc's state of the container to say it runs,
// or for `runsc restore` to end first (it failed).
func (rc *runscContainer) awaitRestored(exited <-chan struct{}) error {
	state := filepath.Join(rc.rt.root, rc.b.ID+"_sandbox:"+rc.b.ID+".state")
	deadline := time.Now().Add(restoreTimeout)
	for {
		select {
		case <-exited:
			return errors.New("runsc restore ended before the sandbox ran")
		default:
		}
		if data, err := os.ReadFile(state); err == nil {
			var st struct {
				Status string `json:"status"`
			}
			if json.Unmarshal(data, &st) == nil && st.Status == "running" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the restored sandbox did not run within %v", restoreTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// restore starts `runsc restore` on the sandbox's thread (the run
// process's: the restored sandbox dies with it as the first did).
func (rc *runscContainer) restore(req restoreReq) (*exec.Cmd, error) {
	args := append(rc.rt.globalArgs(), "restore", "--image-path="+req.dir, "--bundle", rc.b.Dir, rc.b.ID)
	cmd := exec.Command(rc.rt.info.Path, args...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.child[0], req.child[1], req.child[2]
	cmd.ExtraFiles = []*os.File{rc.logf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting runsc restore: %w", err)
	}
	return cmd, nil
}

// wait waits for the sandbox's end: through a park, for the restored
// sandbox's, restoring it on this thread when asked.
func (rc *runscContainer) wait() {
	defer close(rc.ended)
	var exited chan struct{} // the running restore's
	for {
		rc.mu.Lock()
		cmd := rc.cmd
		rc.mu.Unlock()
		cmd.Wait()
		if exited != nil {
			close(exited)
		}
		rc.mu.Lock()
		restores, parked := rc.restores, rc.parked
		rc.mu.Unlock()
		if !parked {
			return
		}
		req, ok := <-restores
		if !ok {
			return // killed while parked
		}
		next, err := rc.restore(req)
		rc.mu.Lock()
		if err == nil {
			rc.cmd = next
		}
		rc.parked, rc.restores = false, nil
		rc.mu.Unlock()
		req.started <- err
		if err != nil {
			close(req.exited)
			return
		}
		exited = req.exited
	}
}

// removeImage removes the image of the last park, if any.
func (rc *runscContainer) removeImage() error {
	rc.mu.Lock()
	dir := rc.image
	rc.image = ""
	rc.mu.Unlock()
	if dir == "" {
		return nil
	}
	return os.RemoveAll(dir)
}

// unparkKill releases a parked sandbox's wait: it is being torn down, and
// nothing of it runs.
func (rc *runscContainer) unparkKill() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.parked && rc.restores != nil {
		close(rc.restores)
		rc.restores = nil
	}
}

// parkDir makes the dir of one park of sandbox id, in the instance's own
// dir below the runtime's park dir. Each must be this process's own and
// private: an image holds a session's memory, and a restore runs what it
// finds there in the session's place. The default's parent, /var/tmp, is
// anyone's: a dir someone else made there first is refused, and the
// session stays frozen.
func (r *RunscRuntime) parkDir(id string) (string, error) {
	if err := os.MkdirAll(r.parkRoot, 0o700); err != nil {
		return "", fmt.Errorf("creating the park dir: %w", err)
	}
	inst := filepath.Join(r.parkRoot, r.inst.id)
	if err := os.Mkdir(inst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the park dir: %w", err)
	}
	for _, dir := range []string{r.parkRoot, inst} {
		if err := ownPrivateDir(dir); err != nil {
			return "", err
		}
	}
	if err := r.holdParkLock(inst); err != nil {
		return "", err
	}
	return os.MkdirTemp(inst, id+"-")
}

// parkLockName is the file in an instance's park dir that the instance
// holds locked while it lives.
const parkLockName = ".lock"

// holdParkLock takes the lock of the instance's park dir, once: another
// server's sweep (whose state dir may be another) then leaves it be.
func (r *RunscRuntime) holdParkLock(inst string) error {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	if r.parkLock != nil {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(inst, parkLockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("locking the park dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("locking the park dir: %w", err)
	}
	r.parkLock = f
	return nil
}

// ownPrivateDir checks that dir is a directory, not a link to one, of
// this process's user, that no one else may enter.
func ownPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checking the park dir: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 || st == nil || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("the park dir %s must be a directory owned by uid %d with mode 0700; it is %v", dir, os.Geteuid(), fi.Mode())
	}
	return nil
}

// sweepParked removes the parked images of instances that are gone. An
// instance holds its park dir's lock while it lives (holdParkLock),
// whatever its state dir: servers with different state dirs share the
// park dir, and one's state dir says nothing of another's instances (a
// server starting beside a live one took its parked sessions' images).
// A dir without a lock is one an instance is making, unless it is older
// than making one takes.
func sweepParked(parkRoot string) {
	if ownPrivateDir(parkRoot) != nil {
		return // not ours to clean; parking refuses it too
	}
	entries, err := os.ReadDir(parkRoot)
	if err != nil {
		return
	}
	for _, e := range entries {
		if _, err := uuid.Parse(e.Name()); err != nil {
			continue
		}
		if dir := filepath.Join(parkRoot, e.Name()); parkDirDead(dir) {
			os.RemoveAll(dir)
		}
	}
}

// parkDirDead says whether no live instance holds dir.
func parkDirDead(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, parkLockName), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		fi, err := os.Lstat(dir)
		return err == nil && time.Since(fi.ModTime()) > time.Minute
	}
	if err != nil {
		return false
	}
	defer f.Close()
	// Held while the dir goes: the lock is free only when its instance
	// is gone, and no new one takes an old instance's id.
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

func trimOutput(out []byte) string {
	const most = 400
	s := string(out)
	if len(s) > most {
		s = s[len(s)-most:]
	}
	return s
}
