package runtime

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// What the probe finds becomes what each call gets and what the host
// lacks, named for the log, the tool's description and doctor.
func TestReadProbe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		line     string
		root     bool
		landlock int
		seccomp  bool
		missing  []string
	}{
		{"everything, root", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=0\n", true, 7, true, nil},
		{"everything, unprivileged", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=0\n", false, 7, true, []string{"a uid per call"}},
		{"no Landlock", "landlock=0 subreaper=0 nnp=0 seccomp=0\n", true, 0, true, []string{"Landlock"}},
		{"Landlock refused by a profile", "landlock=7 subreaper=0 nnp=0 restrict=1 seccomp=0\n", true, 0, true, []string{"a Landlock domain"}},
		{"no scoping", "landlock=5 subreaper=0 nnp=0 restrict=0 seccomp=0\n", true, 5, true, []string{"Landlock scoping (ABI 6)"}},
		{"no seccomp", "landlock=7 subreaper=0 nnp=0 restrict=0 seccomp=22\n", true, 7, false, []string{"seccomp"}},
		{"no subreaper", "landlock=7 subreaper=1 nnp=0 restrict=0 seccomp=0\n", true, 7, true, []string{"the child subreaper"}},
		{"nothing said", "", false, 0, false, []string{"Landlock", "seccomp", "the child subreaper", "a uid per call"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			iso := readProbe([]byte(tc.line), 65532, tc.root)
			var names []string
			for _, m := range iso.Missing {
				names = append(names, m.What)
				if m.Why == "" || m.Fix == "" {
					t.Errorf("%s: missing %q says no why or fix", tc.name, m.What)
				}
			}
			if iso.Landlock != tc.landlock || iso.Seccomp != tc.seccomp || strings.Join(names, ",") != strings.Join(tc.missing, ",") {
				t.Errorf("readProbe(%q) = Landlock %d, seccomp %v, missing %v; want %d, %v, %v", tc.line, iso.Landlock, iso.Seccomp, names, tc.landlock, tc.seccomp, tc.missing)
			}
		})
	}
}

// What each call gets, as the tool's description and doctor say it,
// follows what the runtime gives: namespaces or not.
func TestProcessSummary(t *testing.T) {
	for _, tc := range []struct {
		name      string
		iso       ProcessIsolation
		want, not []string
	}{
		{"namespaces", ProcessIsolation{Namespaces: true, Landlock: 7, Seccomp: true, Subreaper: true},
			[]string{"namespaces of its own", "sees only its own processes", "no network interface but lo", "tmpfs of the /tmp size",
				"a root of its own", "no socket", "no cgroups of its own"},
			[]string{"no namespaces", "without a name", "unix sockets"}},
		{"without", ProcessIsolation{Landlock: 7, Seccomp: true, Subreaper: true},
			[]string{"of /proc it sees only its own main process, not its network", "those it holds without a name included",
				"no namespaces or cgroups", "no IP or unix sockets"},
			[]string{"namespaces of its own", "tmpfs", "root of its own"}},
	} {
		got := tc.iso.Summary()
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: Summary() = %q, want it to say %q", tc.name, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: Summary() = %q, want it not to say %q", tc.name, got, n)
			}
		}
	}
}

// Without namespaces, doctor names what is missing, what it costs and the
// fix: the host's reason when it refused them, the setting when it is off.
func TestNamespacesMissing(t *testing.T) {
	refused := namespacesMissing(errors.New("unshare: operation not permitted"), false)
	off := namespacesMissing(nil, false)
	root := namespacesMissing(errors.New("clone: operation not permitted"), true)
	if !strings.Contains(root.Fix, "CAP_SYS_ADMIN") || !strings.Contains(root.Fix, "clone: operation not permitted") {
		t.Errorf("namespacesMissing(refused, root) = %+v, want CAP_SYS_ADMIN and the host's reason", root)
	}
	if refused.What != "namespaces of its own" || !strings.Contains(refused.Fix, "unshare: operation not permitted") ||
		!strings.Contains(refused.Fix, "systempaths=unconfined") || !strings.Contains(refused.Why, "netlink") {
		t.Errorf("namespacesMissing(refused) = %+v, want the host's reason, the container fix and the cost", refused)
	}
	if !strings.Contains(off.Fix, "{ProcessNamespaces}") || strings.Contains(off.Fix, "seccomp") {
		t.Errorf("namespacesMissing(nil) = %+v, want the setting named as the fix", off)
	}
	for _, s := range []string{"auto", "true", "false"} {
		if n, err := ParseNamespaces(s); err != nil || string(n) != s {
			t.Errorf("ParseNamespaces(%q) = %q, %v", s, n, err)
		}
	}
	if _, err := ParseNamespaces("yes"); err == nil {
		t.Errorf("ParseNamespaces(yes) = nil error, want one")
	}
}

// A call's own root holds each path the code may read or run once, none
// below another (the bind brings it), and not what the init mounts
// fresh: /proc, /sys, the call's own dirs.
func TestRootPaths(t *testing.T) {
	got := rootPaths([]string{"/usr", "/etc/ssl", "/proc", "/sys/devices/system/cpu", "/usr/bin/python3.11", "/etc/ssl/certs",
		"/etc", "/lib64", "/lib64/ld-linux-x86-64.so.2", "/w/work", "/w/code", "/w/lib", "relative", "/usr/", "/etc-x"}, "/w/work", "/w/code")
	want := []string{"/etc", "/etc-x", "/lib64", "/usr", "/w/lib"}
	if !slices.Equal(got, want) {
		t.Errorf("rootPaths = %v, want %v", got, want)
	}
}

// A call's tmpfs has the container's /tmp options, as mount(2) takes them,
// and is the call's own.
func TestTmpfsMount(t *testing.T) {
	got := tmpfsMount("/w", []string{"nosuid", "noexec", "nodev", "mode=1777", "size=8388608"}, "mode=0700,uid=7,gid=8")
	want := initproto.Mount{Target: "/w", Type: "tmpfs", Source: "tmpfs", Data: "mode=0700,uid=7,gid=8,size=8388608",
		Flags: unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV}
	if got != want {
		t.Errorf("tmpfsMount = %+v, want %+v", got, want)
	}
	if got := tmpfsMount("/c", []string{"ro", "mode=755"}, ""); got.Data != "mode=755" || got.Flags != unix.MS_RDONLY {
		t.Errorf("tmpfsMount without an owner = %+v, want the spec's mode and ro", got)
	}
}
