package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// lookupResult compares the project's lookup with the naive key-only query
// for one kind of key, at one archive size.
type lookupResult struct {
	Case        string  `json:"case"`
	ReaderP50MS float64 `json:"reader_p50_ms"`
	ReaderP99MS float64 `json:"reader_p99_ms"`
	// ReaderExecP50MS and ReaderExecP99MS time the Reader on a pool in
	// DATABASE_EXEC_MODE=exec, as the CDK stack runs it behind RDS Proxy:
	// nothing is prepared, so every statement is planned on every lookup.
	ReaderExecP50MS float64 `json:"reader_exec_mode_p50_ms"`
	ReaderExecP99MS float64 `json:"reader_exec_mode_p99_ms"`
	NaiveP50MS      float64 `json:"naive_p50_ms"`
	NaiveP99MS      float64 `json:"naive_p99_ms"`
	P50VsNaive      float64 `json:"p50_vs_naive"`
	P99VsNaive      float64 `json:"p99_vs_naive"`
	// Relation locks one lookup takes and relations its plan scans, each
	// the mean over ten keys of the case.
	ReaderLocks float64 `json:"reader_relation_locks"`
	// ReaderLocksExec is ReaderLocks in DATABASE_EXEC_MODE=exec, the mode
	// the CDK stack runs behind RDS Proxy: no statement is prepared, so
	// every run is planned, with every index of each partition locked.
	ReaderLocksExec float64 `json:"reader_relation_locks_exec_mode"`
	NaiveLocks      float64 `json:"naive_relation_locks"`
	ReaderParts     float64 `json:"reader_partitions_read"`
	NaiveParts      float64 `json:"naive_partitions_read"`
}

type lookupSet struct {
	MonthsWithData int            `json:"months_with_data"`
	Partitions     int            `json:"partitions"`
	Rows           int64          `json:"rows"`
	Results        []lookupResult `json:"results"`
}

type lookupSection struct {
	RowsPerMonth int         `json:"rows_per_month"`
	Lookups      int         `json:"lookups_per_case"`
	Sets         []lookupSet `json:"sets"`
	Storage      storage     `json:"storage"`
}

// The lookup cases. A late retry arrives soon after its key expired, so a
// timestamped key that is found was minted in the last two months; the
// fresh-key path looks up keys minted now, which are not found.
const (
	caseTSFound       = "timestamped, found (expired in the last 2 months)"
	caseTSFoundOld    = "timestamped, found (any month)"
	caseTSNotFound    = "timestamped, not found (minted now)"
	casePlainFound    = "plain, found (any month)"
	casePlainNotFound = "plain, not found"
)

// naiveLookupSQL is the baseline: the key alone, no partition bound.
const naiveLookupSQL = `SELECT status_code, resource_id, created_at, expired_at, fingerprint FROM idempotency_key_archive WHERE scoped_key = $1`

// samplesPerShape is how many keys of each shape are kept from each month
// for the found cases.
const samplesPerShape = 25

type keySamples struct {
	recentTS []string // timestamped keys of the newest two months
	allTS    []string
	plain    []string
}

func benchLookup(ctx context.Context, base string, months []int, perMonth, lookups int, p *progress) (lookupSection, error) {
	sec := lookupSection{RowsPerMonth: perMonth, Lookups: lookups}
	db, err := newBenchDB(ctx, base, "lookup")
	if err != nil {
		return sec, err
	}
	defer db.Drop()
	parts, err := db.partitions(ctx)
	if err != nil {
		return sec, err
	}
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	if err != nil {
		return sec, err
	}
	execPool, err := db.openPool(ctx, 2, true)
	if err != nil {
		return sec, err
	}
	defer execPool.Close()
	execReader, err := archive.NewReader(execPool, archive.Config{}, nil)
	if err != nil {
		return sec, err
	}
	readers := lookupReaders{cached: reader, exec: execReader}
	g := newKeyGen(2)
	samples := &keySamples{}
	thisMonth := partition.MonthStart(time.Now())
	loaded := 0
	for _, n := range months {
		// Months are added going back in time: the newest already hold data.
		for m := loaded; m < n; m++ {
			month := thisMonth.AddDate(0, -m, 0)
			if _, err := parts.EnsureMonth(ctx, month); err != nil {
				return sec, fmt.Errorf("create partition %s: %w", partition.Name(month), err)
			}
			p.Step("lookup: load month %d of %d (%s), %d rows", m+1, n, month.Format("2006-01"), perMonth)
			if err := loadArchiveMonth(ctx, db, g, month, perMonth, m < 2, samples); err != nil {
				return sec, err
			}
		}
		loaded = max(loaded, n)
		// Vacuumed as well as analyzed: the months of a real archive are
		// long settled (hint bits set, visible to all), and autovacuum
		// working through freshly loaded partitions would share the
		// machine with the lookups being timed.
		p.Step("lookup: vacuum and analyze %d months", loaded)
		if _, err := db.Pool.Exec(ctx, "VACUUM (ANALYZE) idempotency_key_archive, idempotency_archive_plain_keys"); err != nil {
			return sec, fmt.Errorf("vacuum the archive: %w", err)
		}
		// And checkpointed, as before each sweep contender: the load's WAL,
		// with what earlier measurements left, would otherwise trigger a
		// checkpoint in the middle of the timed lookups.
		_, _ = db.Pool.Exec(ctx, "CHECKPOINT")
		set := lookupSet{MonthsWithData: loaded}
		if set.Partitions, err = db.partitionCount(ctx); err != nil {
			return sec, err
		}
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive").Scan(&set.Rows); err != nil {
			return sec, fmt.Errorf("count the archive: %w", err)
		}
		for _, c := range lookupCases(g, samples) {
			p.Step("lookup: %d partitions, %s", set.Partitions, c.name)
			r, err := measureLookupCase(ctx, db.Pool, readers, c, lookups, p)
			if err != nil {
				return sec, fmt.Errorf("lookup at %d partitions, %s: %w", set.Partitions, c.name, err)
			}
			set.Results = append(set.Results, r)
		}
		sec.Sets = append(sec.Sets, set)
	}
	if sec.Storage, err = measureStorage(ctx, db); err != nil {
		return sec, err
	}
	return sec, nil
}

// loadArchiveMonth copies perMonth archive rows expiring in month (up to an
// hour ago), a third of each key shape, the key's timestamp at created_at.
func loadArchiveMonth(ctx context.Context, db *benchDB, g *keyGen, month time.Time, perMonth int, recent bool, s *keySamples) error {
	end := month.AddDate(0, 1, 0)
	now := time.Now()
	if limit := now.Add(-time.Hour); limit.Before(end) {
		end = limit
	}
	if !end.After(month) && now.After(month) {
		// The first hour of the month: its rows expired in the half of
		// it that has passed.
		end = month.Add(now.Sub(month) / 2)
	}
	span := end.Sub(month)
	if span <= 0 {
		return fmt.Errorf("month %s has not started", month.Format("2006-01"))
	}
	kept := [shapes]int{}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= perMonth {
			return nil, nil
		}
		i++
		expired := month.Add(time.Duration(g.r.Int64N(int64(span))))
		created := expired.Add(-24 * time.Hour)
		shape := g.r.IntN(shapes)
		key := g.key(shape, created)
		if kept[shape] < samplesPerShape {
			kept[shape]++
			if shape == shapePlain {
				s.plain = append(s.plain, key)
			} else {
				s.allTS = append(s.allTS, key)
				if recent {
					s.recentTS = append(s.recentTS, key)
				}
			}
		}
		return []any{key, g.fingerprint(), int16(201), g.resourceID(), created, expired}, nil
	})
	cols := []string{"scoped_key", "fingerprint", "status_code", "resource_id", "created_at", "expired_at"}
	if _, err := db.Pool.CopyFrom(ctx, pgx.Identifier{"idempotency_key_archive"}, cols, src); err != nil {
		return fmt.Errorf("copy archive rows for %s: %w", month.Format("2006-01"), err)
	}
	return nil
}

type lookupCase struct {
	name  string
	found bool
	key   func(i int) string
}

func lookupCases(g *keyGen, s *keySamples) []lookupCase {
	pick := func(keys []string) func(int) string {
		return func(i int) string { return keys[i%len(keys)] }
	}
	cases := []lookupCase{
		{caseTSFound, true, pick(s.recentTS)},
		{caseTSNotFound, false, func(i int) string {
			// ULID and UUIDv7 in turn, minted now: the fresh-key path.
			return g.key(i%2, time.Now())
		}},
		{caseTSFoundOld, true, pick(s.allTS)},
		{casePlainFound, true, pick(s.plain)},
		{casePlainNotFound, false, func(int) string { return g.key(shapePlain, time.Time{}) }},
	}
	out := cases[:0]
	for _, c := range cases {
		// A case whose samples are empty (no data of that shape) is left out.
		if !c.found || len(s.plain) > 0 && len(s.recentTS) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// lookupReaders are the Reader on the bench's pool, which prepares and caches
// statements (DATABASE_EXEC_MODE=cache_statement, the default), and one on a
// pool in exec mode, as deployed behind RDS Proxy.
type lookupReaders struct {
	cached, exec *archive.Reader
}

// timedLookup runs one lookup of key and checks its answer against found.
func timedLookup(ctx context.Context, r *archive.Reader, key string, found bool) (time.Duration, error) {
	t0 := time.Now()
	_, err := r.Lookup(ctx, key, nil)
	d := time.Since(t0)
	switch {
	case err == nil && !found:
		return d, fmt.Errorf("the Reader found %s, which the archive does not hold", key)
	case errors.Is(err, archive.ErrNotFound) && found:
		return d, fmt.Errorf("the Reader did not find %s, which the archive holds", key)
	case err != nil && !errors.Is(err, archive.ErrNotFound):
		return d, fmt.Errorf("lookup %s: %w", key, err)
	}
	return d, nil
}

// measureLookupCase runs the Reader's lookup in each mode and the naive query
// in turn, n times each after a warm-up, and counts each one's relation locks.
func measureLookupCase(ctx context.Context, pool *pgxpool.Pool, readers lookupReaders, c lookupCase, n int, p *progress) (lookupResult, error) {
	res := lookupResult{Case: c.name}
	reader := readers.cached
	const warmup = 50
	var readerTimes, execTimes, naiveTimes []time.Duration
	for i := 0; i < warmup+n; i++ {
		key := c.key(i)
		// The two modes take turns going first, so that neither always
		// finds the pages the other just read.
		var d, ed time.Duration
		var err error
		for _, exec := range []bool{i%2 == 0, i%2 != 0} {
			if exec {
				if ed, err = timedLookup(ctx, readers.exec, key, c.found); err != nil {
					return res, fmt.Errorf("exec mode: %w", err)
				}
			} else if d, err = timedLookup(ctx, reader, key, c.found); err != nil {
				return res, err
			}
		}
		t0 := time.Now()
		rows, err := naiveLookup(ctx, pool, key)
		nd := time.Since(t0)
		if err != nil {
			return res, err
		}
		if (rows > 0) != c.found {
			return res, fmt.Errorf("the naive query returned %d rows for %s", rows, key)
		}
		if i >= warmup {
			readerTimes = append(readerTimes, d)
			execTimes = append(execTimes, ed)
			naiveTimes = append(naiveTimes, nd)
		}
		if i%200 == 0 {
			p.Update("%d/%d", i, warmup+n)
		}
	}
	res.ReaderP50MS, res.ReaderP99MS = ms(percentile(readerTimes, 50)), ms(percentile(readerTimes, 99))
	res.ReaderExecP50MS, res.ReaderExecP99MS = ms(percentile(execTimes, 50)), ms(percentile(execTimes, 99))
	res.NaiveP50MS, res.NaiveP99MS = ms(percentile(naiveTimes, 50)), ms(percentile(naiveTimes, 99))
	res.P50VsNaive = ratio(res.ReaderP50MS, res.NaiveP50MS)
	res.P99VsNaive = ratio(res.ReaderP99MS, res.NaiveP99MS)

	// Locks and partitions are averaged over keys spread across the case's
	// samples (an old timestamped key reads more partitions than a new one).
	const spread = 10
	var sum [5]int
	for i := range spread {
		key := c.key(i * 7919)
		// The Reader's statements, run on the bench's own connection so
		// that their locks can be counted inside a transaction.
		stmts, err := reader.LookupStatements(ctx, key)
		if err != nil {
			return res, err
		}
		rl, rp, re := 0, 0, 0
		for _, st := range stmts {
			l, p, err := locksAndPartitions(ctx, pool, pgx.QueryExecModeCacheStatement, st.SQL, st.Args...)
			if err != nil {
				return res, err
			}
			le, _, err := locksAndPartitions(ctx, pool, pgx.QueryExecModeExec, st.SQL, st.Args...)
			if err != nil {
				return res, err
			}
			rl, rp, re = rl+l, rp+p, re+le
		}
		nl, np, err := locksAndPartitions(ctx, pool, pgx.QueryExecModeCacheStatement, naiveLookupSQL, key)
		if err != nil {
			return res, err
		}
		sum[0], sum[1], sum[2], sum[3], sum[4] = sum[0]+rl, sum[1]+rp, sum[2]+nl, sum[3]+np, sum[4]+re
	}
	res.ReaderLocks, res.ReaderParts = float64(sum[0])/spread, float64(sum[1])/spread
	res.NaiveLocks, res.NaiveParts = float64(sum[2])/spread, float64(sum[3])/spread
	res.ReaderLocksExec = float64(sum[4]) / spread
	return res, nil
}

func naiveLookup(ctx context.Context, pool *pgxpool.Pool, key string) (int, error) {
	rows, err := pool.Query(ctx, naiveLookupSQL, key)
	if err != nil {
		return 0, fmt.Errorf("naive lookup: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("naive lookup: %w", err)
	}
	return n, nil
}

// locksAndPartitions counts the relation locks one run of sql takes (after
// the connection has run it often enough for the plan cache to settle on
// custom or generic plans, as a long-lived pool's connections do), and the
// relations its plan reads.
func locksAndPartitions(ctx context.Context, pool *pgxpool.Pool, mode pgx.QueryExecMode, sql string, args ...any) (locks, parts int, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	drain := func(q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}) error {
		rows, err := q.Query(ctx, sql, append([]any{mode}, args...)...)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	for range 8 {
		if err := drain(conn); err != nil {
			return 0, 0, fmt.Errorf("warm the plan cache: %w", err)
		}
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := drain(tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			SELECT count(*) FROM pg_locks
			 WHERE pid = pg_backend_pid() AND locktype = 'relation'
			   AND relation <> 'pg_catalog.pg_locks'::regclass`).Scan(&locks)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count relation locks: %w", err)
	}
	var plan []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		return 0, 0, fmt.Errorf("explain: %w", err)
	}
	n, err := relationsInPlan(plan)
	return locks, n, err
}

// relationsInPlan counts the distinct relations an EXPLAIN (FORMAT JSON)
// plan scans (partitions pruned at plan time do not appear).
func relationsInPlan(plan []byte) (int, error) {
	var doc any
	if err := json.Unmarshal(plan, &doc); err != nil {
		return 0, fmt.Errorf("read the plan: %w", err)
	}
	seen := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if name, ok := v["Relation Name"].(string); ok {
				seen[name] = true
			}
			for _, child := range v {
				walk(child)
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		}
	}
	walk(doc)
	return len(seen), nil
}
