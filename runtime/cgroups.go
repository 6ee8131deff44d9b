package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/policy"
)

// cgroupVerdict fills the verdict's OOM and pids flags, peak memory and CPU time from
// a call's cgroups (controller name to path for cgroup v1, "" to the path
// for v2), read after the code ended and before the cgroups are removed.
func cgroupVerdict(paths map[string]string, res *Result) {
	if p, ok := paths["memory"]; ok { // cgroup v1
		control, err := cgroupRead(filepath.Join(p, "memory.oom_control"))
		oom, counted := keyed(control, "oom_kill")
		if err == nil && !counted {
			// Kernels before 4.13 have no oom_kill counter: hitting the
			// limit and dying of SIGKILL is the best evidence there is.
			if res.ExitCode == 128+9 && (readInt(filepath.Join(p, "memory.failcnt")) > 0 || readInt(filepath.Join(p, "memory.memsw.failcnt")) > 0) {
				oom = 1
			}
		}
		res.OOMKilled = oom > 0
		res.PeakMemoryBytes = readInt(filepath.Join(p, "memory.max_usage_in_bytes"))
		res.SocketPeakBytes = readInt(filepath.Join(p, "memory.kmem.tcp.max_usage_in_bytes"))
	} else if p, ok := paths[""]; ok { // cgroup v2
		res.OOMKilled = readKeyed(filepath.Join(p, "memory.events"), "oom_kill") > 0
		res.PeakMemoryBytes = readInt(filepath.Join(p, "memory.peak"))
	}
	if p, ok := paths["pids"]; ok { // cgroup v1
		res.PidsLimitHit = readKeyed(filepath.Join(p, "pids.events"), "max") > 0
	} else if p, ok := paths[""]; ok { // cgroup v2
		res.PidsLimitHit = readKeyed(filepath.Join(p, "pids.events"), "max") > 0
	}
	res.CPUTime = cgroupCPU(paths)
	if p, ok := paths["cpu"]; ok { // cgroup v1
		res.CPUThrottled = time.Duration(readKeyed(filepath.Join(p, "cpu.stat"), "throttled_time"))
	} else if p, ok := paths[""]; ok {
		res.CPUThrottled = time.Duration(readKeyed(filepath.Join(p, "cpu.stat"), "throttled_usec")) * time.Microsecond
	}
}

// preparedAhead says whether b's sandbox waits at the preparing CPU
// weight (bundle.Config.Ahead).
func preparedAhead(s *specs.Spec) bool {
	return s.Linux != nil && s.Linux.Resources != nil && s.Linux.Resources.CPU != nil &&
		s.Linux.Resources.CPU.Shares != nil && *s.Linux.Resources.CPU.Shares == policy.CPUSharesPreparing
}

// cgroupForeground gives a call's cgroup the ordinary CPU weight.
func cgroupForeground(paths map[string]string) error {
	if p, ok := paths["cpu"]; ok {
		return cgroupWrite(filepath.Join(p, "cpu.shares"), strconv.Itoa(policy.CPUSharesCall))
	} else if p, ok := paths[""]; ok {
		return cgroupWrite(filepath.Join(p, "cpu.weight"), strconv.FormatUint(cgroups.ConvertCPUSharesToCgroupV2Value(policy.CPUSharesCall), 10))
	}
	return nil
}

// cgroupCPU is the CPU time all processes of a call's cgroups have used so
// far, as the host's kernel accounts it.
func cgroupCPU(paths map[string]string) time.Duration {
	if p, ok := paths["cpuacct"]; ok {
		return time.Duration(readInt(filepath.Join(p, "cpuacct.usage")))
	} else if p, ok := paths[""]; ok {
		return time.Duration(readKeyed(filepath.Join(p, "cpu.stat"), "usage_usec")) * time.Microsecond
	}
	return 0
}

// cgroupRead reads a small control file (cgroupfs, procfs) with plain
// system calls. os.ReadFile's stat, its registration with Go's poller
// and its growing buffer cost several times the read itself, and a
// forked call's server reads and writes some forty of these (its limits,
// its verdict, its teardown): the server's largest share of a call's CPU.
func cgroupRead(path string) ([]byte, error) {
	fd, err := openRetrying(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// cgroupWrite writes a value to a control file with one write, as the
// kernel takes it (a control file does not take a value in pieces); the
// file must exist.
func cgroupWrite(path, value string) error {
	fd, err := openRetrying(path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Write(fd, []byte(value))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return &os.PathError{Op: "write", Path: path, Err: err}
		case n != len(value):
			return &os.PathError{Op: "write", Path: path, Err: unix.EIO}
		}
		return nil
	}
}

func openRetrying(path string, mode int) (int, error) {
	for {
		fd, err := unix.Open(path, mode|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

func readInt(path string) int64 {
	data, err := cgroupRead(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// readKeyed reads "key value" lines such as memory.oom_control's.
func readKeyed(path, key string) int64 {
	data, err := cgroupRead(path)
	if err != nil {
		return 0
	}
	n, _ := keyed(data, key)
	return n
}

// keyed is the value of key in "key value" lines, and whether it is
// there at all.
func keyed(data []byte, key string) (int64, bool) {
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, true
		}
	}
	return 0, false
}

// limitSockets bounds, on cgroup v1, the socket buffers of a call's
// sandbox: v1 charges them to a counter of their own, separate from the
// memory limit, and only once its limit is set — until then a call could
// queue gigabytes in loopback sockets, host memory the limit never sees.
// On v2 the memory controller charges them to the limit itself.
func limitSockets(paths map[string]string, bytes int64) error {
	p, ok := paths["memory"]
	if !ok {
		return nil // v2
	}
	f := filepath.Join(p, "memory.kmem.tcp.limit_in_bytes")
	if err := cgroupWrite(f, strconv.FormatInt(bytes, 10)); err != nil {
		return fmt.Errorf("limiting socket memory: %w", err)
	}
	return nil
}

// loopbackMTU is the sandbox's loopback MTU (and largest segment) on
// cgroup v1: the kernel charges socket memory to the call's bound but
// lets each TCP socket go past it by a segment or so, so that a stalled
// connection still makes progress; with 64 KiB segments, thousands of
// loopback connections pile those up to several times the bound. With
// small ones the overshoot stays below what the sockets themselves take
// from the memory limit (measured: about 12 KiB a connection), and the
// supervision's socket poll kills the call past half the bound again.
const loopbackMTU = 1280

// shrinkLoopback sets the MTU and the largest GSO segment of lo in the
// network namespace of pid, on cgroup v1 (where socket memory has a
// bound of its own).
func shrinkLoopback(paths map[string]string, pid int) error {
	if _, v1 := paths["memory"]; !v1 {
		return nil
	}
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("opening the sandbox's network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("entering the sandbox's network namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding the sandbox's loopback: %w", err)
	}
	if err := h.LinkSetGSOMaxSize(lo, loopbackMTU); err != nil {
		return fmt.Errorf("setting the sandbox's loopback segment size: %w", err)
	}
	if err := h.LinkSetMTU(lo, loopbackMTU); err != nil {
		return fmt.Errorf("setting the sandbox's loopback MTU: %w", err)
	}
	return nil
}

// cgroupSockets reads a call's socket buffer memory and its bound on
// cgroup v1; ok is false on v2, where they count in the memory limit.
func cgroupSockets(paths map[string]string) (used, limit int64, ok bool) {
	p, found := paths["memory"]
	if !found {
		return 0, 0, false
	}
	limit = readInt(filepath.Join(p, "memory.kmem.tcp.limit_in_bytes"))
	if limit <= 0 || limit >= 1<<62 {
		return 0, 0, false
	}
	return readInt(filepath.Join(p, "memory.kmem.tcp.usage_in_bytes")), limit, true
}
