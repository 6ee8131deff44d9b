package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/rootfs"
)

// sandboxProbe prints what the code sees of the sandbox: identity,
// capabilities, filter, network, the root, /tmp, the environment, and the
// packages dir's module.
const sandboxProbe = `import ctypes, errno, json, os, shutil, socket, subprocess, sys
st = dict((k, v.strip()) for k, v in (l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l))
def errno_of(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno
libc = ctypes.CDLL(None, use_errno=True)
unshared = libc.unshare(0x10000000)  # CLONE_NEWUSER
unshare_errno = ctypes.get_errno() if unshared != 0 else 0
shutil.copy(sys.executable, "/tmp/py")
os.chmod("/tmp/py", 0o755)
try:
    import mcp_exec_probe_pkg
    pkg = mcp_exec_probe_pkg.VALUE
except ImportError as e:
    pkg = str(e)
print(json.dumps({
    "uid": [os.getuid(), os.getgid(), os.getgroups()],
    "CapEff": st.get("CapEff"), "CapBnd": st.get("CapBnd"), "Seccomp": st.get("Seccomp"),
    "nnp": libc.prctl(39, 0, 0, 0, 0),
    "ifaces": [n for _, n in socket.if_nameindex()],
    "connect": errno_of(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2)),
    "root_write": errno_of(lambda: open("/probe", "w")),
    "tmp_exec": errno_of(lambda: subprocess.run(["/tmp/py", "-c", "0"])),
    "unshare": unshare_errno,
    "env": sorted(k for k in os.environ if k.startswith("MCP") or "TOKEN" in k),
    "pkg": pkg,
    "hostname": socket.gethostname(),
}))`

// sandboxSeen is what sandboxProbe prints.
type sandboxSeen struct {
	UID                     []any
	CapEff, CapBnd, Seccomp string
	NNP                     int
	Ifaces                  []string
	Connect                 int
	RootWrite               int `json:"root_write"`
	TmpExec                 int `json:"tmp_exec"`
	Unshare                 int
	Env                     []string
	Pkg                     any
	Hostname                string
}

// check reports every property the probe saw missing.
func (s sandboxSeen) check(t *testing.T, what string) {
	t.Helper()
	if b, _ := json.Marshal(s.UID); string(b) != "[65532,65532,[]]" {
		t.Errorf("%s: uid, gid, groups = %s, want 65532, 65532, none", what, b)
	}
	if s.CapEff != "0000000000000000" || s.CapBnd != "0000000000000000" || s.Seccomp != "2" || s.NNP != 1 {
		t.Errorf("%s: CapEff %s CapBnd %s Seccomp %s no_new_privs %d, want empty, empty, 2, 1", what, s.CapEff, s.CapBnd, s.Seccomp, s.NNP)
	}
	if strings.Join(s.Ifaces, ",") != "lo" || s.Connect == 0 {
		t.Errorf("%s: interfaces %v, connect errno %d; want only lo and a failed connect", what, s.Ifaces, s.Connect)
	}
	// EROFS; gVisor checks permissions first (EACCES).
	if s.RootWrite != 30 && s.RootWrite != 13 {
		t.Errorf("%s: writing / gave errno %d, want EROFS (or EACCES under gVisor)", what, s.RootWrite)
	}
	if s.TmpExec != 13 {
		t.Errorf("%s: executing from /tmp gave errno %d, want EACCES (noexec)", what, s.TmpExec)
	}
	if s.Unshare != 1 {
		t.Errorf("%s: unshare(CLONE_NEWUSER) gave errno %d, want EPERM (seccomp)", what, s.Unshare)
	}
	if len(s.Env) != 0 || s.Hostname != "sandbox" {
		t.Errorf("%s: environment has %v, hostname %q; want nothing of the server's, sandbox", what, s.Env, s.Hostname)
	}
}

// MCP_EXEC_ROOTFS_IMAGE and MCP_EXEC_PACKAGES_DIR through the binary: a
// `docker save` tarball made here of the default rootfs's files becomes the
// rootfs, a packages dir is mounted on the import path, and on both
// runtimes the code sees the whole sandbox and imports the dir's module.
func TestImageRootfsAndPackagesDir(t *testing.T) {
	testenv.Real(t)
	testenv.Root(t)
	bin := binaryPath(t)
	ctx := context.Background()
	py, err := rootfs.FindPython(ctx, "")
	if err != nil {
		testenv.Missing(t, "no host python3 to build the image from: %v", err)
	}
	src, err := rootfs.Ensure(ctx, py, rootfs.Options{}, rootfs.DefaultCacheDir(), nil)
	if err != nil {
		t.Fatalf("building the rootfs the image is made of: %v", err)
	}
	work := t.TempDir()
	image := filepath.Join(work, "python.tar")
	saveImage(t, src, image)

	pkgs := filepath.Join(work, "pydeps")
	if err := os.MkdirAll(filepath.Join(pkgs, "mcp_exec_probe_pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkgs, "mcp_exec_probe_pkg", "__init__.py"), []byte("VALUE = 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{work, pkgs, filepath.Join(pkgs, "mcp_exec_probe_pkg")} {
		os.Chmod(d, 0o755)
	}

	for _, kind := range []string{"libcontainer", "runsc"} {
		t.Run(kind, func(t *testing.T) {
			cmd := exec.Command(bin, "run", "--timeout", "60", "-c", sandboxProbe)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "MCP_EXEC_RUNTIME=" + kind,
				"MCP_EXEC_ROOTFS_IMAGE=" + image, "MCP_EXEC_PACKAGES_DIR=" + pkgs,
				"MCP_EXEC_STATE_DIR=" + filepath.Join(work, "state-"+kind), "MCP_EXEC_AUTH_TOKEN=not-for-the-code-0123456789"}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.WaitDelay = 10 * time.Second
			start := time.Now()
			if err := cmd.Run(); err != nil {
				if kind == "runsc" && strings.Contains(stderr.String(), "isolation unavailable") {
					testenv.Missing(t, "runsc cannot run here: %s", stderr.String())
				}
				t.Fatalf("mcp-exec run with an image rootfs: %v\nstdout: %s\nstderr: %s", err, &stdout, &stderr)
			}
			t.Logf("%s: flatten (first run: with byte-compiling) and one call: %v", kind, time.Since(start).Round(time.Millisecond))
			var seen sandboxSeen
			if err := json.Unmarshal(stdout.Bytes(), &seen); err != nil {
				t.Fatalf("the probe printed %q: %v (stderr %s)", &stdout, err, &stderr)
			}
			seen.check(t, kind+" on an image rootfs")
			if seen.Pkg != float64(42) {
				t.Errorf("importing the packages dir's module: %v, want 42", seen.Pkg)
			}
		})
	}
}

// saveImage writes the files of dir as a one-layer image, as `docker save`
// writes it.
func saveImage(t *testing.T, dir, out string) {
	t.Helper()
	layerPath := out + ".layer"
	f, err := os.Create(layerPath)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = rel, 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			r, err := os.Open(p)
			if err != nil {
				return err
			}
			defer r.Close()
			if _, err := io.Copy(tw, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("writing the image's layer: %v", err)
	}
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference("mcp-exec-test/python:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		t.Fatalf("writing the docker save tarball: %v", err)
	}
}

// The batteries as a client sees them, through the built binary with a
// real client on both runtimes: the tool description names the packages
// and the shell; a CSV sent as a file goes through pandas into a chart
// that plt.show() returns as an image block, listed in structuredContent.
func TestBinaryBatteries(t *testing.T) {
	requireSandbox(t)
	ctx := context.Background()
	py, err := rootfs.FindPython(ctx, "")
	if err != nil {
		testenv.Missing(t, "no host python3: %v", err)
	}
	if _, err := rootfs.Describe(py, rootfs.Options{Packages: []string{"numpy", "pandas", "matplotlib"}, Shell: true}); err != nil {
		testenv.Missing(t, "the host lacks the packages: %v", err)
	}
	for _, kind := range []string{"libcontainer", "runsc"} {
		t.Run(kind, func(t *testing.T) {
			var stderr testenv.SyncBuffer
			cmd := exec.Command(binaryPath(t), "serve")
			cmd.Env = serverEnv(filepath.Join(t.TempDir(), "state"), "MCP_EXEC_RUNTIME="+kind,
				"MCP_EXEC_PACKAGES=numpy,pandas,matplotlib,pillow,pyyaml,jinja2", "MCP_EXEC_SHELL=true")
			cmd.Stderr = &stderr
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				if kind == "runsc" && strings.Contains(stderr.String(), "isolation unavailable") {
					testenv.Missing(t, "runsc cannot run here: %s", &stderr)
				}
				t.Fatalf("starting the server: %v\n%s", err, &stderr)
			}
			defer cs.Close()
			tools, err := cs.ListTools(ctx, nil)
			if err != nil || len(tools.Tools) != 1 {
				t.Fatalf("tools/list: %v, %v", tools, err)
			}
			desc := tools.Tools[0].Description
			for _, want := range []string{"matplotlib", "numpy", "pandas", "PIL", "yaml", "jinja2", "/bin/sh", "/tmp/outputs", "plt.show()"} {
				if !strings.Contains(desc, want) {
					t.Errorf("the tool description does not mention %q:\n%s", want, desc)
				}
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{
				"code": "import pandas as pd, matplotlib.pyplot as plt\n" +
					"df = pd.read_csv('sales.csv')\nprint(df.groupby('region').amount.sum().to_dict())\n" +
					"df.plot.bar(x='region', y='amount')\nplt.show()",
				"files": []map[string]any{{"path": "sales.csv", "content": "region,amount\neu,3\nus,5\n"}},
			}})
			if err != nil || res.IsError {
				t.Fatalf("exec: %v, %+v\n%s", err, res, &stderr)
			}
			var out struct {
				execOutput
				PeakMemoryBytes int64 `json:"peak_memory_bytes"`
				Files           []struct {
					Path     string `json:"path"`
					MIMEType string `json:"mime_type"`
				} `json:"files"`
			}
			remarshal(t, res.StructuredContent, &out)
			if out.Stdout != "{'eu': 3, 'us': 5}\n" || out.ExitCode != 0 {
				t.Errorf("stdout %q exit %d (stderr %s), want the sums", out.Stdout, out.ExitCode, out.Stderr)
			}
			if len(out.Files) != 1 || out.Files[0].Path != "figure-1.png" || out.Files[0].MIMEType != "image/png" {
				t.Errorf("structuredContent.files = %+v, want figure-1.png, image/png", out.Files)
			}
			images := 0
			for _, c := range res.Content {
				if img, ok := c.(*mcp.ImageContent); ok && img.MIMEType == "image/png" && bytes.HasPrefix(img.Data, []byte("\x89PNG")) {
					images++
				}
			}
			if images != 1 {
				t.Errorf("%d PNG image blocks in the result, want 1", images)
			}
			t.Logf("%s: CSV in, chart out: %d ms in the sandbox, peak %d MiB", kind, out.DurationMS, out.PeakMemoryBytes>>20)
		})
	}
}

// MCP_EXEC_PRELOAD: a prepared sandbox's interpreter has imported the
// modules before the call, and nothing else differs from a cold start that
// imports them itself; each call still gets an interpreter no other call
// touched. A preload the rootfs cannot import is refused with the import's
// own error.
func TestBinaryPreload(t *testing.T) {
	requireSandbox(t)
	ctx := context.Background()
	py, err := rootfs.FindPython(ctx, "")
	if err != nil {
		testenv.Missing(t, "no host python3: %v", err)
	}
	if _, err := rootfs.Describe(py, rootfs.Options{Packages: []string{"numpy"}}); err != nil {
		testenv.Missing(t, "the host lacks numpy: %v", err)
	}

	t.Run("not importable", func(t *testing.T) {
		cmd := exec.Command(binaryPath(t), "serve")
		cmd.Env = serverEnv(filepath.Join(t.TempDir(), "state"), "MCP_EXEC_PRELOAD=numpy")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Stdin = strings.NewReader("")
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(stderr.String(), "MCP_EXEC_PRELOAD: numpy cannot be imported in the sandbox: ModuleNotFoundError") {
			t.Errorf("serve with MCP_EXEC_PRELOAD=numpy and no packages: %v, %q; want a refusal with the import's error", err, &stderr)
		}
	})

	modules := func(env []string, code string, wantPooled bool) (map[string]bool, *mcp.ClientSession, *testenv.SyncBuffer) {
		t.Helper()
		stderr := &testenv.SyncBuffer{}
		cmd := exec.Command(binaryPath(t), "serve", "-v")
		cmd.Env = serverEnv(filepath.Join(t.TempDir(), "state"), env...)
		cmd.Stderr = stderr
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("starting the server with %v: %v\n%s", env, err, stderr)
		}
		t.Cleanup(func() { cs.Close() })
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the server's stderr (%v):\n%s", env, stderr)
			}
		})
		if wantPooled {
			testenv.Eventually(t, "a sandbox prepared ahead", func() bool { return strings.Contains(stderr.String(), "sandbox prepared ahead") })
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": code}})
		if err != nil || res.IsError {
			t.Fatalf("exec: %v, %+v\n%s", err, res, stderr)
		}
		out := decodeOutput(t, res)
		var names []string
		if err := json.Unmarshal([]byte(out.Stdout), &names); err != nil || out.ExitCode != 0 {
			t.Fatalf("stdout %q stderr %q: %v", out.Stdout, out.Stderr, err)
		}
		set := map[string]bool{}
		for _, n := range names {
			set[n] = true
		}
		return set, cs, stderr
	}
	cold, _, _ := modules([]string{"MCP_EXEC_PACKAGES=numpy"},
		"import sys, json, numpy\nprint(json.dumps(sorted(sys.modules)))", false)
	// json is imported after sys.modules is read, as the cold probe's
	// json is part of what it imports anyway.
	warm, cs, stderr := modules([]string{"MCP_EXEC_PACKAGES=numpy", "MCP_EXEC_PRELOAD=numpy", "MCP_EXEC_POOL_SIZE=1"},
		"import sys\nnames = sorted(sys.modules)\nimport json, numpy\nnumpy.touched_by_a_call = True\nopen('/tmp/mark', 'w').close()\nprint(json.dumps(names))", true)
	if !warm["numpy"] {
		t.Errorf("numpy is not in sys.modules before the code imports it")
	}
	for n := range warm {
		if !cold[n] {
			t.Errorf("%s is in a preloaded interpreter's sys.modules but not in a cold one's that imported numpy", n)
		}
	}
	for n := range cold {
		if !warm[n] && n != "json" && !strings.HasPrefix(n, "json.") && n != "_json" {
			t.Errorf("%s is in a cold interpreter's sys.modules after importing numpy, but not in a preloaded one's", n)
		}
	}
	// The next call gets another interpreter: nothing the first did to
	// numpy or /tmp is there.
	testenv.Eventually(t, "the pool refilled", func() bool { return strings.Count(stderr.String(), "sandbox prepared ahead") >= 2 })
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{
		"code": "import os, sys\nprint(hasattr(sys.modules['numpy'], 'touched_by_a_call'), sorted(os.listdir('/tmp')))"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v, %+v", err, res)
	}
	if out := decodeOutput(t, res); out.Stdout != "False ['outputs']\n" {
		t.Errorf("the second call saw %q (stderr %q), want numpy untouched and /tmp empty", out.Stdout, out.Stderr)
	}
	testenv.Eventually(t, "both calls logged", func() bool { return strings.Count(stderr.String(), "msg=exec ") >= 2 })
	if n := strings.Count(stderr.String(), "pooled=true"); n != 2 {
		t.Errorf("%d of 2 calls ran on a prepared sandbox, want 2:\n%s", n, stderr)
	}
}
