package runtime_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// Code runs as a notebook runs a cell: the figures a call draws come back
// with it and once, its tracebacks show its source, and pandas shows a
// frame as a wide terminal would.

// forEachBatteries runs f on each runtime with the packages a notebook
// uses (numpy, pandas, matplotlib): each container variant on the
// batteries rootfs, and the process runtime on the host's interpreter
// with the sandbox's matplotlib backend, as the engine sets it up.
func forEachBatteries(t *testing.T, f func(t *testing.T, h *harness)) {
	t.Helper()
	t.Run("process", func(t *testing.T) {
		testenv.Parallel(t)
		h := newProcessHarness(t, policy.DefaultLimits())
		withProcessBatteries(t, h)
		f(t, h)
	})
	if testing.Short() {
		return
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, policy.DefaultLimits())
			withBatteries(t, h)
			f(t, h)
		})
	}
}

// withProcessBatteries gives the process runtime's calls the sandbox's
// matplotlib backend, beside the host's packages, and the environment the
// engine gives them.
func withProcessBatteries(t *testing.T, h *harness) {
	t.Helper()
	for _, m := range []string{"matplotlib", "pandas", "numpy"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/python3/dist-packages", m)); err != nil {
			need(t, "the host's python3 lacks %s (apt-get install python3-%s)", m, m)
		}
	}
	lib, err := os.MkdirTemp("/dev/shm", "mcp-exec-test-lib-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(lib) })
	if err := os.Chmod(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := rootfs.WriteMatplotlibBackend(lib); err != nil {
		t.Fatal(err)
	}
	// The engine's too: one thread each to the numeric libraries, which
	// start one per CPU otherwise (cmd/mcp-exec threadEnv).
	h.cfg.Env = append(h.cfg.Env, "PYTHONPATH="+lib, "MPLBACKEND="+rootfs.MatplotlibBackend,
		"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "NUMEXPR_MAX_THREADS=1")
}

// fileNames are the paths of a result's files, in their order.
func fileNames(res runtime.Result) []string {
	var names []string
	for _, f := range res.Files {
		names = append(names, f.Path)
	}
	return names
}

// Every figure a call leaves open is saved and closed at its end, as a
// notebook's inline display does, so that the next call's plt.show()
// returns only its own; plt.show() mid-call still returns what it shows,
// a figure as the last expression comes back once, and names are unique
// in a session (figure-C-N.png), in the order the figures were made.
func TestNotebookFigures(t *testing.T) {
	forEachBatteries(t, func(t *testing.T, h *harness) {
		draw := func(title string) string {
			return "plt.figure(); plt.plot([1, 2, 3]); plt.title(" + title + ")\n"
		}
		res := h.mustRun("import matplotlib.pyplot as plt\n" + draw("'a'") + draw("'b'"))
		if got := fileNames(res); !slices.Equal(got, []string{"figure-1.png", "figure-2.png"}) || res.ExitCode != 0 {
			t.Errorf("a fresh call that drew two figures without show(): files %v (exit %d, stderr %s), want figure-1.png, figure-2.png", got, res.ExitCode, res.Stderr)
		}

		s := h.newSession()
		res = s.run("import matplotlib.pyplot as plt\n" + draw("'left open'"))
		if got := fileNames(res); !slices.Equal(got, []string{"figure-1-1.png"}) {
			t.Errorf("a session's first call drew a figure without show(): files %v (stderr %s), want figure-1-1.png", got, res.Stderr)
		}
		res = s.run(draw("'shown'") + "plt.show()\n" + draw("'after'"))
		if got := fileNames(res); !slices.Equal(got, []string{"figure-2-1.png", "figure-2-2.png"}) {
			t.Errorf("the next call's plt.show() and a figure left open: files %v (stderr %s), want its own two, figure-2-1.png and figure-2-2.png", got, res.Stderr)
		}
		res = s.run(draw("'open'") + "fig = plt.figure(); plt.plot([3, 1]); fig")
		if got := fileNames(res); !slices.Equal(got, []string{"figure-3-1.png", "figure-3-2.png"}) || !strings.HasPrefix(string(res.Value), "<Figure") {
			t.Errorf("a figure as the last expression beside one left open: files %v, value %q (stderr %s), want each once", got, res.Value, res.Stderr)
		}
		if res = s.run("plt.get_fignums()"); string(res.Value) != "[]" || len(res.Files) != 0 {
			t.Errorf("after the calls: open figures %s, files %v; want none", res.Value, fileNames(res))
		}
		res = s.run("for i in range(12):\n    plt.figure(); plt.plot([i])")
		want := []string{}
		for i := 1; i <= 12; i++ {
			want = append(want, "figure-5-"+strconv.Itoa(i)+".png")
		}
		if got := fileNames(res); !slices.Equal(got, want) {
			t.Errorf("twelve figures: files %v, want %v (in the order drawn)", got, want)
		}
	})
}

// pandas shows a frame as a wide terminal would: a 15-column frame's
// head whole; the code's own option wins. What asks the terminal's size
// is told a wide one's.
func TestPandasDisplay(t *testing.T) {
	forEachBatteries(t, func(t *testing.T, h *harness) {
		const frame = "import pandas as pd\ndf = pd.DataFrame({'column_%02d' % i: [i * 1000.5, i, -i] for i in range(15)})\n"
		res := h.mustRun(frame + "df.head()")
		if v := string(res.Value); !strings.Contains(v, "column_00") || !strings.Contains(v, "column_14") || strings.Contains(v, "...") {
			t.Errorf("df.head() of 15 columns: %q (stderr %s); want every column", v, res.Stderr)
		}
		res = h.mustRun(frame + "pd.set_option('display.max_columns', 4)\ndf")
		if v := string(res.Value); !strings.Contains(v, "...") {
			t.Errorf("with the code's own max_columns of 4: %q; want columns hidden", v)
		}
		if res = h.mustRun("import shutil\ntuple(shutil.get_terminal_size())"); string(res.Value) != "(200, 60)" {
			t.Errorf("the terminal's size: %s, want (200, 60)", res.Value)
		}
	})
}

// A session's cell fails as a script does: its traceback shows the
// cell's source lines, and no frame of the driver, at an error and at the
// interrupt of a timeout alike.
func TestSessionTracebacks(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		s := h.newSession()
		s.run("x = 1")
		res := s.run("def f():\n    raise ValueError('the cell failed')\nf()")
		for _, want := range []string{`File "<cell 2>", line 3, in <module>`, "\n    f()\n", `File "<cell 2>", line 2, in f`,
			"\n    raise ValueError('the cell failed')\n", "ValueError: the cell failed\n"} {
			if !strings.Contains(string(res.Stderr), want) {
				t.Errorf("a cell's traceback lacks %q:\n%s", want, res.Stderr)
			}
		}
		res = s.run("import time\nwhile True:\n    time.sleep(0.01)", withTimeout(time.Second))
		if !res.TimedOut || res.Ended != "" || !strings.Contains(string(res.Stderr), "\n    time.sleep(0.01)\n") ||
			!strings.HasSuffix(string(res.Stderr), "KeyboardInterrupt\n") {
			t.Errorf("an interrupted cell: timed out %v, ended %q, stderr:\n%s", res.TimedOut, res.Ended, res.Stderr)
		}
		if driver := regexp.MustCompile(`File "<string>"|in interrupt\n|in run\n`); driver.Match(res.Stderr) {
			t.Errorf("an interrupted cell's traceback shows the driver:\n%s", res.Stderr)
		}
		// A script's too, which always showed its lines.
		res = h.mustRun("def g():\n    1 / 0\ng()")
		if !strings.Contains(string(res.Stderr), "\n    1 / 0\n") || strings.Contains(string(res.Stderr), `File "<string>"`) {
			t.Errorf("a fresh call's traceback:\n%s", res.Stderr)
		}
	})
}
