package initproto

import (
	"bytes"
	"encoding/binary"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
)

var update = flag.Bool("update", false, "rewrite the sandbox init's initproto.h from this package")

// header is where the C side's definitions are checked in.
var header = filepath.Join("..", "sandboxinit", "initproto.h")

// The C side's definitions are rendered from this package: the header that
// is checked in is the one the Go side would write.
func TestInitProtocol(t *testing.T) {
	want := Header()
	if *update {
		if err := os.WriteFile(header, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from what this package defines: run go test ./runtime/initproto -run TestInitProtocol -update\n got:\n%s\nwant:\n%s", header, got, want)
	}
	seen := map[string]bool{}
	for _, d := range protocol {
		if seen[d.name] {
			t.Errorf("%s is defined twice", d.name)
		}
		seen[d.name] = true
	}
	// A frame's letter names it in both directions: a trace of the
	// conversation reads without knowing who sent what.
	letters := map[byte]string{}
	for _, d := range protocol {
		b, ok := d.value.(byte)
		if !ok || !(strings.HasPrefix(d.name, "H_") || strings.HasPrefix(d.name, "I_")) {
			continue
		}
		if other, dup := letters[b]; dup {
			t.Errorf("%s and %s are both %q", other, d.name, b)
		}
		letters[b] = d.name
	}
	keys := map[uint16]bool{}
	for _, f := range fields {
		if seen[f.name] || keys[f.key] {
			t.Errorf("%s (key %d) is defined twice", f.name, f.key)
		}
		seen[f.name], keys[f.key] = true, true
	}
}

// Every @NAME@ of the interpreter's program is one the protocol defines.
func TestDriverNames(t *testing.T) {
	for _, name := range []string{"driver.py", "zygote.py"} {
		src, err := os.ReadFile(filepath.Join("..", "sandboxinit", name))
		if err != nil {
			t.Fatal(err)
		}
		if !placeholder.Match(src) {
			t.Errorf("%s names nothing of the protocol: is it still the program?", name)
		}
		out := Render(string(src)) // panics on a name it does not know
		if placeholder.MatchString(out) {
			t.Errorf("%s: a name is left after rendering", name)
		}
	}
}

// fieldsOf decodes a config frame's payload as the C side does, key by
// key.
func fieldsOf(t *testing.T, p []byte) map[uint16][][]byte {
	t.Helper()
	m := map[uint16][][]byte{}
	for len(p) > 0 {
		if len(p) < 6 {
			t.Fatalf("a field's head is cut short: %x", p)
		}
		key, n := binary.BigEndian.Uint16(p), binary.BigEndian.Uint32(p[2:])
		if uint32(len(p)-6) < n {
			t.Fatalf("field %d is cut short", key)
		}
		m[key] = append(m[key], p[6:6+n])
		p = p[6+n:]
	}
	return m
}

func num(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// Each kind of configuration sends its fields and no other: a container's
// init is told nothing of the process runtime's or a fork's setup.
func TestEncode(t *testing.T) {
	Link("# driver @D_VALUE@\n", "# zygote @Z_FORK@\n")
	init := bundle.Init{UID: 65532, GID: 65532, MaxOutputBytes: 10, MaxFiles: 2, MaxFileBytes: 30, WorkDir: "/tmp",
		Script: "/code/main.py", Argv: []string{"/usr/bin/python3", "-I", "/code/main.py"},
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 5, Hard: 6}}}
	fresh := &Fresh{Mounts: []Mount{{Target: "/proc", Type: "proc", Source: "proc", Flags: 7}}, Masked: []string{"/proc/kcore"},
		Readonly: []string{"/proc/sys"}, Hostname: "sandbox", LoopbackMTU: 1500, KeepCaps: 3}
	for _, tc := range []struct {
		name string
		c    Config
		has  []uint16
	}{
		{"a container's", Config{Init: init}, []uint16{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"a template's", Config{Init: init, Template: true}, []uint16{1, 2, 3, 4, 5, 6, 7, 8, 9, 19}},
		{"a fork's", Config{Init: init, Forked: fresh, Seccomp: make([]byte, 8)}, []uint16{1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 20, 21, 22, 23, 24, 25}},
		{"the process runtime's", Config{Init: init, NoParentDeath: true, Process: &Process{Landlock: 7, Read: []string{"/usr"}, ScratchBytes: 9}},
			[]uint16{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 18}},
		{"the process runtime's in namespaces", Config{Init: init, Process: &Process{Namespaces: fresh, ProcSelf: true}},
			[]uint16{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 18, 20, 21, 22, 23, 24, 25, 26, 27}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.c.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got := fieldsOf(t, p)
			for _, k := range tc.has {
				if len(got[k]) == 0 {
					t.Errorf("key %d is missing", k)
				}
				delete(got, k)
			}
			for k := range got {
				t.Errorf("key %d is sent, and should not be", k)
			}
		})
	}
	p, _ := (&Config{Init: init, Template: true}).Encode()
	f := fieldsOf(t, p)
	args := []string{}
	for _, a := range f[8] {
		args = append(args, string(a))
	}
	if want := "/usr/bin/python3 -I -c # driver v\n# zygote k\n /code/main.py --mcp-exec-template"; strings.Join(args, " ") != want {
		t.Errorf("a template's command line: %q, want %q", strings.Join(args, " "), want)
	}
	if rl := f[9][0]; !bytes.Equal(rl[4:], append(num(5), num(6)...)) {
		t.Errorf("the rlimit field: %x", rl)
	}
}

// What the init could not take whole is refused before it is sent.
func TestEncodeRefuses(t *testing.T) {
	Link("# driver\n", "# zygote\n")
	ok := bundle.Init{WorkDir: "/tmp", Script: "/x", Argv: []string{"/p", "/x"}}
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"a NUL byte", Config{Init: bundle.Init{WorkDir: "/t\x00", Script: "/x", Argv: []string{"/p", "/x"}}}, "NUL byte"},
		{"no script", Config{Init: bundle.Init{WorkDir: "/tmp", Argv: []string{"/p"}}}, "empty strings"},
		{"no interpreter", Config{Init: bundle.Init{WorkDir: "/tmp", Script: "/x", Argv: []string{"/x"}}}, "no interpreter"},
		{"an unknown rlimit", Config{Init: bundle.Init{WorkDir: "/tmp", Script: "/x", Argv: []string{"/p", "/x"},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOPE"}}}}, "unknown rlimit"},
		{"both fresh setups", Config{Init: ok, Forked: &Fresh{Hostname: "h"}, Process: &Process{Namespaces: &Fresh{Hostname: "h"}}}, "both"},
		{"a mount with no type", Config{Init: ok, Forked: &Fresh{Hostname: "h", Mounts: []Mount{{Target: "/proc", Source: "proc"}}}}, `mount "/proc"`},
	} {
		if _, err := tc.c.Encode(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
