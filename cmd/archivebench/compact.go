package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// compactResult is the archive's storage after the project's sweeper filled
// it, and again after the partition manager compacted it.
type compactResult struct {
	Keys             string   `json:"keys"`
	AvgKeyBytes      float64  `json:"avg_key_bytes"`
	AvgResourceBytes float64  `json:"avg_resource_id_bytes"`
	Before           storage  `json:"before"`
	After            storage  `json:"after"`
	Compacted        []string `json:"compacted"`
	Seconds          float64  `json:"compact_seconds"`
	// Lookups ran through archive.Reader while the manager compacted.
	Lookups       int     `json:"lookups_during"`
	LookupsFailed int     `json:"lookups_failed_during"`
	LookupP99MS   float64 `json:"lookup_p99_ms_during"`
	LookupMaxMS   float64 `json:"lookup_max_ms_during"`
}

type compactSection struct {
	Rows  int             `json:"rows"`
	Cases []compactResult `json:"cases"`
}

const (
	compactSweepKeys = "the sweep's keys (a third ULID, UUIDv7, plain; 27-byte resource ids)"
	compactIssueKeys = "issue 10's keys (60-byte tenant-scoped UUIDv7, 27-byte resource ids)"
)

// benchCompact fills an archive as the sweep measurement does (the same
// live rows, moved by the project's sweeper), measures it, runs the
// partition manager with compaction on a clock two months ahead (so that
// the month the rows expired in is closed), and measures it again; then the
// same with issue 10's keys. Lookups run beside the compaction.
func benchCompact(ctx context.Context, base string, rows int, p *progress) (compactSection, error) {
	sec := compactSection{Rows: rows}
	for _, c := range []struct {
		keys string
		load func(context.Context, *benchDB, int, *progress) error
	}{
		{compactSweepKeys, func(ctx context.Context, db *benchDB, rows int, p *progress) error {
			return loadLiveSource(ctx, db, rows, 0, p)
		}},
		{compactIssueKeys, loadTenantSource},
	} {
		res, err := compactCase(ctx, base, rows, c.keys, c.load, p)
		if err != nil {
			return sec, fmt.Errorf("%s: %w", c.keys, err)
		}
		sec.Cases = append(sec.Cases, res)
	}
	return sec, nil
}

func compactCase(ctx context.Context, base string, rows int, keys string, load func(context.Context, *benchDB, int, *progress) error, p *progress) (compactResult, error) {
	res := compactResult{Keys: keys}
	db, parts, err := newLiveBenchDB(ctx, base, "compact")
	if err != nil {
		return res, err
	}
	defer db.Drop()
	if err := load(ctx, db, rows, p); err != nil {
		return res, err
	}
	p.Step("compact: sweep %d rows into the archive (%s)", rows, keys)
	if err := reloadLive(ctx, db); err != nil {
		return res, err
	}
	if err := runProjectSweeper(ctx, db, parts, p, &sweepResult{}); err != nil {
		return res, err
	}
	if err := db.Pool.QueryRow(ctx, `SELECT avg(octet_length(scoped_key))::float8, avg(octet_length(resource_id))::float8
		FROM idempotency_key_archive`).Scan(&res.AvgKeyBytes, &res.AvgResourceBytes); err != nil {
		return res, fmt.Errorf("measure key length: %w", err)
	}
	if res.Before, err = measureStorage(ctx, db); err != nil {
		return res, err
	}
	ahead := time.Now().AddDate(0, 2, 0)
	m, err := partition.NewManager(db.Pool, partition.Config{
		CompactPerRun: partition.MaxCompactPerRun, StatementTimeout: 15 * time.Minute, Now: func() time.Time { return ahead },
	}, nil)
	if err != nil {
		return res, err
	}

	p.Step("compact: the partition manager compacts, lookups beside it")
	stop := make(chan struct{})
	lookups, err := lookUpDuring(ctx, db, stop)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	run, err := m.Run(ctx, false)
	res.Seconds = time.Since(t0).Seconds()
	close(stop)
	latencies, failed := lookups()
	if err != nil {
		return res, fmt.Errorf("compact: %w", err)
	}
	res.Compacted = run.Compacted
	res.Lookups, res.LookupsFailed = len(latencies), failed
	res.LookupP99MS, res.LookupMaxMS = ms(percentile(latencies, 99)), ms(percentile(latencies, 100))
	if res.After, err = measureStorage(ctx, db); err != nil {
		return res, err
	}
	if res.After.Rows != res.Before.Rows {
		return res, fmt.Errorf("compaction changed the rows: %d before, %d after", res.Before.Rows, res.After.Rows)
	}
	return res, nil
}

const (
	sampleKeysSQL = "SELECT scoped_key FROM idempotency_key_archive TABLESAMPLE SYSTEM (1) LIMIT 1000"
	firstKeysSQL  = "SELECT scoped_key FROM idempotency_key_archive LIMIT 1000"
)

// lookUpDuring looks up archived keys through archive.Reader, one after
// another, until stop is closed; the function it returns waits for the last
// and returns every latency and the count of lookups that did not find
// their key.
func lookUpDuring(ctx context.Context, db *benchDB, stop <-chan struct{}) (func() ([]time.Duration, int), error) {
	// A 1% sample of pages finds nothing in a small archive (a few pages):
	// then every row is a candidate.
	var keys []string
	for _, q := range []string{sampleKeysSQL, firstKeysSQL} {
		rows, err := db.Pool.Query(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("sample keys: %w", err)
		}
		if keys, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("sample keys: %w", err)
		}
		if len(keys) > 0 {
			break
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("sample keys: the archive is empty")
	}
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	if err != nil {
		return nil, err
	}
	var latencies []time.Duration
	failed := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			if _, err := reader.Lookup(ctx, keys[i%len(keys)], nil); err != nil {
				failed++
			}
			latencies = append(latencies, time.Since(t0))
		}
	}()
	return func() ([]time.Duration, int) { wg.Wait(); return latencies, failed }, nil
}

// loadTenantSource fills bench_live_source as loadLiveSource does, with
// issue 10's rows: keys scoped to one of 1,000 tenants ("idem:v1t:" +
// 14-byte tenant + ":" + UUIDv7, 60 bytes) and 27-byte resource ids.
func loadTenantSource(ctx context.Context, db *benchDB, rows int, p *progress) error {
	p.Step("compact: generate and copy %d expired live rows with tenant-scoped keys", rows)
	g := newKeyGen(2)
	first := time.Now().Add(-25 * time.Hour)
	step := 24 * time.Hour / time.Duration(max(rows, 1))
	return copyLiveSource(ctx, db, "bench_live_source", rows, g, p, func(i int) liveRow {
		expires := first.Add(time.Duration(i) * step)
		created := expires.Add(-24 * time.Hour)
		key := fmt.Sprintf("idem:v1t:acct_%09d:%s", g.r.IntN(1000), g.uuidV7(created))
		response := fmt.Appendf(nil, `{"id":%q,"object":"charge","amount":%d,"currency":"gbp","status":"succeeded"}`, g.resourceID(), 100+g.r.IntN(100_000))
		return liveRow{key: key, response: response, created: created, expires: expires}
	})
}

// compactTables renders the compaction measurement.
func (s *compactSection) tables(w func(string, ...any)) {
	w("### 7. Storage after compaction: the partition manager rebuilds a closed month's primary key (REINDEX INDEX CONCURRENTLY, fillfactor 100), %s rows\n\n", thousands(int64(s.Rows)))
	w("| Keys | avg key / resource id B | | heap B/row | indexes B/row | of which primary key | plain-key table B/row | total B/row | row-layout floor B/row | compaction s | lookups beside it (failed) | their p99 / max ms |\n")
	w("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, c := range s.Cases {
		for i, st := range []storage{c.Before, c.After} {
			if i == 0 {
				w("| %s | %.0f / %.0f | before | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | | | |\n",
					c.Keys, c.AvgKeyBytes, c.AvgResourceBytes, st.HeapPerRow, st.IndexPerRow, st.PKPerRow, st.PlainKeysPerRow, st.TotalPerRow, st.FloorPerRow)
				continue
			}
			w("| | | after | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %s (%d) | %.2f / %.1f |\n",
				st.HeapPerRow, st.IndexPerRow, st.PKPerRow, st.PlainKeysPerRow, st.TotalPerRow, st.FloorPerRow, c.Seconds,
				thousands(int64(c.Lookups)), c.LookupsFailed, c.LookupP99MS, c.LookupMaxMS)
		}
	}
	w("\n")
}

// compactTargets compares the compacted archive with issue 10's target.
func (s *compactSection) targets(w func(string, ...any)) {
	for _, c := range s.Cases {
		w("- Storage at or under 270 B/row after compaction, %s: %.0f B/row (%s), from %.0f.\n",
			c.Keys, c.After.TotalPerRow, met(c.After.TotalPerRow <= 270), c.Before.TotalPerRow)
	}
}

// compactMethod says how the compaction figures are taken.
const compactMethod = "7. **Compaction.** A schema of its own per key shape, with BENCH_COMPACT_ROWS rows each: the sweep's live rows (the same generator and seed as measurement 1, here without the unexpired rows) or issue 10's (60-byte keys `idem:v1t:` + a 14-byte tenant, one of 1,000, + `:` + a UUIDv7; 27-byte resource ids), " +
	"moved into the archive by the project's sweeper, measured as in 3, then `partition.NewManager(pool, partition.Config{CompactPerRun: 24, StatementTimeout: 15m, Now: two months ahead}, nil).Run` (the clock ahead closes the month the rows expired in), measured again. " +
	"Lookups of 1,000 sampled keys run one after another through `archive.Reader` for as long as the run takes.\n"
