package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The process runtime with the network allowlist on. Only a call in
// namespaces of its own gets it: its init's relay listens on the call's
// own lo, which nothing outside the call can reach, and the code's
// filter (policy.ProcessSeccompNetwork) lets it make the IPv4 socket that
// reaches it, while its Landlock domain (ABI 4 and later) may connect to
// the relay's port and bind none. Without namespaces the relay would
// listen on the machine's loopback, where any process of the machine could
// use the call's allowlist and the credentials the proxy adds, and the
// code's TCP would be the machine's: the runtime refuses.

// ErrNetworkUnsupported refines ErrUnsupported: this runtime cannot give
// its calls the network allowlist here, and refuses rather than run them
// with another network than configured.
var ErrNetworkUnsupported = errors.New("the network allowlist cannot be given here")

// networkRefusal is an ErrNetworkUnsupported (and so ErrUnsupported) that
// says why in its own words.
type networkRefusal string

func (e networkRefusal) Error() string { return string(e) }
func (e networkRefusal) Is(target error) bool {
	return target == ErrNetworkUnsupported || target == ErrUnsupported
}

// errNoNetworkWithoutNamespaces names what the process runtime cannot give.
var errNoNetworkWithoutNamespaces = networkRefusal("{Allow} is set, but the process runtime without namespaces of its own " +
	"cannot give a call the network allowlist: its egress relay would listen on the machine's own loopback, where any " +
	"process of the machine could use it, and the code's connections would be the machine's; run it where it can make " +
	"the call's namespaces (doctor says what this host refuses; {ProcessNamespaces}), use a container runtime " +
	"({Runtime}=libcontainer or runsc), or unset {Allow}")

// NetworkUsable says whether this runtime can give its calls the network
// allowlist: nil, or why not.
func (r *ProcessRuntime) NetworkUsable() error {
	if !r.iso.Namespaces {
		return errNoNetworkWithoutNamespaces
	}
	if r.iso.Seccomp && r.seccompNet == nil {
		return networkRefusal("{Allow} is set, but the process runtime's filter with IPv4 sockets could not be compiled")
	}
	return nil
}

// siteDir is the call's pip site dir (bundle.SiteDir in a container).
func siteDir(b *bundle.Bundle) string { return filepath.Join(b.Dir, bundle.SiteName) }

// makeSiteDir makes the call's site dir, the mount point of its tmpfs.
func makeSiteDir(b *bundle.Bundle) error {
	if err := os.Mkdir(siteDir(b), 0o700); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	return nil
}

// withNetwork adds the network to a call's init configuration: the relay,
// the CA bundle in the script's dir, the site dir (a tmpfs of the memory
// limit's size, the call's own, writable by the code, not noexec) and the
// filter with IPv4 sockets.
func (r *ProcessRuntime) withNetwork(b *bundle.Bundle, in *bundle.Init, p *initproto.Process, code string, uid, gid int) (seccomp []byte, err error) {
	if err := r.NetworkUsable(); err != nil {
		return nil, err
	}
	in.CABundlePath = filepath.Join(code, filepath.Base(bundle.CABundlePath))
	site := siteDir(b)
	p.Write = append(p.Write, site)
	p.Read = append(p.Read, policy.ProcessNetworkReadable()...)
	// In the call's own root, pip finds what it reads of the system too.
	p.Namespaces.Root = rootPaths(append(p.Namespaces.Root, policy.ProcessNetworkReadable()...))
	p.Namespaces.Mounts = append(p.Namespaces.Mounts,
		tmpfsMount(site, []string{"nosuid", "nodev", fmt.Sprintf("size=%d", b.Config.Limits.MemoryBytes)}, fmt.Sprintf("mode=0700,uid=%d,gid=%d", uid, gid)))
	return r.seccompNet, nil
}

// networkEnv is the sandbox's environment with the container's paths of
// the network's files (bundle.NetworkEnv) the call's own.
func networkEnv(env []string, b *bundle.Bundle, code string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case v == bundle.CABundlePath:
			kv = k + "=" + filepath.Join(code, filepath.Base(bundle.CABundlePath))
		case v == bundle.SiteDir:
			kv = k + "=" + siteDir(b)
		}
		out = append(out, kv)
	}
	return out
}

// compileNetworkSeccomp compiles the filter of calls with the network.
func compileNetworkSeccomp() ([]byte, error) { return compileSeccomp(policy.ProcessSeccompNetwork()) }
