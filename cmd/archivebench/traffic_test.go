package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := summarize(ds)
	require.Equal(t, 200, l.Ops)
	require.InDelta(t, 100, l.P50MS, 1e-9)
	require.InDelta(t, 198, l.P99MS, 1e-9)
	require.InDelta(t, 200, l.MaxMS, 1e-9)
	require.InDelta(t, 100.5, l.MeanMS, 1e-9)
	require.Equal(t, latency{}, summarize(nil))
}

func TestBatchesWithin(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	times := []time.Duration{1, 2, 3, 4}
	ends := []time.Time{at(1), at(2), at(3), at(4)}
	require.Equal(t, []time.Duration{2, 3}, batchesWithin(times, ends, at(2), at(3)))
	require.Empty(t, batchesWithin(times, ends, at(5), at(6)))
	// An end recorded without its time (never in practice) is skipped.
	require.Equal(t, []time.Duration{1}, batchesWithin(times[:1], ends[:2], at(0), at(9)))
}

func TestRoundOrderAlternates(t *testing.T) {
	t.Parallel()
	require.Equal(t, []int{0, 1, 2}, roundOrder(0))
	require.Equal(t, []int{2, 1, 0}, roundOrder(1))
	require.Equal(t, []int{0, 1, 2}, roundOrder(2))
}

func TestCombineRuns(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	runs := []trafficRun{
		{times: []time.Duration{1 * ms, 2 * ms}, elapsed: time.Second, swept: 30_000, batches: []time.Duration{100 * ms, 300 * ms}, backlogLeft: 400_000},
		{times: []time.Duration{3 * ms, 10 * ms}, elapsed: time.Second, swept: 10_000, batches: []time.Duration{200 * ms}, reloads: 1, backlogLeft: 90_000},
	}
	c := combineRuns("x", true, runs)
	require.Equal(t, "x", c.Case)
	require.True(t, c.Sweeping)
	require.Equal(t, 4, c.Ops)
	require.InDelta(t, 2, c.P50MS, 1e-9)
	require.InDelta(t, 10, c.P99MS, 1e-9)
	require.InDelta(t, 2, c.Seconds, 1e-9)
	require.InDelta(t, 2, c.OpsPerSec, 1e-9)
	require.EqualValues(t, 40_000, c.SweptRows)
	require.InDelta(t, 20_000, c.SweptRowsPerSec, 1e-9)
	require.Equal(t, 3, c.SweepBatches)
	require.InDelta(t, 300, c.SweepBatchP95MS, 1e-9)
	require.Equal(t, 1, c.SweepReloads)
	require.EqualValues(t, 90_000, c.BacklogLeft, "the fewest left in any round")
	require.Len(t, c.Rounds, 2)
	require.InDelta(t, 2, c.Rounds[0].P99MS, 1e-9)
	require.InDelta(t, 10, c.Rounds[1].P99MS, 1e-9)

	empty := combineRuns("none", false, nil)
	require.Zero(t, empty.OpsPerSec)
	require.Zero(t, empty.Ops)
}

func TestTrafficRendering(t *testing.T) {
	t.Parallel()
	r := report{Traffic: &trafficSection{Ops: 4, Rounds: 2, Writers: 4, Backlog: 500_000, SweepAloneRowsPerSec: 60_000, Results: []trafficResult{
		{Case: caseTrafficAlone, latency: latency{P99MS: 4}, P99VsBaseline: 1},
		{Case: caseTrafficDeployed, Sweeping: true, latency: latency{P99MS: 4.8}, P99VsBaseline: 1.2, SweptRowsPerSec: 9_000, BacklogLeft: 350_000},
		{Case: caseTrafficFlatOut, Sweeping: true, latency: latency{P99MS: 6}, P99VsBaseline: 1.5, SweptRowsPerSec: 15_000, BacklogLeft: 300_000},
	}}}
	tables := r.tables()
	require.Contains(t, tables, "### 6. Live traffic while sweeping")
	require.Contains(t, tables, "| 1.50x | 15,000 |")
	require.Contains(t, tables, "kept 25% of that")
	var b []byte
	r.targets(func(f string, a ...any) { b = fmt.Appendf(b, f, a...) })
	require.Contains(t, string(b), "(flat out (shared/sweep, batch 10,000, no pause)), p99 of register-and-complete at most 1.25x without the sweeper: 1.50x (**not met**), 6.00 ms against 4.00 ms")
	require.Contains(t, string(b), "1.20x (met), 4.80 ms against 4.00 ms, with the sweeper moving 9,000 rows/s")
}
