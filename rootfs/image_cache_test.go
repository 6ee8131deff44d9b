package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The image cache: prepared once, collected when no one holds it, shared
// by processes that flatten at once.

// TestFlattenImageCollects checks that a build removes the images no process
// holds, and only those.
func TestFlattenImageCollects(t *testing.T) {
	work := t.TempDir()
	a := saveLayout(t, filepath.Join(work), map[string]v1.Image{"": imageOf(t, layerOf(t, append(fakePython("usr/bin"), regEntry("which", "a", 0o644))...))})
	bDir := filepath.Join(work, "b")
	os.Mkdir(bDir, 0o755)
	b := saveLayout(t, bDir, map[string]v1.Image{"": imageOf(t, layerOf(t, append(fakePython("usr/bin"), regEntry("which", "b", 0o644))...))})
	cache := filepath.Join(work, "cache")

	imA := flatten(t, a, cache, ImageOptions{})
	imB := flatten(t, b, cache, ImageOptions{})
	if _, err := os.Stat(imA.Dir); err != nil {
		t.Errorf("image A, held by this process, was removed by building B: %v", err)
	}
	releaseImage(imA.Dir)
	releaseImage(imB.Dir)
	// B is current again (a lookup holds it), A is no one's.
	flatten(t, b, cache, ImageOptions{})
	c := saveLayout(t, t.TempDir(), map[string]v1.Image{"": imageOf(t, layerOf(t, fakePython("usr/bin")...))})
	flatten(t, c, cache, ImageOptions{})
	for _, p := range []string{imA.Dir, imA.Dir + holdSuffix} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after building C: %s: %v, want it removed (no process holds A)", p, err)
		}
	}
	if _, err := os.Stat(imB.Dir); err != nil {
		t.Errorf("after building C: image B, held, is gone: %v", err)
	}
	// A comes back when asked for.
	if im := flatten(t, a, cache, ImageOptions{}); describeAt(im.Dir, "which") != `file 0644 "a"` {
		t.Errorf("FlattenImage(A) after its removal: /which = %s", describeAt(im.Dir, "which"))
	}
}

// TestFlattenImageHelperProcess is not a test: TestFlattenImageConcurrent
// runs the test binary with it, as another server process would flatten.
func TestFlattenImageHelperProcess(t *testing.T) {
	src := os.Getenv("MCP_EXEC_TEST_IMAGE_SRC")
	if src == "" {
		return
	}
	im, err := FlattenImage(context.Background(), src, os.Getenv("MCP_EXEC_TEST_IMAGE_CACHE"), ImageOptions{Prepare: countingPrepare(os.Getenv("MCP_EXEC_TEST_IMAGE_COUNT"))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(im.Dir)
	os.Exit(0)
}

// countingPrepare appends a line to file for every build, slowly enough that
// concurrent callers overlap.
func countingPrepare(file string) func(context.Context, string, string) error {
	return func(context.Context, string, string) error {
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, os.Getpid()); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		return nil
	}
}

// TestFlattenImageConcurrent flattens one image from two processes and
// several goroutines at once: it is built once, and all get the same dir.
func TestFlattenImageConcurrent(t *testing.T) {
	work := t.TempDir()
	src := saveLayout(t, work, map[string]v1.Image{"": imageOf(t, layerOf(t, fakePython("usr/bin")...))})
	cache := filepath.Join(work, "cache")
	count := filepath.Join(work, "count")

	var wg sync.WaitGroup
	dirs := make([]string, 4)
	errs := make([]error, 4)
	for i := range 3 {
		wg.Go(func() {
			im, err := FlattenImage(context.Background(), src, cache, ImageOptions{Prepare: countingPrepare(count)})
			dirs[i], errs[i] = im.Dir, err
		})
	}
	wg.Go(func() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFlattenImageHelperProcess$")
		cmd.Env = append(os.Environ(), "MCP_EXEC_TEST_IMAGE_SRC="+src, "MCP_EXEC_TEST_IMAGE_CACHE="+cache, "MCP_EXEC_TEST_IMAGE_COUNT="+count)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, stderr.String())
		}
		dirs[3], errs[3] = strings.TrimSpace(string(out)), err
	})
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	for i, d := range dirs {
		if d != dirs[0] {
			t.Errorf("caller %d got %s, caller 0 %s; want one dir", i, d, dirs[0])
		}
	}
	b, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 1 {
		t.Errorf("Prepare ran %d times across 2 processes, want once:\n%s", n, b)
	}
}
