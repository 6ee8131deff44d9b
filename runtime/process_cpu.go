package runtime

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// The process runtime has no cgroup to account a call's CPU time: it is
// measured as one would count it, over the call's process tree. The
// init is the subreaper of every orphan of the call (or pid 1 of its pid
// namespace), so that each process of the call is the init or below it
// while it lives, and its time goes to its reaper once it is reaped.

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on every Linux
// architecture).
const userHZ = 100

// maxTreeScan bounds the processes one measure reads.
const maxTreeScan = 1 << 16

// cpu is the CPU time the call's processes have used so far: the init's
// and every live descendant's, each with what it has reaped.
func (pc *procContainer) cpu() time.Duration {
	pc.mu.Lock()
	cmd := pc.cmd
	pc.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return treeCPU(cmd.Process.Pid)
}

// treeCPU is the CPU time of root and its descendants, with what each
// reaped, from one pass over /proc: its processes' parents are read
// first, then each of the tree's times.
func treeCPU(root int) time.Duration {
	d, err := os.Open("/proc")
	if err != nil {
		return 0
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := map[int][]int{}
	times := map[int]uint64{}
	for i, name := range names {
		if i >= maxTreeScan {
			break
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		ppid, ticks, ok := procStat(pid)
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], pid)
		times[pid] = ticks
	}
	var ticks uint64
	for queue := []int{root}; len(queue) > 0; queue = queue[1:] {
		ticks += times[queue[0]]
		queue = append(queue, children[queue[0]]...)
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// procStat reads a process's parent and its CPU time with its reaped
// children's (utime, stime, cutime, cstime), in ticks.
func procStat(pid int) (ppid int, ticks uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// After the command's closing parenthesis: state, ppid (field 4), ...,
	// utime (14), stime, cutime, cstime.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(string(f[1]))
	for _, x := range f[11:15] {
		n, _ := strconv.ParseInt(string(x), 10, 64)
		if n > 0 {
			ticks += uint64(n)
		}
	}
	return ppid, ticks, true
}
