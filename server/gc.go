package server

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
)

// gcHeadroom is how far past its live heap the server's heap may grow
// before a collection, while the live heap is small (TuneGC).
const gcHeadroom = 12 << 20

// TuneGC has the collector, from now on, let the heap grow by
// gcHeadroom past what was live after the last collection while that is
// more than Go's default (GOGC 100, growth by the live heap itself)
// would, up to five times the live heap: for the server's process, when
// its operator set no GOGC. A server's live heap is small (~2 MB) and a
// call allocates about a third of it (the MCP SDK decodes every message
// through fresh 32 KB buffers), so at the default the collector ran every
// two or three calls, 1.07 ms of CPU a print(1) call against 0.19 ms
// at five times (docs/performance.md); a large live heap (thousands of
// HTTP sessions) is collected as by default, and MemoryTarget bounds it
// still. It retunes after each collection.
func TuneGC() {
	live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := -1
	var retune func(*gcCycle)
	retune = func(*gcCycle) {
		rtmetrics.Read(live)
		if live[0].Value.Kind() == rtmetrics.KindUint64 {
			if p := gcPercent(live[0].Value.Uint64()); p != last {
				debug.SetGCPercent(p)
				last = p
			}
		}
		runtime.SetFinalizer(&gcCycle{}, retune)
	}
	retune(nil)
}

// gcCycle is what TuneGC hears each collection by: one unreachable from
// its making, whose finalizer the collector runs once it has found that.
type gcCycle struct{ _ *int }

// gcPercent is the GOGC that lets a heap of live bytes grow by
// gcHeadroom, within Go's default and five times it.
func gcPercent(live uint64) int {
	return int(min(max(gcHeadroom*100/max(live, 1), 100), 400))
}
