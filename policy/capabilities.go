package policy

import specs "github.com/opencontainers/runtime-spec/specs-go"

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
