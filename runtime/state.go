package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/host"
)

// DefaultStateDir holds one directory per live server instance.
const DefaultStateDir = "/run/mcp-exec"

// cgroupRoot is the cgroup (under every controller) that holds one child per
// server instance, which holds one child per call.
const cgroupRoot = host.CgroupRoot

// instance is one server's private state: a locked directory under the state
// root holding its bundles and container state, and a cgroup parent.
type instance struct {
	id   string
	dir  string
	lock *os.File
	log  *slog.Logger
	wd   *watchdog
}

// newInstance creates and locks a fresh instance directory under root, after
// sweeping what dead instances left there.
func newInstance(root string, log *slog.Logger) (_ *instance, retErr error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir %s: %w", root, err)
	}
	if err := checkPrivateDir(root); err != nil {
		return nil, err
	}
	sweep(root, log)

	id := uuid.NewString()
	dir := filepath.Join(root, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating instance dir: %w", err)
	}
	defer func() {
		if retErr != nil {
			unmountInstance(dir)
			os.RemoveAll(dir)
		}
	}()
	// A filesystem of its own: the init the sandboxes bind from here
	// shows in their /proc/self/mountinfo as "/init" of a tmpfs, not as a
	// path naming the state dir and the instance.
	if err := unix.Mount("mcp-exec", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=512m"); err != nil {
		return nil, fmt.Errorf("mounting the instance dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating instance lock: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("locking instance dir: %w", err)
	}
	for _, sub := range []string{"bundles", "containers", "templates", "templates/containers"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			lock.Close()
			return nil, fmt.Errorf("creating instance dir: %w", err)
		}
	}
	in := &instance{id: id, dir: dir, lock: lock, log: log}
	if err := installInit(in.initDir()); err != nil {
		lock.Close()
		return nil, err
	}
	if in.wd, err = startWatchdog(id, dir, log); err != nil {
		lock.Close()
		return nil, err
	}
	return in, nil
}

func (in *instance) bundleDir() string    { return filepath.Join(in.dir, "bundles") }
func (in *instance) containerDir() string { return filepath.Join(in.dir, "containers") }

// initDir holds the copy of this executable that every sandbox of the
// instance runs as its init (bundle.InitDir).
func (in *instance) initDir() string { return filepath.Join(in.dir, "init") }

// cgroupPath is the cgroup path of one call, relative to each controller's
// root.
func (in *instance) cgroupPath(callID string) string {
	return "/" + cgroupRoot + "/" + in.id + "/" + callID
}

// The instance's templates (fork.go) are its own, not calls': their
// bundles and container state are under templates/, their cgroups under
// a sibling of the calls' parent, mcp-exec/<instance>.templates/, so that
// what the calls hold is told apart from what the instance keeps between
// them. Both go with the instance.
const templatesSuffix = ".templates"

func (in *instance) templateDir() string { return filepath.Join(in.dir, "templates") }
func (in *instance) templateStateDir() string {
	return filepath.Join(in.dir, "templates", "containers")
}

func (in *instance) templateCgroupPath(id string) string {
	return "/" + cgroupRoot + "/" + in.id + templatesSuffix + "/" + id
}

// close removes the instance's cgroups and directory and releases the lock.
// The caller has torn down every container first.
func (in *instance) close() error {
	err := removeCgroupTree(in.id, in.log)
	in.wd.close()
	unmountInstance(in.dir)
	if rerr := removeAllAtomic(in.dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	in.lock.Close()
	return err
}

// checkPrivateDir refuses a state dir that others could write to: whoever
// can write there could plant a bundle or a container state.
func checkPrivateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("checking state dir: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm()&0o077 != 0 || (st != nil && int(st.Uid) != os.Geteuid()) {
		return fmt.Errorf("state dir %s must be owned by uid %d with mode 0700, has mode %v", dir, os.Geteuid(), fi.Mode().Perm())
	}
	return nil
}

// sweep removes what dead instances left behind: an instance directory
// whose lock can be taken belongs to a process that is gone. Its containers'
// processes are killed through their cgroups, then cgroups and state are
// removed.
func sweep(root string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		dir := filepath.Join(root, name)
		if strings.HasPrefix(name, ".") {
			// A half-removed directory from an earlier sweep or close.
			os.RemoveAll(dir)
			continue
		}
		if !e.IsDir() || uuid.Validate(name) != nil {
			continue
		}
		lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
		if err == nil {
			if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				lock.Close()
				continue // alive
			}
		}
		log.Info("removing state of a dead server instance", "instance", name)
		if err := removeCgroupTree(name, log); err != nil {
			log.Warn("sweeping cgroups", "instance", name, "err", err)
		}
		sweepRunsc(dir, log)
		unmountInstance(dir)
		if err := removeAllAtomic(dir); err != nil {
			log.Warn("sweeping state", "instance", name, "err", err)
		}
		if lock != nil {
			lock.Close()
		}
	}
}

// unmountInstance unmounts an instance dir's own tmpfs, with whatever it
// holds (lazily: a sandbox being torn down may still hold a file).
func unmountInstance(dir string) {
	for unix.Unmount(dir, unix.MNT_DETACH) == nil {
	}
}

// removeAllAtomic renames dir to a hidden name first, so that a crash
// half-way never leaves something that looks like a live instance.
func removeAllAtomic(dir string) error {
	hidden := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".removing")
	if err := os.Rename(dir, hidden); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	makeWritable(hidden)
	if err := os.RemoveAll(hidden); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// makeWritable lets an unprivileged owner remove read-only code dirs.
func makeWritable(dir string) {
	if os.Geteuid() == 0 {
		return // root removes regardless of modes
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
}

// cgroupMounts returns the directories where the instance's cgroup trees
// can live: one per cgroup v1 controller hierarchy, or the unified one.
// The v1 freezer's comes first: a frozen cgroup (a persistent session
// between its calls) holds back its tasks' SIGKILL until it is thawed,
// which only a walk of that hierarchy does; walked after the others, each
// of them would wait in vain for those tasks to die.
func cgroupMounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var dirs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent maj:min root mountpoint opts ... - fstype source superopts
		fields := strings.Fields(s.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		switch fields[sep+1] {
		case "cgroup", "cgroup2":
			if sep+3 < len(fields) && slices.Contains(strings.Split(fields[sep+3], ","), "freezer") {
				dirs = append([]string{fields[4]}, dirs...)
			} else {
				dirs = append(dirs, fields[4])
			}
		}
	}
	return dirs
}

// removeCgroupTree kills every process left in the instance's cgroups and
// removes them, deepest first.
func removeCgroupTree(instanceID string, log *slog.Logger) error {
	var errs []error
	for _, mnt := range cgroupMounts() {
		for _, top := range []string{filepath.Join(mnt, cgroupRoot, instanceID), filepath.Join(mnt, cgroupRoot, instanceID+templatesSuffix)} {
			errs = append(errs, removeTree(top))
		}
	}
	return errors.Join(errs...)
}

// removeTree removes a cgroup and every one below it, deepest first,
// killing what is left in each.
func removeTree(top string) error {
	if _, err := os.Stat(top); err != nil {
		return nil
	}
	var dirs []string
	filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := removeCgroup(dirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup kills the processes of one cgroup and removes it, retrying
// while the kernel finishes them off.
func removeCgroup(dir string) error {
	var err error
	for i := 0; i < 50; i++ {
		// Removed at once when empty, as a call's cgroups are once its
		// processes are reaped: reading cgroup.procs costs the kernel (v1)
		// more than the rmdir, five times a call.
		if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		killCgroupProcs(dir)
		if i > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

func killCgroupProcs(dir string) {
	data, err := cgroupRead(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, line := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(line); err == nil && pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	// A frozen v1 cgroup (a persistent session between its calls) holds
	// SIGKILL back until it is thawed: thawed after the kill, its tasks
	// die before any of them runs again. (Only a freezer cgroup has the
	// file; in the others the write fails, harmlessly.)
	cgroupWrite(filepath.Join(dir, "freezer.state"), "THAWED")
}
