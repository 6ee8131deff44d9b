package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Memory is resident memory (VmRSS, KiB) of a process tree, split the way
// an operator budgets it. A descendant in the root's mount and pid
// namespaces is the server's own machinery (a runsc CLI waiting for its
// sandbox, a container's init before it enters its namespaces); one that
// entered other namespaces, and everything under it, is a container
// (libcontainer's processes; runsc's sandbox and gofer with the sandbox's
// ptrace stubs, which stay in the host's pid namespace).
// Sums of VmRSS count shared pages (the interpreter's text, say) once per
// process, so they overstate what the machine loses; they are comparable
// between runs, which is what they are for.
type Memory struct {
	ServerKB       int64 `json:"server_kb"`  // the root process alone
	HelpersKB      int64 `json:"helpers_kb"` // descendants in its pid namespace
	ContainersKB   int64 `json:"containers_kb"`
	ContainerProcs int   `json:"container_procs"`
	// PssKB is the proportional set size of the whole tree: a shared
	// page counts once in all, split among its sharers, so it is what
	// the machine loses to the server and its sandboxes (the pages
	// forked sandboxes share with their template included once). Only
	// readIdleMemory fills it: smaps_rollup walks page tables, too
	// heavy to sample under load.
	PssKB int64 `json:"pss_kb,omitempty"`
}

// TotalServerKB is the server with its non-container children: what the
// server costs besides the sandboxes themselves.
func (m Memory) TotalServerKB() int64 { return m.ServerKB + m.HelpersKB }

// readMemory walks /proc once, leaving out the trees under skip.
func readMemory(root int, skip ...int) (Memory, error) {
	return walkMemory(root, false, skip)
}

// readIdleMemory is readMemory with PssKB.
func readIdleMemory(root int) (Memory, error) {
	return walkMemory(root, true, nil)
}

func walkMemory(root int, withPss bool, skip []int) (Memory, error) {
	rootRSS, err := vmRSS(root)
	if err != nil {
		return Memory{}, fmt.Errorf("reading the memory of pid %d: %w", root, err)
	}
	rootNS, err := namespaces(root)
	if err != nil {
		return Memory{}, err
	}
	children, err := childrenByParent()
	if err != nil {
		return Memory{}, err
	}
	m := Memory{ServerKB: rootRSS}
	if withPss {
		if m.PssKB, err = pss(root); err != nil {
			return Memory{}, fmt.Errorf("reading the memory of pid %d: %w", root, err)
		}
	}
	type proc struct {
		pid       int
		container bool // it or an ancestor below root entered other namespaces
	}
	var queue []proc
	for _, c := range children[root] {
		queue = append(queue, proc{pid: c})
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if slices.Contains(skip, p.pid) {
			continue
		}
		// A process that exits while it is read holds no memory any
		// more; its children, if still there, are walked all the same.
		rss, err := vmRSS(p.pid)
		gone := err != nil
		if !p.container && !gone {
			ns, err := namespaces(p.pid)
			gone = err != nil
			p.container = !gone && ns != rootNS
		}
		if withPss && !gone {
			// A reading error here is a process that just exited.
			kb, _ := pss(p.pid)
			m.PssKB += kb
		}
		switch {
		case gone:
		case p.container:
			m.ContainersKB += rss
			m.ContainerProcs++
		default:
			m.HelpersKB += rss
		}
		for _, c := range children[p.pid] {
			queue = append(queue, proc{pid: c, container: p.container})
		}
	}
	return m, nil
}

// namespaces identifies a process's mount and pid namespaces.
func namespaces(pid int) (string, error) {
	mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return "", fmt.Errorf("reading the namespaces of pid %d: %w", pid, err)
	}
	pidNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return "", fmt.Errorf("reading the namespaces of pid %d: %w", pid, err)
	}
	return mnt + " " + pidNS, nil
}

// vmRSS is 0 for a process with no address space (a zombie).
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(v) // "1234", "kB"
			if len(f) == 0 {
				return 0, fmt.Errorf("parsing VmRSS of pid %d: %q", pid, line)
			}
			return strconv.ParseInt(string(f[0]), 10, 64)
		}
	}
	return 0, nil
}

// pss is 0 for a process with no address space (a zombie).
func pss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Pss:")); ok {
			f := bytes.Fields(v) // "1234", "kB"
			if len(f) == 0 {
				return 0, fmt.Errorf("parsing Pss of pid %d: %q", pid, line)
			}
			return strconv.ParseInt(string(f[0]), 10, 64)
		}
	}
	return 0, nil
}

func childrenByParent() (map[int][]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(string(f[1]))
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], pid)
	}
	return children, nil
}

// sampler records the peak of each part of a process tree's memory until
// stopped.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak Memory
}

// sampleMemory reads the tree under root every interval until Stop, which
// returns the peaks: the server's and its helpers' from the sample where
// their sum was highest, the containers' from the sample where theirs was
// (the two need not be simultaneous).
func sampleMemory(root int, every time.Duration, skip ...int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample(root, skip)
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) sample(root int, skip []int) {
	m, err := readMemory(root, skip...)
	if err != nil {
		return // the root is gone; the peak so far stands
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.TotalServerKB() > s.peak.TotalServerKB() {
		s.peak.ServerKB, s.peak.HelpersKB = m.ServerKB, m.HelpersKB
	}
	if m.ContainersKB > s.peak.ContainersKB {
		s.peak.ContainersKB, s.peak.ContainerProcs = m.ContainersKB, m.ContainerProcs
	}
}

func (s *sampler) Stop() Memory {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}
