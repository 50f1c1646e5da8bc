package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// latency is a summary of operation times.
type latency struct {
	Ops    int     `json:"ops"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	MeanMS float64 `json:"mean_ms"`
}

// summarize returns the p50, p99, max and mean of ds.
func summarize(ds []time.Duration) latency {
	l := latency{Ops: len(ds)}
	if len(ds) == 0 {
		return l
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	l.P50MS = ms(percentile(ds, 50))
	l.P99MS = ms(percentile(ds, 99))
	l.MaxMS = ms(percentile(ds, 100))
	l.MeanMS = ms(sum) / float64(len(ds))
	return l
}

// trafficResult is the writers without the sweeper, or beside it: every
// round's operations pooled.
type trafficResult struct {
	Case     string `json:"case"`
	Sweeping bool   `json:"sweeping"`
	// Baseline is the case without the sweeper that the ratios are over.
	Baseline string `json:"baseline"`
	// OfferedOpsPerSec is the arrival rate of an open-loop case (each
	// operation is due at its scheduled time); 0 for a closed loop, whose
	// writers start the next operation when one ends.
	OfferedOpsPerSec float64 `json:"offered_ops_per_sec,omitempty"`
	// StartLagP99MS, in an open-loop case, is the p99 of how late the
	// operations started after they were due: the load generator's timer
	// precision, and any wait for a free writer. Not part of the latency.
	StartLagP99MS float64 `json:"start_lag_p99_ms,omitempty"`
	Seconds       float64 `json:"seconds"`
	OpsPerSec     float64 `json:"ops_per_sec"`
	latency
	// Rounds is each round on its own, in the order they ran: how far two
	// runs of the same case differ here.
	Rounds []latency `json:"rounds"`
	// P99VsBaseline and P50VsBaseline are this run's over Baseline's.
	P50VsBaseline float64 `json:"p50_vs_baseline"`
	P99VsBaseline float64 `json:"p99_vs_baseline"`
	// The sweeper beside the writers, within the writers' window (zero
	// without the sweeper).
	SweptRows       int64   `json:"swept_rows"`
	SweptRowsPerSec float64 `json:"swept_rows_per_sec"`
	SweepBatches    int     `json:"sweep_batches"`
	SweepBatchP95MS float64 `json:"sweep_batch_p95_ms"` // each batch's own time (sweep.Progress.Took), not the pause before it
	// SweepBusyPct is the share of the writers' window the sweeper spent
	// in batches (see busyWithin): at least this much, as the batch still
	// running when the writers finish is canceled unreported.
	SweepBusyPct float64 `json:"sweep_busy_pct"`
	// SweepReloads counts the times the backlog drained during a round and
	// was loaded again (the reload's own writes then count against the
	// traffic); BacklogLeft is the fewest expired rows still live when a
	// round's writers finished.
	SweepReloads int   `json:"sweep_reloads"`
	BacklogLeft  int64 `json:"backlog_left"`
}

// trafficRun is what one round of one case measured.
type trafficRun struct {
	times       []time.Duration
	lags        []time.Duration // how late each operation started (open loop)
	elapsed     time.Duration
	swept       int64
	batches     []time.Duration
	busy        time.Duration // the sweeper's time in batches within the window
	reloads     int
	backlogLeft int64
}

// combineRuns pools the rounds of one case.
func combineRuns(c trafficCase, runs []trafficRun) trafficResult {
	res := trafficResult{Case: c.name, Sweeping: c.sweeping, Baseline: c.baseline, BacklogLeft: -1}
	var all, batches, lags []time.Duration
	var elapsed, busy time.Duration
	for _, r := range runs {
		busy += r.busy
		all = append(all, r.times...)
		lags = append(lags, r.lags...)
		batches = append(batches, r.batches...)
		elapsed += r.elapsed
		res.Rounds = append(res.Rounds, summarize(r.times))
		res.SweptRows += r.swept
		res.SweepReloads += r.reloads
		if res.BacklogLeft < 0 || r.backlogLeft < res.BacklogLeft {
			res.BacklogLeft = r.backlogLeft
		}
	}
	res.latency = summarize(all)
	res.Seconds = elapsed.Seconds()
	res.OpsPerSec = ratio(float64(len(all)), elapsed.Seconds())
	res.SweptRowsPerSec = ratio(float64(res.SweptRows), elapsed.Seconds())
	res.SweepBatches = len(batches)
	res.SweepBatchP95MS = ms(percentile(batches, 95))
	res.SweepBusyPct = 100 * ratio(busy.Seconds(), elapsed.Seconds())
	if len(lags) > 0 {
		res.StartLagP99MS = ms(percentile(lags, 99))
	}
	return res
}

// trafficCase is the writers alone, or beside the sweeper with a pause, in
// a closed loop or at an offered load.
type trafficCase struct {
	name     string
	sweeping bool
	pause    time.Duration
	// pauseRatio is the sweeper's Config.PauseRatio.
	pauseRatio float64
	// load, when not 0, makes the case an open loop: operations arrive at
	// this fraction of the closed-loop baseline's throughput in the first
	// round.
	load float64
	// baseline is the case without the sweeper this one is compared with.
	baseline string
}

// trafficCases: in a closed loop (the writers saturate the machine) the
// baseline, the sweeper as deployed (SWEEP_PAUSE's and SWEEP_PAUSE_RATIO's
// defaults), with the fixed pause alone (no ratio) and flat out; then at a
// quarter of the baseline's throughput (a database with headroom, as a
// payment API runs it) the baseline, the sweeper as deployed and with the
// fixed pause alone. The closed-loop cases come first: the open ones take
// their rate from the first baseline run.
var trafficCases = []trafficCase{
	{name: caseTrafficAlone, baseline: caseTrafficAlone},
	{name: caseTrafficDeployed, sweeping: true, pause: sweep.DefaultPause, pauseRatio: sweep.DefaultPauseRatio, baseline: caseTrafficAlone},
	{name: caseTrafficFixedPause, sweeping: true, pause: sweep.DefaultPause, baseline: caseTrafficAlone},
	{name: caseTrafficFlatOut, sweeping: true, baseline: caseTrafficAlone},
	{name: caseTrafficOpenAlone, load: trafficOpenLoad, baseline: caseTrafficOpenAlone},
	{name: caseTrafficOpenDeployed, sweeping: true, pause: sweep.DefaultPause, pauseRatio: sweep.DefaultPauseRatio, load: trafficOpenLoad, baseline: caseTrafficOpenAlone},
	{name: caseTrafficOpenFixedPause, sweeping: true, pause: sweep.DefaultPause, load: trafficOpenLoad, baseline: caseTrafficOpenAlone},
}

// roundOrder is the order of the cases (indexes into trafficCases) in round
// i: the closed-loop cases, then the open-loop ones, each group in order in
// even rounds and reversed in odd ones (ABBA), so that a drift of the
// machine over the run weighs on all alike. Round 0 starts with the
// closed-loop baseline, whose throughput sets the open-loop rate.
func roundOrder(i int) []int {
	var closed, open []int
	for j, c := range trafficCases {
		if c.load > 0 {
			open = append(open, j)
		} else {
			closed = append(closed, j)
		}
	}
	if i%2 == 1 {
		slices.Reverse(closed)
		slices.Reverse(open)
	}
	return append(closed, open...)
}

type trafficSection struct {
	Ops         int `json:"ops"`           // per closed-loop case, over every round
	OpenLoopOps int `json:"open_loop_ops"` // per open-loop case, over every round
	Rounds      int `json:"rounds"`
	Writers     int `json:"writers"`
	Backlog     int `json:"backlog_rows"`
	// SweepAloneRowsPerSec is the sweeper over the same backlog with no
	// traffic, for the cost the other way round.
	SweepAloneRowsPerSec float64 `json:"sweep_alone_rows_per_sec"`
	// DeployedPauseMS and DeployedPauseRatio are the sweeper's settings in
	// the cases "as deployed" (SWEEP_PAUSE's and SWEEP_PAUSE_RATIO's
	// defaults when the run was made); the ratio is nil in the files of
	// runs made before it existed.
	DeployedPauseMS    float64         `json:"deployed_pause_ms"`
	DeployedPauseRatio *float64        `json:"deployed_pause_ratio,omitempty"`
	LoadSeconds        float64         `json:"load_seconds"`
	Results            []trafficResult `json:"results"`
}

const (
	trafficWriters = 4
	trafficRounds  = 2
	trafficWarmup  = 200 // untimed ops before each run, across the writers
	trafficTTL     = 24 * time.Hour

	// trafficOpenLoad is the open-loop cases' arrival rate, as a fraction
	// of the closed-loop baseline's throughput.
	trafficOpenLoad = 0.25

	caseTrafficAlone          = "no sweeper (baseline)"
	caseTrafficDeployed       = "sweeper running as deployed (shared/sweep, batch 10,000, SWEEP_PAUSE 200ms, SWEEP_PAUSE_RATIO 3)"
	caseTrafficFixedPause     = "sweeper running with the fixed pause alone (SWEEP_PAUSE 200ms, SWEEP_PAUSE_RATIO 0)"
	caseTrafficFlatOut        = "sweeper running flat out (shared/sweep, batch 10,000, no pause)"
	caseTrafficOpenAlone      = "at a quarter of the baseline's throughput, no sweeper (baseline)"
	caseTrafficOpenDeployed   = "at a quarter of the baseline's throughput, sweeper running as deployed (SWEEP_PAUSE 200ms, SWEEP_PAUSE_RATIO 3)"
	caseTrafficOpenFixedPause = "at a quarter of the baseline's throughput, sweeper running with the fixed pause alone (SWEEP_PAUSE_RATIO 0)"
)

// benchTraffic times register-and-complete of fresh ULID keys through the
// Postgres live store, from trafficWriters goroutines, on a live table
// holding backlog expired rows: with no sweeper, and while the project's
// sweeper moves that backlog flat out, in trafficRounds rounds of ABBA
// order. The live table is reloaded to the same state before each run.
func benchTraffic(ctx context.Context, base string, ops, backlog int, p *progress) (trafficSection, error) {
	deployedRatio := sweep.DefaultPauseRatio
	sec := trafficSection{Ops: ops, Writers: trafficWriters, Backlog: backlog,
		DeployedPauseMS: ms(sweep.DefaultPause), DeployedPauseRatio: &deployedRatio}
	db, parts, err := newLiveBenchDB(ctx, base, "traffic")
	if err != nil {
		return sec, err
	}
	defer db.Drop()
	start := time.Now()
	if err := loadTrafficSource(ctx, db, backlog, p); err != nil {
		return sec, err
	}
	sec.LoadSeconds = time.Since(start).Seconds()

	runs := make([][]trafficRun, len(trafficCases))
	perRound := max(ops/trafficRounds, 1)
	// The open-loop cases run half as many operations: at a quarter of
	// the rate they would take four times as long.
	openPerRound := max(perRound/2, 1)
	var rate float64 // the closed-loop baseline's throughput in round 0
	for round := 0; round < trafficRounds; round++ {
		for _, i := range roundOrder(round) {
			c := trafficCases[i]
			name := c.name
			n, interval := perRound, time.Duration(0)
			if c.load > 0 {
				if rate <= 0 {
					return sec, errors.New("an open-loop case ran before the closed-loop baseline")
				}
				n, interval = openPerRound, time.Duration(float64(time.Second)/(rate*c.load))
			}
			p.Step("traffic: round %d/%d: reload %d expired live rows for %s", round+1, trafficRounds, backlog, name)
			if err := reloadTrafficLive(ctx, db); err != nil {
				return sec, err
			}
			p.Step("traffic: round %d/%d: %d register-and-complete, %d writers, %s", round+1, trafficRounds, n, trafficWriters, name)
			run, err := runTraffic(ctx, db, parts, n, interval, c, p)
			if err != nil {
				return sec, fmt.Errorf("%s: %w", name, err)
			}
			if i == 0 && round == 0 {
				rate = float64(len(run.times)) / run.elapsed.Seconds()
			}
			runs[i] = append(runs[i], run)
		}
	}
	sec.Ops = perRound * trafficRounds
	sec.OpenLoopOps = openPerRound * trafficRounds
	sec.Rounds = trafficRounds
	for i, c := range trafficCases {
		res := combineRuns(c, runs[i])
		if c.load > 0 {
			res.OfferedOpsPerSec = rate * c.load
		}
		sec.Results = append(sec.Results, res)
	}

	// The sweeper alone over the same backlog: its rate beside the traffic
	// means something only against this.
	p.Step("traffic: reload %d expired live rows for the sweeper alone", backlog)
	if err := reloadTrafficLive(ctx, db); err != nil {
		return sec, err
	}
	p.Step("traffic: the sweeper alone")
	s, err := sweep.New(db.Pool, sweep.Config{BatchSize: sweepBatch, Pause: 0,
		OnBatch: func(pr sweep.Progress) { p.Update("%d rows moved", pr.Moved) }}, parts, nil)
	if err != nil {
		return sec, err
	}
	t0 := time.Now()
	r, err := s.Run(ctx)
	if err != nil {
		return sec, fmt.Errorf("the sweeper alone: %w", err)
	}
	sec.SweepAloneRowsPerSec = float64(r.Moved) / time.Since(t0).Seconds()

	for i, r := range sec.Results {
		if b, ok := sec.result(r.Baseline); ok {
			sec.Results[i].P50VsBaseline = ratio(r.P50MS, b.P50MS)
			sec.Results[i].P99VsBaseline = ratio(r.P99MS, b.P99MS)
		}
	}
	return sec, nil
}

// loadTrafficSource fills bench_traffic_source with rows completed keys
// (the three shapes, a stored charge) that expired over the last day.
func loadTrafficSource(ctx context.Context, db *benchDB, rows int, p *progress) error {
	p.Step("traffic: generate and copy %d expired live rows", rows)
	g := newKeyGen(4)
	first := time.Now().Add(-25 * time.Hour)
	step := 24 * time.Hour / time.Duration(max(rows, 1))
	return copyLiveSource(ctx, db, "bench_traffic_source", rows, g, p, func(i int) liveRow {
		expires := first.Add(time.Duration(i) * step)
		created := expires.Add(-24 * time.Hour)
		return liveRow{response: g.charge(g.resourceID(), created), key: g.key(g.r.IntN(shapes), created), created: created, expires: expires}
	})
}

const refillTrafficSQL = "INSERT INTO idempotency_keys (" + liveColumns + ") SELECT " + liveColumns + " FROM bench_traffic_source ORDER BY expires_at"

// reloadTrafficLive empties the live table (the backlog and an earlier
// run's keys) and the archive, refills the backlog, vacuums, analyzes and
// checkpoints, so that each run starts from the same state.
func reloadTrafficLive(ctx context.Context, db *benchDB) error {
	for _, sql := range []string{
		"TRUNCATE idempotency_keys",
		emptyArchiveSQL,
		refillTrafficSQL,
		"VACUUM (ANALYZE) idempotency_keys",
		"ANALYZE idempotency_key_archive",
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("reload the live table: %s: %w", sql, err)
		}
	}
	_, _ = db.Pool.Exec(ctx, "CHECKPOINT")
	return nil
}

// sweeperLoop runs the project's sweeper over and over until stopped,
// reloading the backlog whenever it drains, and counts what it moved.
type sweeperLoop struct {
	moved     atomic.Int64 // rows moved so far, over every run
	reloads   atomic.Int64
	mu        sync.Mutex
	batches   []time.Duration // each batch's time
	batchEnds []time.Time     // when each ended
	started   chan struct{}   // closed at the first batch
}

func (l *sweeperLoop) run(ctx context.Context, db *benchDB, parts *partition.Manager, c trafficCase, p *progress) error {
	var base int64
	var once sync.Once
	for {
		s, err := sweep.New(db.Pool, sweep.Config{
			BatchSize:  sweepBatch,
			Pause:      c.pause,
			PauseRatio: c.pauseRatio,
			OnBatch: func(pr sweep.Progress) {
				now := time.Now()
				l.mu.Lock()
				l.batches = append(l.batches, pr.Took)
				l.batchEnds = append(l.batchEnds, now)
				l.mu.Unlock()
				l.moved.Store(base + pr.Moved)
				once.Do(func() { close(l.started) })
			},
		}, parts, nil)
		if err != nil {
			return err
		}
		r, err := s.Run(ctx)
		base += r.Moved
		l.moved.Store(base)
		if ctx.Err() != nil {
			return nil // stopped: the writers are done
		}
		if err != nil {
			return err
		}
		if !r.Drained {
			return fmt.Errorf("the sweeper stopped (%s) with %d expired rows left", r.Stopped, r.Backlog)
		}
		// Drained before the writers finished: load the backlog again.
		l.reloads.Add(1)
		p.Update("the backlog drained: reloading it")
		for _, sql := range []string{emptyArchiveSQL, refillTrafficSQL} {
			if _, err := db.Pool.Exec(ctx, sql); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("reload the backlog: %w", err)
			}
		}
	}
}

// batchesWithin returns the batch times of batches that ended in [from, to].
func batchesWithin(times []time.Duration, ends []time.Time, from, to time.Time) []time.Duration {
	var out []time.Duration
	for i, e := range ends {
		if i < len(times) && !e.Before(from) && !e.After(to) {
			out = append(out, times[i])
		}
	}
	return out
}

// busyWithin returns how much of [from, to] the batches that took times and
// ended at ends spent running: each batch's span, [end - took, end], clipped
// to the window, so that a batch that began before the window counts only
// its part inside it. A batch still running at to is not among them (the
// sweeper is canceled then and reports nothing for it): the figure is a
// lower bound.
func busyWithin(times []time.Duration, ends []time.Time, from, to time.Time) time.Duration {
	var busy time.Duration
	for i, e := range ends {
		if i >= len(times) {
			break
		}
		start, end := e.Add(-times[i]), e
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) {
			busy += end.Sub(start)
		}
	}
	return busy
}

// runTraffic runs ops register-and-complete operations split over the
// writers, beside the sweeper when sweeping, and times each: in a closed
// loop when interval is 0, else one arriving every interval (see
// runWriters).
func runTraffic(ctx context.Context, db *benchDB, parts *partition.Manager, ops int, interval time.Duration, c trafficCase, p *progress) (trafficRun, error) {
	var res trafficRun
	store := livestore.NewPostgres(db.Pool)

	var loop *sweeperLoop
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	sweepDone := make(chan error, 1)
	if c.sweeping {
		loop = &sweeperLoop{started: make(chan struct{})}
		go func() { sweepDone <- loop.run(sweepCtx, db, parts, c, p) }()
	}

	// Warm up the writers' connections and the store's lease, untimed.
	if err := runWriters(ctx, store, trafficWarmup, 1000, 0, nil); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	if c.sweeping {
		// Time the writers only once the sweeper is moving rows.
		select {
		case <-loop.started:
		case err := <-sweepDone:
			if err == nil {
				err = errors.New("the sweeper stopped before its first batch")
			}
			return res, err
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}

	var done atomic.Int64
	times := make([]time.Duration, 0, ops)
	var mu sync.Mutex
	var lags []time.Duration
	record := func(d, lag time.Duration) {
		mu.Lock()
		times = append(times, d)
		if interval > 0 {
			lags = append(lags, lag)
		}
		mu.Unlock()
		if n := done.Add(1); n%500 == 0 {
			if loop != nil {
				p.Update("%d/%d, %d rows swept", n, ops, loop.moved.Load())
			} else {
				p.Update("%d/%d", n, ops)
			}
		}
	}
	var movedAtStart int64
	if loop != nil {
		movedAtStart = loop.moved.Load()
	}
	t0 := time.Now()
	werr := runWriters(ctx, store, ops, 2000, interval, record)
	t1 := time.Now()
	var movedAtEnd int64
	if loop != nil {
		movedAtEnd = loop.moved.Load()
		stopSweep()
		if err := <-sweepDone; err != nil && werr == nil {
			werr = fmt.Errorf("sweeper: %w", err)
		}
	}
	if werr != nil {
		return res, werr
	}
	res.times, res.lags = times, lags
	res.elapsed = t1.Sub(t0)
	if loop != nil {
		res.swept = movedAtEnd - movedAtStart
		loop.mu.Lock()
		res.batches = batchesWithin(loop.batches, loop.batchEnds, t0, t1)
		res.busy = busyWithin(loop.batches, loop.batchEnds, t0, t1)
		loop.mu.Unlock()
		res.reloads = int(loop.reloads.Load())
	}
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE expires_at < now()").Scan(&res.backlogLeft); err != nil {
		return res, fmt.Errorf("count the backlog left: %w", err)
	}
	return res, nil
}

// runWriters runs ops register-and-complete operations of fresh ULID
// keys over trafficWriters goroutines (each its own key generator, seeded
// from seed), passing each operation's time to record when it is not nil.
// With interval 0 the loop is closed: a writer starts the next operation as
// soon as its last one ends. Otherwise operation n is due at start +
// n*interval: the writer that takes it waits until then. Its time runs from
// when it started, and how late it started after it was due goes to record
// as its lag: that is the generator's own timer precision (a goroutine
// woken from a sleep, on 2 busy cores, starts up to milliseconds late) plus
// any wait for a free writer, which would otherwise count as the live
// store's latency on both sides of the comparison.
func runWriters(ctx context.Context, store *livestore.Postgres, ops int, seed uint64, interval time.Duration, record func(d, lag time.Duration)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	errs := make(chan error, trafficWriters)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < trafficWriters; w++ {
		wg.Add(1)
		go func(g *keyGen) {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(ops) {
					return
				}
				var due time.Time
				if interval > 0 {
					due = start.Add(time.Duration(n-1) * interval)
					time.Sleep(time.Until(due))
				}
				var lag time.Duration
				if interval > 0 {
					lag = time.Since(due)
				}
				d, err := registerAndComplete(ctx, store, g)
				if err != nil {
					errs <- err
					cancel()
					return
				}
				if record != nil {
					record(d, lag)
				}
			}
		}(newKeyGen(seed + uint64(w)))
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no writer failed
}

// registerAndComplete is one request's work on the live store: register a
// fresh ULID key minted now, then complete it with a charge.
func registerAndComplete(ctx context.Context, store *livestore.Postgres, g *keyGen) (time.Duration, error) {
	key := scopePrefix + g.ulid(time.Now())
	fp := g.fingerprint()
	id := g.resourceID()
	body := fmt.Appendf(nil, `{"id":%q,"object":"charge","amount":4500,"currency":"gbp","status":"succeeded"}`, id)
	t0 := time.Now()
	reg, err := store.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, TTL: trafficTTL, ClockSkew: keytime.DefaultClockSkew})
	if err != nil {
		return 0, err
	}
	if !reg.Fresh {
		return 0, fmt.Errorf("register %s: not fresh (ahead %v)", key, reg.Ahead)
	}
	if err := store.Complete(ctx, key, idempotency.Completion{
		Fingerprint: fp, Status: 201, Body: body, ContentType: "application/json", ResourceID: &id,
	}); err != nil {
		return 0, fmt.Errorf("complete %s: %w", key, err)
	}
	return time.Since(t0), nil
}

// result returns the case of that name.
func (t *trafficSection) result(name string) (trafficResult, bool) {
	for _, c := range t.Results {
		if c.Case == name {
			return c, true
		}
	}
	return trafficResult{}, false
}
