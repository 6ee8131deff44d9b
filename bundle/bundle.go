// Package bundle turns the policy, the server's configuration and a rootfs
// path into an OCI bundle: a runtime-spec configuration in a private
// directory.
//
// Invariants a maintainer must keep:
//   - everything the sandbox enforces is in the spec; a runtime adds only
//     where its state lives (the cgroup path), which user namespace a
//     libcontainer sandbox joins (its call slot's), and translates only what
//     it must to give the same effect (runsc turns an ENOSYS rule for a
//     syscall gVisor does not implement into an allow, since this runsc
//     ignores errnoRet and gVisor answers ENOSYS itself, and drops the
//     recursive mount options it refuses, its bind mounts being read-only
//     all the way down by nature);
//   - the spec is built by small named steps in a fixed order, each testable
//     alone, and every value comes from policy or from the Config;
//   - the rootfs is shared by every call and mounted read-only: nothing in
//     the spec may need to create or change a file inside it;
//   - pid 1 is the fixed init (the server's own static executable, bound
//     read-only at InitPath), never the code; the init's configuration
//     (Init), the code, its stdin and its files reach the sandbox only
//     through the init's standard input, never on argv, in the environment
//     or through a host directory, so a bundle is the same for every call
//     and can be prepared before its call.
//
// The package does not know how a bundle is run.
package bundle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

// Paths inside every sandbox. CodeDir and InitDir are mount points every
// rootfs has.
const (
	// CodeDir is a small tmpfs owned by the init; the code is the script
	// CodePath in it.
	CodeDir  = "/code"
	CodePath = CodeDir + "/main.py"
	// InitDir holds the init, bound read-only from the host.
	InitDir  = "/.mcp-exec"
	InitName = "init"
	InitPath = InitDir + "/" + InitName
	// SiteName is the empty dir of the init dir where, with the network
	// on, SiteDir is mounted: pip's per-sandbox user base (PYTHONUSERBASE),
	// a tmpfs of its own (withNetwork). The runtime makes it beside the
	// init.
	SiteName = "site"
	SiteDir  = InitDir + "/" + SiteName
	// CABundlePath is the CA bundle the code's TLS clients trust with the
	// network on, which the init writes read-only in its own CodeDir.
	CABundlePath = CodeDir + "/ca-bundle.pem"
	// InitMarker is the argument that makes the server's executable the
	// sandbox's init (runtime/initproto renders it for the C init).
	InitMarker = "__mcp_exec_init__"
)

// Config is what every call of one server shares.
type Config struct {
	// Rootfs is the absolute path of the read-only Python rootfs.
	Rootfs string
	// Python is the interpreter's absolute path inside the rootfs.
	Python string
	// Limits are the resource limits of each sandbox.
	Limits policy.Limits
	// InitDir is the host directory holding the init, a static executable
	// named InitName; it is bound read-only at InitDir.
	InitDir string
	// CallCaps bound each output stream, the files returned from
	// policy.OutputsDir and the code: the init enforces them inside the sandbox.
	policy.CallCaps
	// Env adds settings to policy.Env; each must be allowed by
	// policy.EnvAllowed.
	Env []string
	// PackagesDir, when set, is a host directory of Python packages bound
	// read-only at PackagesMount, a mount point the rootfs has.
	PackagesDir   string
	PackagesMount string
	// DataDir, when set, is a host directory bound read-only at
	// policy.DataDir (policy.DataMountOptions), a mount point every
	// rootfs the server makes has.
	DataDir string
	// Ahead marks a sandbox prepared before its call (for a pool): it
	// starts at policy.CPUSharesPreparing, and the runtime gives it
	// policy.CPUSharesCall when the call begins.
	Ahead bool
	// Network, when not nil, gives the sandbox the egress relay: the
	// network allowlist is on (docs/network.md). Nil: no network at all.
	Network *Network
	// Template marks the bundle of a template (forked sandboxes): its
	// init and interpreter hold policy.TemplateCapabilities under
	// policy.TemplateSeccomp, to make each fork's sandbox; no caller's code
	// runs in it.
	Template bool
}

// Network is what a sandbox gets with the network allowlist on: its only
// way out is the relay its init holds on 127.0.0.1:RelayPort, which hands
// each connection to the server's egress proxy; it trusts the CA
// certificates Trust returns (asked once per sandbox, as its bundle is
// made: the proxy's CA is renewed while the server runs); and pip installs
// into a tmpfs of its own on the import path.
type Network struct {
	RelayPort int
	Trust     func() []byte
}

// MaxTrustBytes bounds the CA bundle a sandbox is given: the /code tmpfs
// has room for it beside the code.
const MaxTrustBytes = 4 << 20

// Bundle is a bundle directory on disk and the spec written into it.
type Bundle struct {
	ID   string
	Dir  string
	Spec *specs.Spec
	// Config is what the bundle was made from: a runtime makes a
	// template's bundle from a call's (Config.Template).
	Config Config
	// Init is the configuration the runtime hands the sandbox's init.
	Init Init
}

// ConfigPath is the path of the bundle's config.json.
func (b *Bundle) ConfigPath() string { return filepath.Join(b.Dir, "config.json") }

// Validate checks a Config before any bundle is built from it.
func (c Config) Validate() error {
	var errs []error
	for _, p := range []struct{ name, path string }{{"rootfs", c.Rootfs}, {"python", c.Python}, {"init dir", c.InitDir}} {
		if !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("%s path must be absolute, got %q", p.name, p.path))
		}
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.CallCaps.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, kv := range c.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || !policy.EnvAllowed(k) {
			errs = append(errs, fmt.Errorf("environment setting %q is not in the sandbox's allowlist", kv))
		}
	}
	if n := c.Network; n != nil && (n.RelayPort <= 0 || n.RelayPort > 65535 || n.Trust == nil) {
		errs = append(errs, fmt.Errorf("the network's relay port must be 1-65535 and its trust set, got port %d", n.RelayPort))
	}
	if c.DataDir != "" && !filepath.IsAbs(c.DataDir) {
		errs = append(errs, fmt.Errorf("data dir %q must be an absolute path", c.DataDir))
	}
	if (c.PackagesDir == "") != (c.PackagesMount == "") || (c.PackagesDir != "" && (!filepath.IsAbs(c.PackagesDir) || !filepath.IsAbs(c.PackagesMount))) {
		errs = append(errs, fmt.Errorf("packages dir %q and its mount point %q must both be absolute paths, or both empty", c.PackagesDir, c.PackagesMount))
	}
	return errors.Join(errs...)
}

// New creates the bundle directory parent/<id> (mode 0700) and the spec;
// a runtime that reads the spec from disk writes it there (WriteSpec),
// once it has set what is its own. On error nothing is left behind.
func New(parent string, cfg Config, id string) (_ *Bundle, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if id == "" || filepath.Base(id) != id || id == "." || id == ".." {
		return nil, fmt.Errorf("invalid bundle id %q", id)
	}
	dir := filepath.Join(parent, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating bundle dir: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	init := initFor(cfg)
	if len(init.CABundle) > MaxTrustBytes {
		return nil, fmt.Errorf("the sandbox's CA bundle is %d bytes, over %d", len(init.CABundle), MaxTrustBytes)
	}
	return &Bundle{ID: id, Dir: dir, Spec: Spec(cfg), Init: init, Config: cfg}, nil
}

// WriteSpec writes config.json from b.Spec; runtimes that read the bundle
// from disk call it after setting the cgroup path.
func (b *Bundle) WriteSpec() error {
	data, err := jsonMarshal(b.Spec)
	if err != nil {
		return fmt.Errorf("encoding spec: %w", err)
	}
	if err := os.WriteFile(b.ConfigPath(), data, 0o600); err != nil {
		return fmt.Errorf("writing spec: %w", err)
	}
	return nil
}

// Remove deletes the bundle directory; a missing dir is not an error.
func (b *Bundle) Remove() error {
	if err := os.RemoveAll(b.Dir); err != nil {
		return fmt.Errorf("removing bundle %s: %w", b.ID, err)
	}
	return nil
}
