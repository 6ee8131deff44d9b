package runtime

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The process runtime's data dir (bundle.Config.DataDir): in namespaces
// of its own, the init binds it at policy.DataDir in the call's own root,
// read-only, nosuid, nodev and noexec all the way down; without
// namespaces it cannot give it at all, and refuses: it never runs a call
// without what the configuration asked.

// dataUnavailable says why the process runtime cannot give b's data dir,
// or nil.
func (r *ProcessRuntime) dataUnavailable(cfg bundle.Config) error {
	if cfg.DataDir == "" {
		return nil
	}
	if !r.iso.Namespaces {
		return fmt.Errorf("%w: {DataDir} is set, and the process runtime without namespaces of its own cannot mount it at %s: "+
			"unset it, or give the process runtime its namespaces ({ProcessNamespaces}), or use a runtime with containers ({Runtime})", ErrUnsupported, policy.DataDir)
	}
	return nil
}

// dataMount is the bind of the data dir the init makes in the call's
// namespaces.
func dataMount(dir string) initproto.Mount {
	return initproto.Mount{Target: policy.DataDir, Type: "bind", Source: dir,
		Flags: unix.MS_BIND | unix.MS_REC | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC}
}
