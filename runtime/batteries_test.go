package runtime_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// The typical analysis of a user of the batteries — a CSV handed in,
// pandas, a matplotlib chart shown — fits the default limits on both
// runtimes, and the chart comes back as a PNG. The figures it logs (time
// and the cgroup's peak memory) are the ones docs/performance.md reports.
func TestBatteriesTypicalAnalysis(t *testing.T) {
	for _, v := range variants(t) {
		kind := v.kind
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, policy.DefaultLimits())
			withBatteries(t, h)

			res := h.mustRun(`import time
t0 = time.monotonic()
import numpy, pandas, matplotlib
print(round(time.monotonic() - t0, 3))`)
			t.Logf("%s: import numpy, pandas, matplotlib: %s s inside, call %v, peak %d MiB",
				kind, strings.TrimSpace(string(res.Stdout)), res.Duration.Round(time.Millisecond), res.PeakMemoryBytes>>20)

			res = h.mustRun(`import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("data/sales.csv", parse_dates=["day"])
summary = df.groupby("region")["amount"].sum()
print(summary.to_json())
df.pivot_table(index="day", columns="region", values="amount").plot(title="sales by region")
plt.show()
import `+probePackage+`, subprocess
busybox = b"BusyBox" in open("/bin/sh", "rb").read()
print(`+probePackage+`.VALUE, subprocess.run("echo shell | tr a-z A-Z", shell=True, capture_output=True, text=True).stdout.strip(), busybox)`,
				withFiles(runtime.File{Path: "data/sales.csv", Data: []byte("day,region,amount\n2026-01-01,eu,3\n2026-01-01,us,5\n2026-01-02,eu,4\n2026-01-02,us,1\n")}),
				withTimeout(time.Duration(policy.DefaultLimits().CPUs*60)*time.Second))
			lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
			var sums map[string]int
			if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &sums) != nil || sums["eu"] != 7 || sums["us"] != 6 || lines[1] != "42 SHELL True" {
				t.Fatalf("the analysis printed %q (stderr %s), want the sums, then 42 SHELL True (/bin/sh is busybox)", res.Stdout, res.Stderr)
			}
			var names []string
			for _, f := range res.Files {
				names = append(names, f.Path)
				if f.Path == "figure-1.png" && (!bytes.HasPrefix(f.Data, []byte("\x89PNG\r\n\x1a\n")) || len(f.Data) < 5000) {
					t.Errorf("figure-1.png: %d bytes, want a PNG chart", len(f.Data))
				}
			}
			if !slices.Equal(names, []string{"figure-1.png"}) {
				t.Errorf("files returned %v, want [figure-1.png] (plt.show saves the chart)", names)
			}
			if res.OOMKilled || res.PeakMemoryBytes > policy.DefaultLimits().MemoryBytes {
				t.Errorf("peak memory %d MiB, oom %v: the default limit must fit", res.PeakMemoryBytes>>20, res.OOMKilled)
			}
			t.Logf("%s: CSV in, pandas, chart out: call %v, CPU %v, peak %d MiB, PNG %d bytes",
				kind, res.Duration.Round(time.Millisecond), res.CPUTime.Round(time.Millisecond), res.PeakMemoryBytes>>20, len(res.Files[0].Data))
		})
	}
}

// pngSize reads a PNG's width and height from its header.
func pngSize(b []byte) (w, h int) {
	if len(b) < 24 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		return 0, 0
	}
	return int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:]))
}

// Images come back as a notebook shows them: a figure or a PIL image as
// the last expression, Image.show(), and plt.show() with nothing cut off.
func TestBatteriesImagesAsValues(t *testing.T) {
	h := newHarness(t, runtime.Libcontainer, policy.DefaultLimits())
	withBatteries(t, h)
	files := func(res runtime.Result) map[string][]byte {
		m := map[string][]byte{}
		for _, f := range res.Files {
			m[f.Path] = f.Data
		}
		return m
	}
	// A label below the axes, past the figure's 480 pixels: a tight
	// bounding box keeps it.
	res := h.mustRun("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nfig.text(0.5, -0.3, 'below the figure')\nplt.show()")
	if w, ht := pngSize(files(res)["figure-1.png"]); w == 0 || ht <= 480 {
		t.Errorf("plt.show() with a label below: %dx%d, want it taller than 480 (%d files, stderr %s)", w, ht, len(res.Files), res.Stderr)
	}
	res = h.mustRun("import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 3])\nfig")
	if _, ok := files(res)["figure-1.png"]; !ok || len(res.Files) != 1 || !strings.HasPrefix(string(res.Value), "<Figure size") {
		t.Errorf("a figure as the last expression: %d files, value %q, stderr %s", len(res.Files), res.Value, res.Stderr)
	}
	res = h.mustRun("from PIL import Image\nImage.new('RGB', (7, 5), 'red')")
	if w, ht := pngSize(files(res)["image-1.png"]); w != 7 || ht != 5 || !strings.Contains(string(res.Value), "PIL.Image.Image image mode=RGB size=7x5") {
		t.Errorf("a PIL image as the last expression: %dx%d, value %q, stderr %s", w, ht, res.Value, res.Stderr)
	}
	res = h.mustRun("from PIL import Image\nImage.new('L', (3, 2)).show()")
	if w, ht := pngSize(files(res)["image-1.png"]); w != 3 || ht != 2 || len(res.Value) != 0 {
		t.Errorf("Image.show(): %dx%d, value %q, stderr %s", w, ht, res.Value, res.Stderr)
	}
}
