package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Summary is the distribution of the successful calls' wall-clock times.
type Summary struct {
	P50MS  float64 `json:"p50_ms"`
	P95MS  float64 `json:"p95_ms"`
	MeanMS float64 `json:"mean_ms"`
	MinMS  float64 `json:"min_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// summarize returns nil for no samples: a percentile of nothing is not 0.
func summarize(ds []time.Duration) *Summary {
	if len(ds) == 0 {
		return nil
	}
	ms := make([]float64, len(ds))
	var sum float64
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	return &Summary{
		P50MS:  percentile(ms, 50),
		P95MS:  percentile(ms, 95),
		MeanMS: sum / float64(len(ms)),
		MinMS:  ms[0],
		MaxMS:  ms[len(ms)-1],
	}
}

// percentile of sorted values, interpolated linearly between the closest
// ranks (numpy's default), so that the p50 of an even count is the mean of
// the middle two rather than whichever one a rounding rule picks.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	r := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(r))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (r-float64(lo))*(sorted[hi]-sorted[lo])
}

// ratio is sandbox/baseline, nil when either side is missing or not
// positive: no figure rather than a division by zero.
func ratio(sandbox, baseline float64) *float64 {
	if !(sandbox > 0) || !(baseline > 0) || math.IsInf(sandbox, 0) || math.IsInf(baseline, 0) {
		return nil
	}
	r := sandbox / baseline
	return &r
}

// fmtRatio prints a ratio with about three significant digits: 0.32×,
// 3.31×, 19.6×, 143×.
func fmtRatio(r *float64) string {
	switch {
	case r == nil:
		return "n/a"
	case *r < 10:
		return fmt.Sprintf("%.2f×", *r)
	case *r < 100:
		return fmt.Sprintf("%.1f×", *r)
	default:
		return fmt.Sprintf("%.0f×", *r)
	}
}

// fmtMS prints milliseconds to a tenth; sub-millisecond differences are
// noise at these sample sizes.
func fmtMS(ms float64) string { return fmt.Sprintf("%.1f", ms) }

// fmtMB prints kibibytes (as /proc reports them) in MiB.
func fmtMB(kb int64) string { return fmt.Sprintf("%.1f", float64(kb)/1024) }
