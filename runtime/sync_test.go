package runtime

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// What is kept in sync by hand across packages that may not import one
// another, pinned in one place.
func TestKeptInSync(t *testing.T) {
	// The sandbox's identity: policy's numbers are the rootfs's names.
	if want := fmt.Sprintf("sandbox:x:%d:%d:", policy.UID, policy.GID); !strings.Contains(rootfs.EtcFile("passwd"), want) {
		t.Errorf("rootfs /etc/passwd = %q, want a line starting %q", rootfs.EtcFile("passwd"), want)
	}
	if want := fmt.Sprintf("sandbox:x:%d:", policy.GID); !strings.Contains(rootfs.EtcFile("group"), want) {
		t.Errorf("rootfs /etc/group = %q, want %q", rootfs.EtcFile("group"), want)
	}
	if h := strings.TrimSpace(rootfs.EtcFile("hostname")); h != policy.Hostname || !strings.Contains(rootfs.EtcFile("hosts"), policy.Hostname) {
		t.Errorf("rootfs /etc/hostname %q, hosts %q; want %q", h, rootfs.EtcFile("hosts"), policy.Hostname)
	}

	// Every mount of the spec lands on a mount point the rootfs has, or
	// inside a mount of the spec: nothing is created in the shared rootfs.
	spec := bundle.Spec(bundle.Config{Rootfs: "/r", Python: "/usr/bin/python3", Limits: policy.DefaultLimits(), InitDir: "/i",
		CallCaps: policy.CallCaps{MaxOutputBytes: 1, MaxCodeBytes: 1}})
	points := rootfs.MountPoints()
	for _, m := range spec.Mounts {
		inside := slices.ContainsFunc(spec.Mounts, func(o specs.Mount) bool {
			return o.Destination != m.Destination && strings.HasPrefix(m.Destination, o.Destination+"/")
		})
		if !slices.Contains(points, m.Destination) && !inside {
			t.Errorf("the spec mounts %s, which is no mount point of the rootfs (%v)", m.Destination, points)
		}
	}
	if !slices.Contains(points, bundle.CodeDir) || !slices.Contains(points, bundle.InitDir) {
		t.Errorf("rootfs mount points %v lack %s or %s", points, bundle.CodeDir, bundle.InitDir)
	}

	// runsc is run with every flag the probe requires of it.
	args := (&RunscRuntime{root: "/r", info: host.RunscInfo{Platform: "ptrace"}}).globalArgs()
	for _, f := range host.RunscFlags() {
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--"+f) }) {
			t.Errorf("runsc's global args %v lack --%s, which the probe requires", args, f)
		}
	}

	// The markers of the C init (main.c) are the Go side's: this test binary,
	// started with each, is the init or the holder.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(self, bundle.InitMarker).CombinedOutput()
	if !bytes.Contains(out, []byte("mcp-exec init: usage")) {
		t.Errorf("%s %s printed %q, want the init's usage (INIT_ARG in sandboxinit/main.c)", self, bundle.InitMarker, out)
	}
	cmd := exec.Command(self, initproto.HoldMarker)
	cmd.Stdin = strings.NewReader("") // the holder exits at once when its stdin ends
	out, _ = cmd.CombinedOutput()
	if !bytes.HasPrefix(out, []byte("ok\n")) && !bytes.HasPrefix(out, []byte("error: unshare")) {
		t.Errorf("%s %s printed %q, want the holder's answer (HOLD_ARG in sandboxinit/main.c)", self, initproto.HoldMarker, out)
	}

	// The icon the server sends is the one the registry's server.json names.
	a, errA := os.ReadFile("../deploy/icon.svg")
	b, errB := os.ReadFile("../server/icon.svg")
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Errorf("server/icon.svg differs from deploy/icon.svg (%v, %v): copy it", errA, errB)
	}
}
