package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The process runtime's process limit. No cgroup counts a call's
// processes: RLIMIT_NPROC does, and the kernel counts it per user in each
// user namespace. Under root each call has a uid of its own, and in a
// user namespace of its own the call's tasks are counted alone: either
// way the call's limit is its share, MCP_EXEC_PIDS. Without either, every
// call runs as the server's uid and the count is the uid's, the server's
// threads and every other call's processes included (red team F9: one
// call forking up to the uid's limit made every other call fail, and the
// readiness with them). So a call's limit is the uid's count at its start
// plus its share, set as the call is claimed (a sandbox prepared ahead
// waits in the pool while the uid's count moves): it can take no more
// than its share from the server and the other calls, and the server,
// whose own soft limit is raised to its hard one, can still start calls
// beside it.
//
// The container the server runs in may bound all of it with a pids
// cgroup (docker run --pids-limit): a call's share is then also no more
// than the room that cgroup has left, less a reserve for the server, so
// that one call cannot take the container's last tasks from the server.

// serverReserve is how many of the outer pids cgroup's tasks, or of the
// shared uid's process limit, a call may not take: the server's threads
// to come and the next call's init.
const serverReserve = 32

// minShare is the fewest tasks a call is given, whatever is left: its
// init, the interpreter and the few the init and the interpreter's start
// take (a call given 2 failed to start its interpreter).
const minShare = 8

// raiseOwnProcessLimit lifts the server's soft RLIMIT_NPROC to its hard
// one: the calls' limits sit below it, so that a call at its own limit
// leaves the server room to start the next.
func raiseOwnProcessLimit() {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		unix.Setrlimit(unix.RLIMIT_NPROC, &rl)
	}
}

// processLimit is the RLIMIT_NPROC of a call whose share is pids, as the
// call is prepared, and the share it gives the call: no more than the
// outer pids cgroup's room less the server's reserve. When the uid is the
// server's (sharedUID) the limit as prepared is only a ceiling, the uid's
// hard limit: what the uid runs moves until the call is claimed, perhaps
// much later (the pool), and the call's own limit is set then
// (claimProcessLimit). No code runs before.
func processLimit(pids int64, sharedUID bool) (limit, share int64) {
	share = pids
	if room, ok := outerPidsRoom(); ok {
		share = max(minShare, min(share, room-serverReserve))
	}
	if !sharedUID {
		return share, share
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Max != unix.RLIM_INFINITY {
		return int64(rl.Max), share
	}
	return 1 << 30, share
}

// sharedLimit is the RLIMIT_NPROC of a call, claimed, whose uid is the
// server's: its share above what the uid runs besides the own tasks the
// call already has (its init and interpreter), and no more than the
// uid's own limit, less the reserve, allows. The uid's hard limit bounds
// the server and every call together: a call stops short of it by the
// reserve, so that the server can still start the next call, and is never
// given more than the server may set.
func sharedLimit(uid int, share, own int64) int64 {
	count := uidTasks(uid)
	limit := count - own + share
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Max != unix.RLIM_INFINITY {
		hard := int64(rl.Max)
		limit = min(max(min(limit, hard-serverReserve), count-own+minShare), hard)
	}
	return limit
}

// claimProcessLimit lowers the RLIMIT_NPROC of the call's init and every
// process below it (its interpreter, waiting for the code) to the call's
// own (sharedLimit), as the call is claimed (descendants: freeze.go).
func claimProcessLimit(init, uid int, share int64) error {
	pids := append([]int{init}, descendants(init)...)
	var own int64
	for _, pid := range pids {
		own += taskCount(pid)
	}
	limit := sharedLimit(uid, share, own)
	rl := unix.Rlimit{Cur: uint64(limit), Max: uint64(limit)}
	for _, pid := range pids {
		if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &rl, nil); err != nil {
			return fmt.Errorf("setting the process limit of the call's process %d to %d: %w", pid, limit, err)
		}
	}
	return nil
}

// taskCount is how many tasks (threads) pid has; 1 when unknown.
func taskCount(pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 1
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return 1
}

// uidTasks counts the tasks (threads) of uid's processes, as RLIMIT_NPROC
// counts them: the kernel's count for the limit.
func uidTasks(uid int) int64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		real, threads := -1, int64(1)
		sc := bufio.NewScanner(bytes.NewReader(status))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					real, _ = strconv.Atoi(f[0])
				}
			} else if v, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
				threads, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		if real == uid {
			n += threads
		}
	}
	return n
}

// outerPidsRoom is how many more tasks the pids cgroups the server is in
// let it start (the least room of its cgroup and each above it that has
// a limit), and whether any has one.
func outerPidsRoom() (int64, bool) {
	room, _, found := outerPids()
	return room, found
}

// OuterPidsMax is the least pids.max of the cgroups the server is in (the
// container's --pids-limit), which bounds the server and every call
// together; 0 when none has one.
func OuterPidsMax() int64 {
	_, limit, _ := outerPids()
	return limit
}

// outerPids is outerPidsRoom, and the least limit of those cgroups.
func outerPids() (room, limit int64, found bool) {
	for _, dir := range pidsCgroupDirs() {
		for {
			text, err := os.ReadFile(filepath.Join(dir.path, "pids.max"))
			if err == nil {
				max, err1 := strconv.ParseInt(strings.TrimSpace(string(text)), 10, 64)
				cur, err2 := os.ReadFile(filepath.Join(dir.path, "pids.current"))
				n, err3 := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64)
				if err1 == nil && err2 == nil && err3 == nil {
					if !found || max-n < room {
						room = max - n
					}
					if !found || max < limit {
						limit = max
					}
					found = true
				}
			}
			if dir.path == dir.mount {
				break
			}
			dir.path = filepath.Dir(dir.path)
		}
	}
	return room, limit, found
}

// cgroupDir is the server's cgroup in one hierarchy that has the pids
// controller, and where that hierarchy is mounted.
type cgroupDir struct{ path, mount string }

// pidsCgroupDirs finds the server's cgroups that the pids controller
// bounds: the cgroup v2 one, and the v1 pids hierarchy's, each as it is
// mounted here (inside a container with a cgroup namespace, its root is
// the container's cgroup).
func pidsCgroupDirs() []cgroupDir {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	paths := map[string]string{} // "" (v2) or "pids" → the cgroup's path
	for _, l := range strings.Split(string(own), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[1] == "" {
			paths[""] = f[2]
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "pids" {
				paths["pids"] = f[2]
			}
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var dirs []cgroupDir
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		i := strings.Index(l, " - ")
		if len(f) < 5 || i < 0 {
			continue
		}
		tail := strings.Fields(l[i+3:])
		if len(tail) < 3 {
			continue
		}
		key := ""
		switch {
		case tail[0] == "cgroup2":
		case tail[0] == "cgroup" && strings.Contains(","+tail[2]+",", ",pids,"):
			key = "pids"
		default:
			continue
		}
		p, ok := paths[key]
		if !ok {
			continue
		}
		// The mount shows the hierarchy from its root (f[3]) down.
		rel, ok := strings.CutPrefix(p, strings.TrimSuffix(f[3], "/"))
		if !ok {
			continue
		}
		dirs = append(dirs, cgroupDir{path: filepath.Join(f[4], rel), mount: f[4]})
	}
	return dirs
}
