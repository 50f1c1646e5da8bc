package main

import (
	"context"
	"errors"
	"fmt"
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
	Case      string  `json:"case"`
	Sweeping  bool    `json:"sweeping"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"ops_per_sec"`
	latency
	// Rounds is each round on its own, in the order they ran: how far two
	// runs of the same case differ here.
	Rounds []latency `json:"rounds"`
	// P99VsBaseline and P50VsBaseline are this run's over the run without
	// the sweeper.
	P50VsBaseline float64 `json:"p50_vs_baseline"`
	P99VsBaseline float64 `json:"p99_vs_baseline"`
	// The sweeper beside the writers, within the writers' window (zero
	// without the sweeper).
	SweptRows       int64   `json:"swept_rows"`
	SweptRowsPerSec float64 `json:"swept_rows_per_sec"`
	SweepBatches    int     `json:"sweep_batches"`
	SweepBatchP95MS float64 `json:"sweep_batch_p95_ms"`
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
	elapsed     time.Duration
	swept       int64
	batches     []time.Duration
	reloads     int
	backlogLeft int64
}

// combineRuns pools the rounds of one case.
func combineRuns(name string, sweeping bool, runs []trafficRun) trafficResult {
	res := trafficResult{Case: name, Sweeping: sweeping, BacklogLeft: -1}
	var all, batches []time.Duration
	var elapsed time.Duration
	for _, r := range runs {
		all = append(all, r.times...)
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
	return res
}

// trafficCase is the writers alone, or beside the sweeper with a pause.
type trafficCase struct {
	name     string
	sweeping bool
	pause    time.Duration
}

// trafficCases: the baseline, the sweeper as deployed (SWEEP_PAUSE's
// default) and the sweeper flat out.
var trafficCases = []trafficCase{
	{name: caseTrafficAlone},
	{name: caseTrafficDeployed, sweeping: true, pause: sweep.DefaultPause},
	{name: caseTrafficFlatOut, sweeping: true},
}

// roundOrder is the order of the cases (indexes into trafficCases) in round
// i: in order in even rounds, reversed in odd ones (ABBA), so that a drift
// of the machine over the run weighs on all alike.
func roundOrder(i int) []int {
	if i%2 == 0 {
		return []int{0, 1, 2}
	}
	return []int{2, 1, 0}
}

type trafficSection struct {
	Ops     int `json:"ops"` // per case, over every round
	Rounds  int `json:"rounds"`
	Writers int `json:"writers"`
	Backlog int `json:"backlog_rows"`
	// SweepAloneRowsPerSec is the sweeper over the same backlog with no
	// traffic, for the cost the other way round.
	SweepAloneRowsPerSec float64         `json:"sweep_alone_rows_per_sec"`
	LoadSeconds          float64         `json:"load_seconds"`
	Results              []trafficResult `json:"results"`
}

const (
	trafficWriters = 4
	trafficRounds  = 2
	trafficWarmup  = 200 // untimed ops before each run, across the writers
	trafficTTL     = 24 * time.Hour

	caseTrafficAlone    = "no sweeper (baseline)"
	caseTrafficDeployed = "sweeper running as deployed (shared/sweep, batch 10,000, SWEEP_PAUSE 200ms)"
	caseTrafficFlatOut  = "sweeper running flat out (shared/sweep, batch 10,000, no pause)"
)

// benchTraffic times register-and-complete of fresh ULID keys through the
// Postgres live store, from trafficWriters goroutines, on a live table
// holding backlog expired rows: with no sweeper, and while the project's
// sweeper moves that backlog flat out, in trafficRounds rounds of ABBA
// order. The live table is reloaded to the same state before each run.
func benchTraffic(ctx context.Context, base string, ops, backlog int, p *progress) (trafficSection, error) {
	sec := trafficSection{Ops: ops, Writers: trafficWriters, Backlog: backlog}
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
	for round := 0; round < trafficRounds; round++ {
		for _, i := range roundOrder(round) {
			c := trafficCases[i]
			name := c.name
			p.Step("traffic: round %d/%d: reload %d expired live rows for %s", round+1, trafficRounds, backlog, name)
			if err := reloadTrafficLive(ctx, db); err != nil {
				return sec, err
			}
			p.Step("traffic: round %d/%d: %d register-and-complete, %d writers, %s", round+1, trafficRounds, perRound, trafficWriters, name)
			run, err := runTraffic(ctx, db, parts, perRound, c, p)
			if err != nil {
				return sec, fmt.Errorf("%s: %w", name, err)
			}
			runs[i] = append(runs[i], run)
		}
	}
	sec.Ops = perRound * trafficRounds
	sec.Rounds = trafficRounds
	for i, c := range trafficCases {
		sec.Results = append(sec.Results, combineRuns(c.name, c.sweeping, runs[i]))
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

	for i := range sec.Results {
		sec.Results[i].P50VsBaseline = ratio(sec.Results[i].P50MS, sec.Results[0].P50MS)
		sec.Results[i].P99VsBaseline = ratio(sec.Results[i].P99MS, sec.Results[0].P99MS)
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
		"TRUNCATE idempotency_key_archive",
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

func (l *sweeperLoop) run(ctx context.Context, db *benchDB, parts *partition.Manager, pause time.Duration, p *progress) error {
	var base int64
	var once sync.Once
	for {
		var last time.Duration
		s, err := sweep.New(db.Pool, sweep.Config{
			BatchSize: sweepBatch,
			Pause:     pause,
			OnBatch: func(pr sweep.Progress) {
				now := time.Now()
				l.mu.Lock()
				l.batches = append(l.batches, pr.Elapsed-last)
				l.batchEnds = append(l.batchEnds, now)
				l.mu.Unlock()
				last = pr.Elapsed
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
		for _, sql := range []string{"TRUNCATE idempotency_key_archive", refillTrafficSQL} {
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

// runTraffic runs ops register-and-complete operations split over the
// writers, beside the sweeper when sweeping, and times each.
func runTraffic(ctx context.Context, db *benchDB, parts *partition.Manager, ops int, c trafficCase, p *progress) (trafficRun, error) {
	var res trafficRun
	store := livestore.NewPostgres(db.Pool)

	var loop *sweeperLoop
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	sweepDone := make(chan error, 1)
	if c.sweeping {
		loop = &sweeperLoop{started: make(chan struct{})}
		go func() { sweepDone <- loop.run(sweepCtx, db, parts, c.pause, p) }()
	}

	// Warm up the writers' connections and the store's lease, untimed.
	if err := runWriters(ctx, store, trafficWarmup, 1000, nil); err != nil {
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
	record := func(d time.Duration) {
		mu.Lock()
		times = append(times, d)
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
	werr := runWriters(ctx, store, ops, 2000, record)
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
	res.times = times
	res.elapsed = t1.Sub(t0)
	if loop != nil {
		res.swept = movedAtEnd - movedAtStart
		loop.mu.Lock()
		res.batches = batchesWithin(loop.batches, loop.batchEnds, t0, t1)
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
func runWriters(ctx context.Context, store *livestore.Postgres, ops int, seed uint64, record func(time.Duration)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	errs := make(chan error, trafficWriters)
	var wg sync.WaitGroup
	for w := 0; w < trafficWriters; w++ {
		wg.Add(1)
		go func(g *keyGen) {
			defer wg.Done()
			for next.Add(1) <= int64(ops) {
				d, err := registerAndComplete(ctx, store, g)
				if err != nil {
					errs <- err
					cancel()
					return
				}
				if record != nil {
					record(d)
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
