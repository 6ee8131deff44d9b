package policy

import (
	"errors"
	"fmt"
)

const (
	mib = 1 << 20

	// MinMemoryBytes is the smallest memory limit with which the interpreter
	// still starts under libcontainer; below it every call would be an OOM.
	// (gVisor itself takes about 15 MiB of the limit: runsc wants 32 or more.)
	MinMemoryBytes = 16 * mib
	// MinTmpfsBytes is the smallest /tmp; below it even small scripts fail.
	MinTmpfsBytes = 1 * mib
	// MinPids counts the sandbox's init and the code itself.
	MinPids = 2
	// MaxCPUs bounds the CPU quota a single call may be given.
	MaxCPUs = 1024
)

// Limits are the resource limits of one sandbox. Units are in the names.
type Limits struct {
	// MemoryBytes is the memory limit of the whole container, tmpfs pages
	// included. Swap is disabled so the limit is the limit.
	MemoryBytes int64
	// Pids is the largest number of processes and threads at once.
	Pids int64
	// CPUs is the CPU quota in cores (1.5 = one and a half cores).
	CPUs float64
	// TmpfsBytes is the size of the writable /tmp.
	TmpfsBytes int64
	// ShmBytes is the size of /dev/shm (POSIX semaphores of multiprocessing).
	ShmBytes int64
	// OpenFiles bounds the open file descriptors of each process.
	OpenFiles uint64
}

// DefaultLimits returns the contract's defaults.
func DefaultLimits() Limits {
	return Limits{
		MemoryBytes: 256 * mib,
		Pids:        128,
		CPUs:        1,
		TmpfsBytes:  64 * mib,
		ShmBytes:    8 * mib,
		OpenFiles:   1024,
	}
}

// Validate reports every limit that is out of range, naming the field as
// {Field}, for the edge to name as the operator sets it
// (docs/architecture.md).
func (l Limits) Validate() error {
	var errs []error
	if l.MemoryBytes < MinMemoryBytes {
		errs = append(errs, fmt.Errorf("{MemoryBytes}: the memory limit must be at least %d MiB, got %d bytes", MinMemoryBytes/mib, l.MemoryBytes))
	}
	if l.Pids < MinPids {
		errs = append(errs, fmt.Errorf("{Pids}: the pids limit must be at least %d (the sandbox's init and the code), got %d", MinPids, l.Pids))
	}
	if !(l.CPUs > 0 && l.CPUs <= MaxCPUs) { // also rejects NaN
		errs = append(errs, fmt.Errorf("{CPUs}: cpus must be > 0 and ≤ %d, got %v", MaxCPUs, l.CPUs))
	}
	if l.TmpfsBytes < MinTmpfsBytes {
		errs = append(errs, fmt.Errorf("{TmpfsBytes}: the tmpfs size must be at least %d MiB, got %d bytes", MinTmpfsBytes/mib, l.TmpfsBytes))
	}
	if l.ShmBytes < 0 {
		errs = append(errs, fmt.Errorf("shm size must be ≥ 0, got %d", l.ShmBytes))
	}
	if l.OpenFiles < 16 {
		errs = append(errs, fmt.Errorf("open files limit must be at least 16, got %d", l.OpenFiles))
	}
	return errors.Join(errs...)
}

// CPUPeriodUs is the CFS period the CPU quota is expressed in.
const CPUPeriodUs = 100_000

// Relative CPU weights (cgroup v1 cpu.shares; runc maps them to v2's
// cpu.weight). A sandbox prepared ahead of its call starts at the lowest,
// so that preparing it takes CPU only from no running call, and gets the
// ordinary weight back when its call begins. The quota is the limit
// either way; the weight only orders contending sandboxes.
const (
	CPUSharesPreparing = 2
	CPUSharesCall      = 1024
)

// CPUQuotaUs converts the CPU limit into a CFS quota per CPUPeriodUs.
func (l Limits) CPUQuotaUs() int64 {
	return int64(l.CPUs * CPUPeriodUs)
}

// SocketBytes bounds the kernel's socket buffers of a sandbox where the
// memory controller keeps them apart from the memory limit (cgroup v1): a
// quarter of the memory limit, plenty for the loopback servers code
// starts, and little enough that limit plus sockets stays near the limit.
// On cgroup v2 socket buffers count against the memory limit itself.
func (l Limits) SocketBytes() int64 {
	return l.MemoryBytes / 4
}

// CallCaps bound what crosses a call's edge: the code and stdin going in,
// each output stream and the files coming out (the files going in are
// bounded by the same count and bytes). The server checks what a caller
// sends against them, and the sandbox's init enforces what comes back.
type CallCaps struct {
	// MaxOutputBytes caps each of stdout and stderr.
	MaxOutputBytes int64
	// MaxCodeBytes and MaxStdinBytes bound the code and its stdin.
	MaxCodeBytes  int64
	MaxStdinBytes int64
	// MaxFiles and MaxFileBytes bound the files a call sends, and those it
	// gets back from its outputs dir.
	MaxFiles     int
	MaxFileBytes int64
}

// DefaultCallCaps returns the contract's defaults.
func DefaultCallCaps() CallCaps {
	return CallCaps{MaxOutputBytes: 1 << 20, MaxCodeBytes: 1 << 20, MaxStdinBytes: 1 << 20, MaxFiles: 20, MaxFileBytes: 10 << 20}
}

// Validate reports every cap that is out of range, naming the field as
// {Field}.
func (c CallCaps) Validate() error {
	var errs []error
	for _, f := range []struct {
		name     string
		v, least int64
	}{
		{"MaxOutputBytes", c.MaxOutputBytes, 1}, {"MaxCodeBytes", c.MaxCodeBytes, 1}, {"MaxStdinBytes", c.MaxStdinBytes, 0},
		{"MaxFiles", int64(c.MaxFiles), 0}, {"MaxFileBytes", c.MaxFileBytes, 0},
	} {
		if f.v < f.least {
			errs = append(errs, fmt.Errorf("{%s} must be ≥ %d, got %d", f.name, f.least, f.v))
		}
	}
	return errors.Join(errs...)
}
