package policy

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Capabilities returns the capability sets of the sandboxed process: all five
// empty. Python needs none, and with an empty bounding set and no_new_privs
// nothing the code runs can gain one, setuid binaries included.
func Capabilities() *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{
		Bounding:    []string{},
		Effective:   []string{},
		Inheritable: []string{},
		Permitted:   []string{},
		Ambient:     []string{},
	}
}

// InitCapabilities returns the capability sets of the sandbox's init, the
// fixed program that is pid 1 (never the code): what it needs to start the
// code as UID/GID with nothing, and to end it. It runs as the container's
// root, which only a user namespace of the call maps to a host uid, so
// these grant nothing outside the sandbox.
func InitCapabilities() *specs.LinuxCapabilities {
	caps := []string{
		"CAP_SETUID",  // the code runs as UID; input and output files are written and read as UID (setfsuid)
		"CAP_SETGID",  // the code runs as GID, with no supplementary group
		"CAP_SETPCAP", // the code's bounding set is emptied before it starts
		"CAP_KILL",    // every process of the code (another uid) is killed when its main process ends
	}
	return &specs.LinuxCapabilities{
		Bounding:    slices.Clone(caps),
		Effective:   slices.Clone(caps),
		Permitted:   slices.Clone(caps),
		Inheritable: []string{},
		Ambient:     []string{},
	}
}

// TemplateCapabilities returns the capability sets of a template's init and
// its interpreter (forked sandboxes): the init's, and what making a call's
// sandbox takes — new mount, pid, network, ipc, uts and cgroup namespaces
// and the mounts in them (CAP_SYS_ADMIN), lo brought up in the new network
// namespace (CAP_NET_ADMIN), the code's process joining the call's mount
// namespace (CAP_SYS_CHROOT). Like the init's, they hold only in the call
// slot's user namespace. No caller's code runs with them: each fork
// empties all five sets before it reads any code, and the call's init
// keeps no more than InitCapabilities once the sandbox is made.
func TemplateCapabilities() *specs.LinuxCapabilities {
	c := InitCapabilities()
	for _, add := range []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_CHROOT"} {
		c.Bounding = append(c.Bounding, add)
		c.Effective = append(c.Effective, add)
		c.Permitted = append(c.Permitted, add)
	}
	return c
}
