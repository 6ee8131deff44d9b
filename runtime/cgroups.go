package runtime

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroupVerdict fills the verdict's OOM and pids flags, peak memory and CPU time from
// a call's cgroups (controller name to path for cgroup v1, "" to the path
// for v2), read after the code ended and before the cgroups are removed.
func cgroupVerdict(paths map[string]string, res *Result) {
	if p, ok := paths["memory"]; ok { // cgroup v1
		oom := readKeyed(filepath.Join(p, "memory.oom_control"), "oom_kill")
		if _, err := os.Stat(filepath.Join(p, "memory.oom_control")); err == nil && !hasKey(filepath.Join(p, "memory.oom_control"), "oom_kill") {
			// Kernels before 4.13 have no oom_kill counter: hitting the
			// limit and dying of SIGKILL is the best evidence there is.
			if res.ExitCode == 128+9 && (readInt(filepath.Join(p, "memory.failcnt")) > 0 || readInt(filepath.Join(p, "memory.memsw.failcnt")) > 0) {
				oom = 1
			}
		}
		res.OOMKilled = oom > 0
		res.PeakMemoryBytes = readInt(filepath.Join(p, "memory.max_usage_in_bytes"))
	} else if p, ok := paths[""]; ok { // cgroup v2
		res.OOMKilled = readKeyed(filepath.Join(p, "memory.events"), "oom_kill") > 0
		res.PeakMemoryBytes = readInt(filepath.Join(p, "memory.peak"))
	}
	if p, ok := paths["pids"]; ok { // cgroup v1
		res.PidsLimitHit = readKeyed(filepath.Join(p, "pids.events"), "max") > 0
	} else if p, ok := paths[""]; ok { // cgroup v2
		res.PidsLimitHit = readKeyed(filepath.Join(p, "pids.events"), "max") > 0
	}
	if p, ok := paths["cpuacct"]; ok {
		res.CPUTime = time.Duration(readInt(filepath.Join(p, "cpuacct.usage")))
	} else if p, ok := paths[""]; ok {
		res.CPUTime = time.Duration(readKeyed(filepath.Join(p, "cpu.stat"), "usage_usec")) * time.Microsecond
	}
}

func readInt(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// readKeyed reads "key value" lines such as memory.oom_control's.
func readKeyed(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func hasKey(path, key string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, _, ok := strings.Cut(line, " "); ok && k == key {
			return true
		}
	}
	return false
}
