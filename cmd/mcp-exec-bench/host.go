package main

import (
	"bufio"
	"bytes"
	"os"
	goruntime "runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Host describes the machine, so that a table can be compared only with
// tables from its like. The load averages at start and end say whether
// something else was running.
type Host struct {
	CPUModel  string `json:"cpu_model"`
	Cores     int    `json:"cores"`
	Kernel    string `json:"kernel"`
	OS        string `json:"os"`
	GoVersion string `json:"go_version"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

func describeHost() Host {
	h := Host{
		CPUModel:  cpuModel(),
		Cores:     goruntime.NumCPU(),
		OS:        osName(),
		GoVersion: goruntime.Version(),
		LoadStart: loadAverage(),
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	return h
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown (" + goruntime.GOARCH + ")"
}

func osName() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "unknown"
}

// loadAverage is the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
