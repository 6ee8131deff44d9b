package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/specconv"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
)

// callCgroup is the cgroup of one runsc call, created by us before runsc
// starts, with the limits of the spec. runsc finds it there and joins the
// sandbox, the gofer and the ptrace stubs to it without owning it ("Using
// pre-created cgroup"), so it survives `runsc run` and the verdict can be
// read from it. It is created with the same code libcontainer uses, so both
// runtimes enforce the spec's resources identically.
type callCgroup struct {
	rel   string            // path relative to every hierarchy root
	paths map[string]string // controller ("" on v2) → absolute path
}

// newCallCgroup creates the cgroup at b's cgroups path and applies the
// spec's resources. It fails, leaving nothing, when a controller that
// enforces a limit is missing.
func newCallCgroup(b *bundle.Bundle) (_ *callCgroup, retErr error) {
	cfg, err := specconv.CreateCgroupConfig(&specconv.CreateOpts{CgroupName: b.ID, Spec: b.Spec}, nil)
	if err != nil {
		return nil, fmt.Errorf("converting resources: %w", err)
	}
	m, err := manager.New(cfg)
	if err != nil {
		return nil, err
	}
	c := &callCgroup{rel: b.Spec.Linux.CgroupsPath, paths: m.GetPaths()}
	defer func() {
		if retErr != nil {
			c.remove()
		}
	}()
	if err := m.Apply(-1); err != nil {
		return nil, fmt.Errorf("creating: %w", err)
	}
	c.paths = m.GetPaths()
	if err := m.Set(cfg.Resources); err != nil {
		return nil, fmt.Errorf("setting limits: %w", err)
	}
	if !cgroups.IsCgroup2UnifiedMode() {
		for _, ctrl := range host.RequiredControllers() {
			if _, ok := c.paths[ctrl]; !ok {
				return nil, fmt.Errorf("controller %q is not mounted: its limit could not be enforced", ctrl)
			}
		}
	} else if _, ok := c.paths[""]; !ok {
		return nil, errors.New("no cgroup v2 path")
	}
	return c, nil
}

// dirs returns every directory of the call's cgroup: the manager's ones and
// any a runsc created on a hierarchy the manager does not know.
func (c *callCgroup) dirs() []string {
	var dirs []string
	for _, p := range c.paths {
		dirs = append(dirs, p)
	}
	for _, mnt := range cgroupMounts() {
		dirs = append(dirs, filepath.Join(mnt, c.rel))
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// kill SIGKILLs every process in the call's cgroups.
func (c *callCgroup) kill() {
	for _, d := range c.dirs() {
		killCgroupProcs(d)
	}
}

// stats fills the verdict's OOM flag, peak memory and CPU time. An OOM kill
// in gVisor usually ends the whole sandbox (the kernel picks the sentry),
// and the code's status is then 137; the cgroup's counter is what tells it
// from a program that killed itself.
func (c *callCgroup) stats(res *Result) { cgroupVerdict(c.paths, res) }

// remove kills what is left in the call's cgroups and removes them,
// deepest first.
func (c *callCgroup) remove() error {
	var errs []error
	dirs := c.dirs()
	for i := len(dirs) - 1; i >= 0; i-- {
		var sub []string
		filepath.WalkDir(dirs[i], func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				sub = append(sub, p)
			}
			return nil
		})
		for j := len(sub) - 1; j >= 0; j-- {
			if err := removeCgroup(sub[j]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
