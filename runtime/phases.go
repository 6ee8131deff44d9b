package runtime

import "time"

// Phase names a stage of one call, as Request.Phases is told it: for
// whoever times calls (the server's traces). The runtime knows nothing of
// how they are recorded.
type Phase string

const (
	// PhasePrepare: a sandbox for the call, taken ready from the pool or
	// made now.
	PhasePrepare Phase = "prepare"
	// PhaseRun: the code, from its start to its exit (or its kill).
	PhaseRun Phase = "run"
	// PhaseCollect: after the code's exit, its output files and the
	// verdict.
	PhaseCollect Phase = "collect"
	// PhaseTeardown: the sandbox destroyed, off the call's time: it ends
	// after the call's result is out.
	PhaseTeardown Phase = "teardown"
)

// PhaseFunc is told each phase of a call once it is over. It must not
// block: it runs on the call's path.
type PhaseFunc func(p Phase, start, end time.Time)

// span tells f of phase p, from start to end; a nil f is told nothing.
func (f PhaseFunc) span(p Phase, start, end time.Time) {
	if f != nil && !start.IsZero() {
		f(p, start, end)
	}
}
