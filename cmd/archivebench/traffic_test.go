package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/sweep"
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

// The sweeper's busy time counts only the part of each batch inside the
// window: a sweeper in batches back to back is busy the whole window,
// wherever its batches begin and end, and never more.
func TestBusyWithinClipsToTheWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// Batches of 1 s back to back, ending at 1 s, 2 s, ... 10 s.
	var times []time.Duration
	var ends []time.Time
	for i := 1; i <= 10; i++ {
		times, ends = append(times, time.Second), append(ends, t0.Add(time.Duration(i)*time.Second))
	}
	for _, w := range []struct{ from, to time.Duration }{{0, ms(3400)}, {ms(500), ms(3450)}, {ms(1400), ms(3000)}, {ms(100), ms(9900)}} {
		from, to := t0.Add(w.from), t0.Add(w.to)
		require.Equal(t, to.Sub(from), busyWithin(times, ends, from, to), "window %v-%v", w.from, w.to)
		// Without the batch running at the window's end (canceled, so
		// never reported), busy is the window up to the last end in it.
		n := int(w.to / time.Second)
		require.Equal(t, t0.Add(time.Duration(n)*time.Second).Sub(from), busyWithin(times[:n], ends[:n], from, to), "window %v-%v", w.from, w.to)
	}
	require.Zero(t, busyWithin(times, ends, t0.Add(20*time.Second), t0.Add(30*time.Second)))
	require.Zero(t, busyWithin(times[:0], ends, t0, t0.Add(time.Hour)), "an end recorded without its time is skipped")
}

func TestRoundOrderAlternates(t *testing.T) {
	t.Parallel()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6}, roundOrder(0))
	require.Equal(t, []int{3, 2, 1, 0, 6, 5, 4}, roundOrder(1))
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6}, roundOrder(2))
	for round := range 2 {
		order := roundOrder(round)
		require.ElementsMatch(t, []int{0, 1, 2, 3, 4, 5, 6}, order, "every case runs once a round")
		seenClosed := false
		for _, i := range order {
			if trafficCases[i].load == 0 {
				seenClosed = true
			}
			// An open-loop case takes its rate from the closed-loop
			// baseline of round 0, so it must come after it.
			require.False(t, round == 0 && trafficCases[i].load > 0 && !seenClosed)
		}
	}
	require.Equal(t, 0, roundOrder(0)[0], "round 0 starts with the closed-loop baseline")
	for _, c := range trafficCases {
		b := trafficCases[slices.IndexFunc(trafficCases, func(b trafficCase) bool { return b.name == c.baseline })]
		require.False(t, b.sweeping, "%s is compared with a case without the sweeper", c.name)
		require.Equal(t, c.load, b.load, "%s is compared with a case at the same load", c.name)
	}
	// "As deployed" is what the variables default to, and "the fixed
	// pause alone" the same pause without the ratio.
	for _, name := range []string{caseTrafficFixedPause, caseTrafficOpenFixedPause} {
		c := trafficCases[slices.IndexFunc(trafficCases, func(c trafficCase) bool { return c.name == name })]
		require.Equal(t, sweep.DefaultPause, c.pause)
		require.Zero(t, c.pauseRatio)
		require.Contains(t, name, "SWEEP_PAUSE_RATIO 0")
	}
	require.Contains(t, caseTrafficFixedPause, fmt.Sprintf("SWEEP_PAUSE %s,", sweep.DefaultPause))
	for _, name := range []string{caseTrafficDeployed, caseTrafficOpenDeployed} {
		c := trafficCases[slices.IndexFunc(trafficCases, func(c trafficCase) bool { return c.name == name })]
		require.Equal(t, sweep.DefaultPause, c.pause)
		require.Equal(t, sweep.DefaultPauseRatio, c.pauseRatio)
		require.Contains(t, name, fmt.Sprintf("SWEEP_PAUSE %s, SWEEP_PAUSE_RATIO %g", sweep.DefaultPause, sweep.DefaultPauseRatio))
	}
}

func TestCombineRuns(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	runs := []trafficRun{
		{times: []time.Duration{1 * ms, 2 * ms}, lags: []time.Duration{1 * ms, 3 * ms}, elapsed: time.Second, swept: 30_000, batches: []time.Duration{100 * ms, 300 * ms}, busy: 350 * ms, backlogLeft: 400_000},
		{times: []time.Duration{3 * ms, 10 * ms}, elapsed: time.Second, swept: 10_000, batches: []time.Duration{200 * ms}, busy: 250 * ms, reloads: 1, backlogLeft: 90_000},
	}
	c := combineRuns(trafficCase{name: "x", sweeping: true, baseline: "b"}, runs)
	require.Equal(t, "x", c.Case)
	require.Equal(t, "b", c.Baseline)
	require.InDelta(t, 3, c.StartLagP99MS, 1e-9, "how late the operations started, apart from their times")
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
	require.InDelta(t, 30, c.SweepBusyPct, 1e-9, "600 ms busy in 2 s")
	require.Equal(t, 1, c.SweepReloads)
	require.EqualValues(t, 90_000, c.BacklogLeft, "the fewest left in any round")
	require.Len(t, c.Rounds, 2)
	require.InDelta(t, 2, c.Rounds[0].P99MS, 1e-9)
	require.InDelta(t, 10, c.Rounds[1].P99MS, 1e-9)

	empty := combineRuns(trafficCase{name: "none"}, nil)
	require.Zero(t, empty.OpsPerSec)
	require.Zero(t, empty.Ops)
	require.Zero(t, empty.StartLagP99MS)
	require.Zero(t, empty.SweepBusyPct)
}

func TestTrafficRendering(t *testing.T) {
	t.Parallel()
	r := report{Traffic: &trafficSection{Ops: 4, OpenLoopOps: 2, Rounds: 2, Writers: 4, Backlog: 500_000, SweepAloneRowsPerSec: 60_000, Results: []trafficResult{
		{Case: caseTrafficAlone, Baseline: caseTrafficAlone, latency: latency{P99MS: 4}, P99VsBaseline: 1},
		{Case: caseTrafficDeployed, Baseline: caseTrafficAlone, Sweeping: true, latency: latency{P99MS: 4.8}, P99VsBaseline: 1.2, SweptRowsPerSec: 9_000, BacklogLeft: 350_000, SweepBusyPct: 21},
		{Case: caseTrafficFixedPause, Baseline: caseTrafficAlone, Sweeping: true, latency: latency{P99MS: 5.6}, P99VsBaseline: 1.4, SweptRowsPerSec: 13_000, BacklogLeft: 320_000, SweepBusyPct: 52},
		{Case: caseTrafficFlatOut, Baseline: caseTrafficAlone, Sweeping: true, latency: latency{P99MS: 6}, P99VsBaseline: 1.5, SweptRowsPerSec: 15_000, BacklogLeft: 300_000, SweepBatches: 12, SweepBatchP95MS: 420, SweepBusyPct: 87.4},
		{Case: caseTrafficOpenAlone, Baseline: caseTrafficOpenAlone, OfferedOpsPerSec: 2_400, latency: latency{P99MS: 2}, P99VsBaseline: 1},
		{Case: caseTrafficOpenDeployed, Baseline: caseTrafficOpenAlone, OfferedOpsPerSec: 2_400, StartLagP99MS: 0.9, Sweeping: true, latency: latency{P99MS: 2.2}, P99VsBaseline: 1.1, SweptRowsPerSec: 12_000},
	}}}
	tables := r.tables()
	require.Contains(t, tables, "### 6. Live traffic while sweeping")
	require.Contains(t, tables, "4 per case in a closed loop and 2 at an offered load")
	require.Contains(t, tables, "| 1.50x | 15,000 | 12 | 420 | 87% | 0 |")
	require.Contains(t, tables, "| "+caseTrafficOpenDeployed+" | 2,400 | 0.90 |")
	require.Contains(t, tables, "| "+caseTrafficAlone+" | closed loop | – |")
	require.Contains(t, tables, "kept 25% of that")
	var b []byte
	r.targets(func(f string, a ...any) { b = fmt.Appendf(b, f, a...) })
	require.Contains(t, string(b), "(flat out (shared/sweep, batch 10,000, no pause), closed loop), p99 of register-and-complete at most 1.25x without the sweeper: 1.50x (**not met**), 6.00 ms against 4.00 ms")
	require.Contains(t, string(b), "1.20x (met), 4.80 ms against 4.00 ms, with the sweeper moving 9,000 rows/s")
	require.Contains(t, tables, "In the closed loop, what the pause ratio changes: p99 1.20x the baseline with it against 1.40x with the fixed pause alone, the sweeper busy 21% of the time against 52% and moving 9,000 rows/s against 13,000.")
	require.NotContains(t, tables, "At the offered load, what the pause ratio changes", "no open-loop fixed-pause case in this report")
	require.NotContains(t, string(b), "fixed pause alone", "the targets are the deployed sweeper's and the flat-out one's")
	require.Contains(t, string(b), "(as deployed (SWEEP_PAUSE 200ms, SWEEP_PAUSE_RATIO 3), open loop at 2,400 ops/s), p99 of register-and-complete at most 1.25x without the sweeper: 1.10x (met), 2.20 ms against 2.00 ms, with the sweeper moving 12,000 rows/s")
}

// A run recorded before the pause ratio existed is described as it ran,
// not with today's defaults.
func TestTrafficMethodFollowsTheRecordedSettings(t *testing.T) {
	t.Parallel()
	ratio := 3.0
	now := report{Traffic: &trafficSection{DeployedPauseMS: 200, DeployedPauseRatio: &ratio}}
	require.Contains(t, now.document(""), "As deployed, p is 200 ms (SWEEP_PAUSE's default) and r 3 (SWEEP_PAUSE_RATIO's)")
	old := report{Traffic: &trafficSection{DeployedPauseMS: 200}}
	doc := old.document("")
	require.Contains(t, doc, "As deployed when this run was made, p was 200 ms (SWEEP_PAUSE's default, jittered by ±25%) and there was no pause ratio")
	require.NotContains(t, doc, "r 3")
}

// The lookup targets name every timestamped case, the old keys' included:
// the recent ones alone would hide the rare retry years late.
func TestLookupTargetsNameEveryTimestampedCase(t *testing.T) {
	t.Parallel()
	r := report{Lookup: &lookupSection{Sets: []lookupSet{{Partitions: 123, Results: []lookupResult{
		{Case: caseTSFound, ReaderP99MS: 0.5, ReaderLocks: 7.7},
		{Case: caseTSNotFound, ReaderP99MS: 0.4, ReaderLocks: 4, ReaderLocksExec: 6},
		{Case: caseTSFoundOld, ReaderP99MS: 2.3, ReaderLocks: 198.5},
		{Case: casePlainFound, ReaderP99MS: 1.5, ReaderExecP50MS: 1.2, ReaderExecP99MS: 2.5},
	}}}}}
	var b []byte
	r.targets(func(f string, a ...any) { b = fmt.Appendf(b, f, a...) })
	require.Contains(t, string(b), "- Timestamped keys that expired in the last two months (a late retry) at 123 partitions, p99 at or under 1 ms: 0.50 ms (met); at most 4 relation locks: 7.7 (**not met**).")
	require.Contains(t, string(b), "- Timestamped keys minted now (the fresh-key path) at 123 partitions: p99 0.40 ms (met), 4.0 relation locks (met), 6.0 in exec mode (as behind RDS Proxy) (**not met**).")
	require.Contains(t, string(b), "- Timestamped keys from any month of the archive at 123 partitions (a retry up to years late): p99 2.30 ms (**not met**), 198.5 relation locks (**not met**).")
	// Exec mode, as deployed behind RDS Proxy, is held to the same target
	// when the run timed it.
	require.Contains(t, string(b), "- Keys without a timestamp (found (any month)) at 123 partitions, p99 at or under 2 ms: 1.50 ms (met); in exec mode (as behind RDS Proxy) 2.50 ms (**not met**); the runbook alarms at 5 ms.")
	tables := r.tables()
	require.Contains(t, tables, "| 1.20 / 2.50 |")
	require.Contains(t, tables, "| – |", "a run that did not time exec mode")
}

// A traffic comparison the machine's noise decides is inconclusive, not met:
// rounds of the baseline that disagree, or a sweeper that speeds the
// traffic up.
func TestNoisyTrafficIsInconclusive(t *testing.T) {
	t.Parallel()
	steady := trafficResult{latency: latency{P99MS: 2}, Rounds: []latency{{P99MS: 1.9}, {P99MS: 2.1}}}
	require.Empty(t, tooNoisy(steady, trafficResult{P99VsBaseline: 1.1}))
	require.Empty(t, tooNoisy(steady, trafficResult{P99VsBaseline: 2.3}))
	require.Contains(t, tooNoisy(steady, trafficResult{P99VsBaseline: 0.67}), "ran faster than without it")
	unsteady := trafficResult{latency: latency{P99MS: 9}, Rounds: []latency{{P99MS: 10.7}, {P99MS: 4.3}}}
	require.Contains(t, tooNoisy(unsteady, trafficResult{P99VsBaseline: 1.1}), "the baseline's rounds disagree (p99 4.30 and 10.70 ms)")

	r := report{Traffic: &trafficSection{Results: []trafficResult{
		{Case: caseTrafficAlone, Baseline: caseTrafficAlone, latency: latency{P99MS: 9.47}, Rounds: []latency{{P99MS: 10.68}, {P99MS: 7.30}}, P99VsBaseline: 1},
		{Case: caseTrafficDeployed, Baseline: caseTrafficAlone, Sweeping: true, latency: latency{P99MS: 6.34}, P99VsBaseline: 0.67},
	}}}
	var b []byte
	r.targets(func(f string, a ...any) { b = fmt.Appendf(b, f, a...) })
	require.Contains(t, string(b), "0.67x (**inconclusive**: the traffic beside the sweeper ran faster than without it")
	require.NotContains(t, string(b), "(met)")
}
