package host

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

func TestChoosePlatform(t *testing.T) {
	for _, tc := range []struct {
		want string
		have []string
		got  string
		err  string
	}{
		{"", []string{"kvm", "ptrace"}, "ptrace", ""},
		{"", []string{"kvm", "ptrace", "systrap"}, "systrap", ""},
		{"", []string{"kvm"}, "", "kvm is used only when asked for"},
		{"", nil, "ptrace", ""},
		{"kvm", []string{"kvm", "ptrace"}, "kvm", ""},
		{"systrap", []string{"kvm", "ptrace"}, "", "offers only kvm, ptrace"},
	} {
		got, _, err := choosePlatform(tc.want, tc.have)
		if got != tc.got || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("choosePlatform(%q, %v) = %q, %v; want %q, error containing %q", tc.want, tc.have, got, err, tc.got, tc.err)
		}
	}
}

func TestMissingPrivileges(t *testing.T) {
	all := capNames(1<<41 - 1)
	root := Host{EUID: 0, InitialUserNS: true, UIDMap: "0 0 4294967295", Capabilities: all,
		CgroupControllers: []string{"memory", "pids", "cpu"}, CgroupWritable: []string{"memory", "pids", "cpu"}}
	for _, tc := range []struct {
		name string
		edit func(*Host)
		kind Runtime
		want []string // substrings of the joined messages; none means no message
	}{
		{"root", func(*Host) {}, Libcontainer, nil},
		{"root runsc", func(*Host) {}, Runsc, nil},
		{"non-root", func(h *Host) { h.EUID = 65532; h.Capabilities = nil; h.CgroupWritable = nil }, Runsc,
			[]string{"root: mcp-exec runs as uid 65532"}},
		{"userns root", func(h *Host) { h.InitialUserNS = false; h.UIDMap = "0 1000 1" }, Libcontainer,
			[]string{`real root: mcp-exec is uid 0 only inside a user namespace (uid_map "0 1000 1")`, "hostUsers: false"}},
		{"no SETPCAP", func(h *Host) {
			h.Capabilities = slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_SETPCAP" })
		},
			Libcontainer, []string{"capabilities CAP_SETPCAP: missing", "bounding set"}},
		{"no SETPCAP runsc", func(h *Host) {
			h.Capabilities = slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_SETPCAP" })
		},
			Runsc, nil},
		{"ro cgroup", func(h *Host) { h.CgroupWritable = []string{"pids", "cpu"} }, Runsc,
			[]string{`writable cgroup "memory"`, "{MemoryBytes}", "read-write"}},
	} {
		h := root
		tc.edit(&h)
		missing := h.missingPrivileges(tc.kind)
		got := Join(missing)
		for _, m := range missing {
			if !m.Privilege {
				t.Errorf("%s: missingPrivileges(%s): %q is not marked a privilege", tc.name, tc.kind, m)
			}
		}
		if len(tc.want) == 0 && got != "" {
			t.Errorf("%s: missingPrivileges(%s) = %q, want nothing", tc.name, tc.kind, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: missingPrivileges(%s) = %q, want it to contain %q", tc.name, tc.kind, got, w)
			}
		}
	}
}

// The container engine's settings are given once per runtime and grant
// exactly what the runtime needs.
func TestFixInContainer(t *testing.T) {
	for _, tc := range []struct {
		kind       Runtime
		docker     []string
		kubernetes []string
	}{
		{Libcontainer, []string{"--user 0:0", "--cap-add SYS_ADMIN", "--cap-add NET_ADMIN", "--cap-add SYS_PTRACE", "seccomp=unconfined",
			"apparmor=unconfined", "systempaths=unconfined", "--cgroupns=host", "/sys/fs/cgroup:/sys/fs/cgroup:rw"},
			[]string{"runAsUser: 0", "SETPCAP", "SYS_PTRACE", "procMount: Unmasked", "gVisor RuntimeClass"}},
		{Runsc, []string{"--user 0:0", "--cap-add SYS_ADMIN", "seccomp=unconfined"}, []string{"runAsUser: 0", "SYS_CHROOT"}},
	} {
		f := FixInContainer(tc.kind)
		for _, w := range tc.docker {
			if !strings.Contains(f.Docker, w) {
				t.Errorf("FixInContainer(%s).Docker = %q, want %q in it", tc.kind, f.Docker, w)
			}
		}
		for _, w := range tc.kubernetes {
			if !strings.Contains(f.Kubernetes, w) {
				t.Errorf("FixInContainer(%s).Kubernetes = %q, want %q in it", tc.kind, f.Kubernetes, w)
			}
		}
	}
	if f := FixInContainer(Runsc); strings.Contains(f.Docker, "NET_ADMIN") {
		t.Errorf("FixInContainer(runsc).Docker = %q: runsc needs no NET_ADMIN", f.Docker)
	}
}

// TestProbeRunsc checks what doctor shows of runsc on this host.
func TestProbeRunsc(t *testing.T) {
	testenv.Real(t)
	h := Probe()
	info := ProbeRunsc(context.Background(), h, "", "")
	if info.Path == "" {
		testenv.Missing(t, "runsc is not installed: %v", Join(info.Missing))
	}
	if info.Platform == "kvm" {
		t.Errorf("probed platform kvm: kvm must never be picked unless asked for")
	}
	if !info.OCISeccomp {
		t.Errorf("OCISeccomp false for %s %s", info.Path, info.Version)
	}
	data, _ := json.Marshal(info)
	if !bytes.Contains(data, []byte(`"limits"`)) {
		t.Errorf("RunscInfo JSON %s has no limits field", data)
	}
	bad := ProbeRunsc(context.Background(), h, "", "no-such-platform")
	if bad.Available() || !strings.Contains(Join(bad.Missing), "no-such-platform") {
		t.Errorf("ProbeRunsc with platform no-such-platform: missing %v, want it named", bad.Missing)
	}
	none := ProbeRunsc(context.Background(), h, "/nonexistent/runsc", "")
	if none.Available() || !strings.Contains(Join(none.Missing), "{RunscPath}=/nonexistent/runsc") {
		t.Errorf("ProbeRunsc with a missing binary: missing %v, want {RunscPath} named", none.Missing)
	}
	// The default is the pinned current gVisor where it is installed
	// (CI installs it: .ci/install-runsc), on systrap.
	if _, err := os.Stat(PinnedRunsc); err != nil {
		testenv.Missing(t, "the pinned gVisor is not installed at %s (make runsc)", PinnedRunsc)
	} else if info.Path != PinnedRunsc || info.Platform != "systrap" {
		t.Errorf("default runsc %s on %s, want %s on systrap", info.Path, info.Platform, PinnedRunsc)
	}
}
