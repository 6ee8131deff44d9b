package runtime_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// BenchmarkPrint1 measures one sandboxed print(1) per runtime, phase by
// phase, against `/usr/bin/python3 -c print(1)` (the interpreter the rootfs
// is built from) on the host measured in the same
// run. It reports medians and the ratio; it never fails on a slow machine.
func BenchmarkPrint1(b *testing.B) {
	for _, v := range []struct {
		name string
		kind runtime.Kind
		fork bool
	}{{"libcontainer", runtime.Libcontainer, false}, {"libcontainer-fork", runtime.Libcontainer, true}, {"runsc", runtime.Runsc, false}} {
		kind := v.kind
		b.Run(v.name, func(b *testing.B) {
			if kind == runtime.Runsc && !runscAvailableB() {
				b.Skip("runsc is not usable here")
			}
			dir := benchRootfs(b)
			rt, err := runtime.New(kind, runtime.Config{StateDir: b.TempDir() + "/state", Fork: runtime.ForkConfig{Enabled: v.fork}})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			cfg := testBundleConfig(dir, rt, policy.DefaultLimits())
			var prep, run, closeT, total, base []time.Duration
			var peak, baseRSS []int64
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				bd, err := bundle.New(runtime.BundleDir(rt), cfg, uuid.NewString())
				if err != nil {
					b.Fatal(err)
				}
				sb, err := runtime.PrepareBundle(context.Background(), rt, bd)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				res, err := sb.Run(context.Background(), runtime.Request{Code: []byte("print(1)"), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
				if err != nil || string(res.Stdout) != "1\n" {
					b.Fatalf("run: %v %q %q", err, res.Stdout, res.Stderr)
				}
				t2 := time.Now()
				if err := sb.Close(); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				prep, run, closeT, total = append(prep, t1.Sub(t0)), append(run, t2.Sub(t1)), append(closeT, t3.Sub(t2)), append(total, t3.Sub(t0))
				peak = append(peak, res.PeakMemoryBytes)

				t4 := time.Now()
				py := exec.Command("/usr/bin/python3", "-c", "print(1)")
				if out, err := py.Output(); err != nil || string(out) != "1\n" {
					b.Fatalf("baseline: %v %q", err, out)
				}
				base = append(base, time.Since(t4))
				baseRSS = append(baseRSS, py.ProcessState.SysUsage().(*syscall.Rusage).Maxrss<<10)
			}
			b.ReportMetric(ms(median(prep)), "prepare-ms")
			b.ReportMetric(ms(median(run)), "run-ms")
			b.ReportMetric(ms(median(closeT)), "teardown-ms")
			b.ReportMetric(ms(median(total)), "total-ms")
			b.ReportMetric(ms(median(base)), "python3-ms")
			b.ReportMetric(float64(median(total))/float64(median(base)), "x-python3")
			// Memory: the container's peak (its cgroup's, all processes and
			// the tmpfs) against the bare interpreter's max RSS.
			b.ReportMetric(float64(medianInt(peak))/(1<<20), "peak-MiB")
			b.ReportMetric(float64(medianInt(baseRSS))/(1<<20), "python3-rss-MiB")
			b.ReportMetric(float64(medianInt(peak))/float64(medianInt(baseRSS)), "x-python3-mem")
		})
	}
}

// BenchmarkProcessPrint1 measures one print(1) of the process runtime,
// a call in namespaces of its own and one without, against the host's
// python3 -c print(1) measured in the same loop: what the namespaces cost.
func BenchmarkProcessPrint1(b *testing.B) {
	for _, ns := range []runtime.Namespaces{runtime.NamespacesOn, runtime.NamespacesOff} {
		b.Run("namespaces="+string(ns), func(b *testing.B) {
			py, err := rootfs.FindPython(context.Background(), "")
			if err != nil {
				b.Skipf("no host python3: %v", err)
			}
			// A call's own uid (under root) passes through to its dir.
			work := b.TempDir()
			for _, d := range []string{filepath.Dir(work), work} {
				if err := os.Chmod(d, 0o711); err != nil {
					b.Fatal(err)
				}
			}
			rt, err := runtime.New(runtime.Process, runtime.Config{StateDir: b.TempDir() + "/state", WorkDir: work, ProcessNamespaces: ns})
			if err != nil {
				b.Skipf("the process runtime: %v", err)
			}
			defer rt.Close()
			cfg := testBundleConfig("/", rt, policy.DefaultLimits())
			cfg.Python = py.Path
			var total, base []time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				bd, err := bundle.New(runtime.BundleDir(rt), cfg, uuid.NewString())
				if err != nil {
					b.Fatal(err)
				}
				sb, err := runtime.PrepareBundle(context.Background(), rt, bd)
				if err != nil {
					b.Fatal(err)
				}
				res, err := sb.Run(context.Background(), runtime.Request{Code: []byte("print(1)"), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
				if err != nil || string(res.Stdout) != "1\n" {
					b.Fatalf("run: %v %q %q", err, res.Stdout, res.Stderr)
				}
				if err := sb.Close(); err != nil {
					b.Fatal(err)
				}
				total = append(total, time.Since(t0))
				t1 := time.Now()
				if out, err := exec.Command(py.Path, "-c", "print(1)").Output(); err != nil || string(out) != "1\n" {
					b.Fatalf("baseline: %v %q", err, out)
				}
				base = append(base, time.Since(t1))
			}
			b.ReportMetric(ms(median(total)), "total-ms")
			b.ReportMetric(ms(median(base)), "python3-ms")
			b.ReportMetric(float64(median(total))/float64(median(base)), "x-python3")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func medianInt(v []int64) int64 {
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkAgainstRuncCLI puts the in-process libcontainer runtime beside
// runc's own CLI running the same bundle: the same spec (rootfs, mounts,
// namespaces, seccomp, cgroup limits), with the code as the container's
// process instead of our init, so runc does only what it does for any
// container. It reports medians of a cold call of each (prepare, run and
// teardown for ours), and bare python3 measured in the same loop.
// crun is not compared: it refuses containers on cgroup v1 hybrid hosts
// like the one this was written on.
func BenchmarkAgainstRuncCLI(b *testing.B) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		b.Skip("runc's CLI is not installed (apt-get install runc)")
	}
	dir := benchRootfs(b)
	rt, err := runtime.New(runtime.Libcontainer, runtime.Config{StateDir: b.TempDir() + "/state"})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	cfg := testBundleConfig(dir, rt, policy.DefaultLimits())
	runcRoot := b.TempDir()
	b.Cleanup(func() {
		// runc removes each container's cgroup, not the parent it made.
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/mcp-exec-bench-runc")
		more, _ := filepath.Glob("/sys/fs/cgroup/*/*/mcp-exec-bench-runc")
		for _, d := range append(dirs, more...) {
			os.Remove(d)
		}
	})
	var ours, theirs, base []time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		bd, err := bundle.New(runtime.BundleDir(rt), cfg, uuid.NewString())
		if err != nil {
			b.Fatal(err)
		}
		sb, err := runtime.PrepareBundle(context.Background(), rt, bd)
		if err != nil {
			b.Fatal(err)
		}
		res, err := sb.Run(context.Background(), runtime.Request{Code: []byte("print(1)"), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
		if err != nil || string(res.Stdout) != "1\n" {
			b.Fatalf("run: %v %q %q", err, res.Stdout, res.Stderr)
		}
		if err := sb.Close(); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(t0))

		t1 := time.Now()
		id := uuid.NewString()
		rb, err := bundle.New(b.TempDir(), cfg, id)
		if err != nil {
			b.Fatal(err)
		}
		rb.Spec.Process.Args = []string{rootfs.PythonPath, "-c", "print(1)"}
		rb.Spec.Linux.CgroupsPath = "/mcp-exec-bench-runc/" + id
		if err := rb.WriteSpec(); err != nil {
			b.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(runc, "--root", runcRoot, "run", "--bundle", rb.Dir, id)
		cmd.Stderr = &stderr // runc warns of the kernel memory (TCP) limit
		if out, err := cmd.Output(); err != nil || string(out) != "1\n" {
			b.Fatalf("runc run: %v %q %s", err, out, &stderr)
		}
		theirs = append(theirs, time.Since(t1))
		rb.Remove()

		t2 := time.Now()
		if out, err := exec.Command("/usr/bin/python3", "-c", "print(1)").Output(); err != nil || string(out) != "1\n" {
			b.Fatalf("baseline: %v %q", err, out)
		}
		base = append(base, time.Since(t2))
	}
	b.ReportMetric(ms(median(ours)), "libcontainer-ms")
	b.ReportMetric(ms(median(theirs)), "runc-run-ms")
	b.ReportMetric(ms(median(base)), "python3-ms")
	b.ReportMetric(float64(median(ours))/float64(median(theirs)), "x-runc-run")
}
