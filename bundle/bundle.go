// Package bundle turns the policy, one call's input and a rootfs path into an
// OCI bundle: a runtime-spec configuration and a private directory holding
// it and the call's code.
//
// Invariants a maintainer must keep:
//   - everything the sandbox enforces is in the spec; a runtime adds nothing
//     but where its state lives (the cgroup path), and translates only what
//     it must to give the same effect (runsc turns an ENOSYS rule for a
//     syscall gVisor does not implement into an allow, since this runsc
//     ignores errnoRet and gVisor answers ENOSYS itself);
//   - the spec is built by small named steps in a fixed order, each testable
//     alone, and every value comes from policy or from the Config;
//   - the rootfs is shared by every call and mounted read-only: nothing in
//     the spec may need to create or change a file inside it;
//   - the code reaches the sandbox as a read-only file, never on argv or in
//     the environment.
//
// The package does not know how a bundle is run.
package bundle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

// Where the per-call code lives inside the sandbox. CodeDir is a mount
// point every rootfs has.
const (
	CodeDir  = "/code"
	codeFile = "main.py"
	CodePath = CodeDir + "/" + codeFile
)

// Config is what every call of one server shares.
type Config struct {
	// Rootfs is the absolute path of the read-only Python rootfs.
	Rootfs string
	// Python is the interpreter's absolute path inside the rootfs.
	Python string
	// Limits are the resource limits of each sandbox.
	Limits policy.Limits
}

// Input is what one call brings.
type Input struct {
	// ID names the container, its cgroup and its bundle directory.
	ID string
	// Code is the Python source, run as the script __main__.
	Code []byte
}

// Bundle is a bundle directory on disk and the spec written into it.
type Bundle struct {
	ID   string
	Dir  string
	Spec *specs.Spec
}

// ConfigPath is the path of the bundle's config.json.
func (b *Bundle) ConfigPath() string { return filepath.Join(b.Dir, "config.json") }

// Validate checks a Config before any bundle is built from it.
func (c Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.Rootfs) {
		errs = append(errs, fmt.Errorf("rootfs path must be absolute, got %q", c.Rootfs))
	}
	if !filepath.IsAbs(c.Python) {
		errs = append(errs, fmt.Errorf("python path must be absolute, got %q", c.Python))
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// New creates the bundle directory parent/<in.ID> (mode 0700) with the
// spec in config.json and the code in a read-only file. On error nothing is
// left behind.
func New(parent string, cfg Config, in Input) (_ *Bundle, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in.ID == "" || filepath.Base(in.ID) != in.ID || in.ID == "." || in.ID == ".." {
		return nil, fmt.Errorf("invalid bundle id %q", in.ID)
	}
	dir := filepath.Join(parent, in.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating bundle dir: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	codeDir := filepath.Join(dir, "code")
	if err := os.Mkdir(codeDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating code dir: %w", err)
	}
	// World-readable: the code runs as an unprivileged uid that must read
	// it through the bind mount; the bundle dir above stays 0700.
	if err := os.WriteFile(filepath.Join(codeDir, codeFile), in.Code, 0o444); err != nil {
		return nil, fmt.Errorf("writing code: %w", err)
	}
	if err := os.Chmod(codeDir, 0o555); err != nil {
		return nil, fmt.Errorf("sealing code dir: %w", err)
	}
	b := &Bundle{ID: in.ID, Dir: dir, Spec: Spec(cfg, codeDir)}
	if err := b.WriteSpec(); err != nil {
		return nil, err
	}
	return b, nil
}

// WriteSpec (re)writes config.json from b.Spec; runtimes that read the
// bundle from disk call it after setting the cgroup path.
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

// Remove deletes the bundle directory. The code dir is read-only, so it is
// made writable first; a missing dir is not an error.
func (b *Bundle) Remove() error {
	if _, err := os.Lstat(b.Dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	os.Chmod(filepath.Join(b.Dir, "code"), 0o700)
	if err := os.RemoveAll(b.Dir); err != nil {
		return fmt.Errorf("removing bundle %s: %w", b.ID, err)
	}
	return nil
}
