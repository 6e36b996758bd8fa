package syncperf

import (
	"fmt"
	"slices"
	"time"
)

// Latencies summarises a set of samples.
type Latencies struct {
	N                       int
	P50, P90, P99, Max, Min time.Duration
	Mean                    time.Duration
}

// Summarize returns the nearest-rank percentiles of samples.
func Summarize(samples []time.Duration) Latencies {
	if len(samples) == 0 {
		return Latencies{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	rank := func(percent int) time.Duration {
		// Nearest rank: the smallest sample with at least percent of
		// the samples at or below it; integer maths, so 99% of 200 is
		// exactly the 198th.
		i := (len(s)*percent+99)/100 - 1
		return s[max(0, i)]
	}
	return Latencies{N: len(s), P50: rank(50), P90: rank(90), P99: rank(99),
		Min: s[0], Max: s[len(s)-1], Mean: sum / time.Duration(len(s))}
}

func (l Latencies) String() string {
	return fmt.Sprintf("n=%d min=%v p50=%v p90=%v p99=%v max=%v mean=%v", l.N,
		l.Min.Round(10*time.Microsecond), l.P50.Round(10*time.Microsecond), l.P90.Round(10*time.Microsecond),
		l.P99.Round(10*time.Microsecond), l.Max.Round(10*time.Microsecond), l.Mean.Round(10*time.Microsecond))
}
