package runtime_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// Files in and out of a call.

// Input files are written under /tmp as the code's user before it starts;
// /tmp/outputs starts empty and its regular files come back, never what a
// symlink points to, never a device or a FIFO, within the limits.
func TestFilesInAndOut(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession, func(t *testing.T, h *harness) {
		h.cfg.MaxFiles, h.cfg.MaxFileBytes = 5, 1<<20
		// Relative to the working dir: /tmp in a container, the process
		// runtime's call dir.
		res := h.mustRun(`import json, os, stat
st = os.stat("data/in.csv")
out = {"csv": open("data/in.csv").read(), "bin": list(open("raw.bin", "rb").read()),
       "owner": [st.st_uid, st.st_gid], "outputs": os.listdir("outputs"),
       "outputs_owner": os.stat("outputs").st_uid, "me": [os.getuid(), os.getgid()]}
os.makedirs("outputs/sub/deeper")
open("outputs/result.txt", "w").write("rows=2\n")
open("outputs/sub/deeper/data.bin", "wb").write(bytes(range(256)))
os.symlink("/etc/passwd", "outputs/link")
os.symlink(os.path.abspath("data"), "outputs/dirlink")
os.mkfifo("outputs/fifo")
with open("outputs/sparse", "wb") as f:
    # Over the 1 MiB limit; the process runtime bounds a file's size at
    # the /tmp size (RLIMIT_FSIZE), a tmpfs only its blocks.
    f.truncate(1 << 40 if os.getcwd() == "/tmp" else 2 << 20)
print(json.dumps(out))`, withFiles(
			runtime.File{Path: "data/in.csv", Data: []byte("a,b\n1,2\n")},
			runtime.File{Path: "raw.bin", Data: []byte{0, 1, 2, 255}},
		))
		var got struct {
			CSV          string `json:"csv"`
			Bin          []int  `json:"bin"`
			Owner        []int  `json:"owner"`
			Outputs      []string
			OutputsOwner int   `json:"outputs_owner"`
			Me           []int `json:"me"`
		}
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("probe: %v\n%s\n%s", err, res.Stdout, res.Stderr)
		}
		if got.CSV != "a,b\n1,2\n" || !slices.Equal(got.Bin, []int{0, 1, 2, 255}) {
			t.Errorf("input files read back as %q, %v", got.CSV, got.Bin)
		}
		if !slices.Equal(got.Owner, got.Me) || got.OutputsOwner != got.Me[0] || (h.kind != runtime.Process && got.Me[0] != policy.UID) {
			t.Errorf("input file owner %v, /tmp/outputs owner %d, the code %v; want the sandbox's user", got.Owner, got.OutputsOwner, got.Me)
		}
		if len(got.Outputs) != 0 {
			t.Errorf("/tmp/outputs started with %v, want empty", got.Outputs)
		}
		var paths []string
		for _, f := range res.Files {
			paths = append(paths, f.Path)
		}
		if want := []string{"result.txt", "sub/deeper/data.bin"}; !slices.Equal(paths, want) {
			t.Errorf("output files %v, want %v (no symlink, FIFO or sparse 1 TiB file)", paths, want)
		}
		for _, f := range res.Files {
			if f.Path == "sub/deeper/data.bin" && (len(f.Data) != 256 || f.Data[255] != 255) {
				t.Errorf("data.bin came back as %d bytes", len(f.Data))
			}
		}
		if !res.FilesTruncated {
			t.Errorf("files_truncated = false, want true: the sparse file is over the limit")
		}
	})
}

// What the code leaves cannot make the return of files slow or large: a
// hundred thousand files, a deep tree, files still being written when the
// code's main process exits.
func TestOutputsAreBounded(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		h.cfg.MaxFiles, h.cfg.MaxFileBytes = 20, 1<<20
		start := time.Now()
		res := h.mustRun(`import os, subprocess, sys
os.chdir("outputs")
for i in range(5000):
    open("f%05d" % i, "w").close()
d = "deep"
for i in range(200):
    d += "/d"
os.makedirs(d)
open(d + "/bottom.txt", "w").write("x")
# A grandchild that keeps appending after the main process exits.
subprocess.Popen([sys.executable, "-c", "import time\nf = open('growing', 'ab')\nwhile True:\n    f.write(b'x' * 65536); f.flush()"],
                 start_new_session=True)
`, withTimeout(120*time.Second))
		took := time.Since(start)
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		if len(res.Files) > 20 || !res.FilesTruncated {
			t.Errorf("%d files returned, truncated %v; want at most 20 and truncated", len(res.Files), res.FilesTruncated)
		}
		var bytes int
		for _, f := range res.Files {
			bytes += len(f.Data)
		}
		if bytes > 1<<20 {
			t.Errorf("%d bytes of files returned, over the 1 MiB limit", bytes)
		}
		t.Logf("5000 files, a 200-deep tree and a growing file: returned %d files in %v", len(res.Files), took)
	})
}

// Outputs the code made unreadable are reported, not silently missing:
// files_truncated, and a note at the end of the stderr.
func TestUnreadableOutputsAreReported(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		for _, tc := range []struct {
			name, code string
			files      int
		}{
			{"the dir", `import os
open("outputs/a.txt", "w").write("a")
os.chmod("outputs", 0)`, 1},
			{"a subdir", `import os
os.makedirs("outputs/sub")
open("outputs/sub/b.txt", "w").write("b")
open("outputs/top.txt", "w").write("t")
os.chmod("outputs/sub", 0)`, 2},
		} {
			res := h.mustRun(tc.code)
			if res.ExitCode != 0 {
				t.Fatalf("%s: exit %d: %s", tc.name, res.ExitCode, res.Stderr)
			}
			// An unprivileged process runtime's init is the code's uid and
			// gives a dir back its owner's rights to measure it (it may hide
			// nothing from the scratch bound): then every file comes back.
			// Otherwise the loss is said.
			said := res.FilesTruncated && strings.Contains(string(res.Stderr), "mcp-exec: some of outputs/ could not be read")
			if !said && len(res.Files) != tc.files {
				t.Errorf("%s made unreadable: files %d of %d, truncated %v, stderr %q; want them all or the loss said", tc.name, len(res.Files), tc.files, res.FilesTruncated, res.Stderr)
			}
		}
	})
}

// What is left out of /tmp/outputs is named, with its size and why: the
// byte limit, the count limit, a directory past the walk's depth. The
// files come back in the order the code wrote them.
func TestLeftOutFilesAreNamed(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		h.cfg.MaxFiles, h.cfg.MaxFileBytes = 3, 1<<20
		res := h.mustRun(`import os
os.chdir("outputs")
open("a.bin", "wb").write(b"a" * 700_000)
open("b.bin", "wb").write(b"b" * 500_000)   # past the 1 MiB with a.bin
open("c.txt", "w").write("c")
open("d.txt", "w").write("d")
open("e.txt", "w").write("e")               # the 4th file: past the count
d = "deep"
for i in range(40):
    d += "/d"
os.makedirs(d)`)
		var got []string
		for _, f := range res.Files {
			got = append(got, f.Path)
		}
		if want := []string{"a.bin", "c.txt", "d.txt"}; !slices.Equal(got, want) {
			t.Errorf("files %v, want %v", got, want)
		}
		want := []runtime.LeftOut{
			{Path: "b.bin", Size: 500_000, Why: runtime.LeftBytes},
			{Path: "e.txt", Size: 1, Why: runtime.LeftCount},
		}
		var named []runtime.LeftOut
		deep := false
		for _, lo := range res.FilesLeftOut {
			if lo.Why == runtime.LeftLimits && strings.HasPrefix(lo.Path, "deep/") && strings.HasSuffix(lo.Path, "/") {
				deep = true
				continue
			}
			named = append(named, lo)
		}
		if !slices.Equal(named, want) || !deep || !res.FilesTruncated {
			t.Errorf("left out %+v (truncated %v), want %+v and the deep tree's cut named", res.FilesLeftOut, res.FilesTruncated, want)
		}
	})
}

// Files come back in the order the code wrote them — by modification
// time, then by name with numbers as numbers (figure-2 before figure-10)
// — so that what the count limit leaves out is what came last: of 25
// figures at MCP_EXEC_MAX_FILES=20, the first 20, and 21 to 25 named as
// left out.
func TestOutputFilesInTheOrderWritten(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession, func(t *testing.T, h *harness) {
		h.cfg.MaxFiles = 20
		res := h.mustRun(`import os
os.makedirs("outputs/sub")
for i in range(1, 26):
    open("outputs/figure-%d.png" % i, "wb").write(b"x" * i)
`)
		var got, want []string
		for _, f := range res.Files {
			got = append(got, f.Path)
		}
		for i := 1; i <= 20; i++ {
			want = append(want, fmt.Sprintf("figure-%d.png", i))
		}
		var left []runtime.LeftOut
		for i := 21; i <= 25; i++ {
			left = append(left, runtime.LeftOut{Path: fmt.Sprintf("figure-%d.png", i), Size: int64(i), Why: runtime.LeftCount})
		}
		if !slices.Equal(got, want) || !slices.Equal(res.FilesLeftOut, left) {
			t.Errorf("25 figures at 20 files: returned %v, left out %+v; want %v, then %+v", got, res.FilesLeftOut, want, left)
		}
		// The time each was written decides before the name: written
		// (or touched) later comes later, in a subdirectory or not.
		res = h.mustRun(`import os
open("outputs/b.txt", "w").write("first")
os.makedirs("outputs/sub")
open("outputs/sub/a.txt", "w").write("second")
open("outputs/a.txt", "w").write("third")
os.utime("outputs/b.txt", (1000, 1000))
os.utime("outputs/sub/a.txt", (2000, 2000))
os.utime("outputs/a.txt", (3000, 3000))
`)
		got = got[:0]
		for _, f := range res.Files {
			got = append(got, f.Path)
		}
		if want := []string{"b.txt", "sub/a.txt", "a.txt"}; !slices.Equal(got, want) {
			t.Errorf("files written b, sub/a, a: returned %v, want %v", got, want)
		}
	})
}
