package server

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestGCPercentGivesSmallHeapsHeadroom(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400},
		{2 << 20, 400},   // a server's own: five times
		{4 << 20, 300},   // 12 MB past it
		{12 << 20, 100},  // Go's default from here on
		{200 << 20, 100}, // never less
	} {
		if got := gcPercent(c.live); got != c.want {
			t.Errorf("gcPercent(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// TestTuneGCFollowsTheLiveHeap: once tuned, the collector's target moves
// with what each collection leaves live: Go's default for a large live
// heap, more than it again for a small one.
func TestTuneGCFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	TuneGC()
	percent := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	until := func(what string, ok func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(percent()) {
			if time.Now().After(deadline) {
				t.Fatalf("GOGC %d: not %s within 10 s", percent(), what)
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	big := make([]*[1 << 20]byte, 64) // 64 MiB live
	for i := range big {
		big[i] = new([1 << 20]byte)
	}
	until("Go's default under a 64 MiB live heap", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	until("raised once the heap is small again", func(p int) bool { return p > 100 })
}
