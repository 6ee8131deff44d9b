package runtime

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/inhuman/mcp-exec/bundle"
)

// installInit copies this executable into dir as bundle.InitName, for the
// sandboxes to run as their init, beside the empty mount point of pip's
// site dir (bundle.SiteName), which sandboxes with the network have. A
// copy, not the installed file: an upgrade of the binary on disk must not
// change what running servers' sandboxes start, and the instance dir is
// removed with the instance.
func installInit(dir string) error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("opening this executable: %w", err)
	}
	defer self.Close()
	if err := checkInitBinary(self); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating the init dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("creating the init dir: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, bundle.SiteName), 0o755); err != nil {
		return fmt.Errorf("creating the init dir: %w", err)
	}
	dst := filepath.Join(dir, bundle.InitName)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return fmt.Errorf("installing the init: %w", err)
	}
	if _, err := io.Copy(out, io.NewSectionReader(self, 0, 1<<40)); err != nil {
		out.Close()
		return fmt.Errorf("installing the init: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("installing the init: %w", err)
	}
	return os.Chmod(dst, 0o555)
}

// checkInitBinary refuses a dynamically linked executable: the init runs
// inside the sandbox's root filesystem, whose libraries (if it has any
// at all) are not this executable's.
func checkInitBinary(f *os.File) error {
	e, err := elf.NewFile(f)
	if err != nil {
		return fmt.Errorf("reading this executable: %w", err)
	}
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: this executable is dynamically linked, but it is also the sandbox's init and must run "+
				"in any root filesystem: build it statically (make build, which links with -extldflags=-static)", ErrUnsupported)
		}
	}
	return nil
}
