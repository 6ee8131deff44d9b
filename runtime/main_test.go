package runtime_test

import (
	"os"
	goruntime "runtime"
	"testing"

	"github.com/opencontainers/runc/libcontainer"
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
	"github.com/sirupsen/logrus"

	"github.com/inhuman/mcp-exec/runtime"
	// The test binary is the sandboxes' init too, as the server is.
	_ "github.com/inhuman/mcp-exec/runtime/sandboxinit"
)

// The test binary starts containers, so like the server it must become the
// container's init when libcontainer re-executes it as "init".
func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
	runtime.RunWatchdogIfAsked()
	// See cmd/mcp-exec/init.go: keep the main thread out of libcontainer's
	// locked helper threads, which would pin a container's mounts.
	goruntime.LockOSThread()
}

func TestMain(m *testing.M) {
	// As in the server's main: libcontainer's own warnings (such as that it
	// ignores the spec's KernelTCP, which the runtime applies itself) are
	// not the tests' output.
	logrus.SetLevel(logrus.ErrorLevel)
	os.Exit(m.Run())
}
