//go:build !(cgo && seccomp)

package runtime

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// compileSeccomp: without libseccomp (-tags seccomp) there is no filter to
// hand the process runtime's init, which then refuses to start the code.
func compileSeccomp(*specs.LinuxSeccomp) ([]byte, error) {
	return nil, fmt.Errorf("%w: this binary was built without seccomp support (build with -tags seccomp)", ErrUnsupported)
}
