package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// sweepResult is one contender's run over the same freshly loaded live rows.
type sweepResult struct {
	Contender string `json:"contender"`
	Moved     int64  `json:"moved"`
	Archived  int64  `json:"archived"`
	LeftLive  int64  `json:"left_live"` // expired rows still live after the run
	// Unexpired is the count of rows not yet expired after the run: every
	// contender must leave all of them.
	Unexpired  int64   `json:"unexpired_after"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_sec"`
	Batches    int     `json:"batches"`
	BatchP50MS float64 `json:"batch_p50_ms"`
	BatchP95MS float64 `json:"batch_p95_ms"`
	BatchMaxMS float64 `json:"batch_max_ms"`
	WALBytes   int64   `json:"wal_bytes"`
	WALPerRow  float64 `json:"wal_bytes_per_row"`
	// VsRunbook and VsUnbatched are RowsPerSec over the other contenders'.
	VsRunbook   float64 `json:"vs_runbook"`
	VsUnbatched float64 `json:"vs_unbatched"`
	Storage     storage `json:"storage"`
}

type sweepSection struct {
	LiveRows    int           `json:"live_rows"`
	Unexpired   int           `json:"unexpired_rows"`
	BatchSize   int           `json:"batch_size"`
	AvgKeyBytes float64       `json:"avg_key_bytes"`
	LoadSeconds float64       `json:"load_seconds"`
	Contenders  []sweepResult `json:"contenders"`
}

const (
	contenderProject   = "project sweeper (shared/sweep)"
	contenderRunbook   = "runbook Step 2 SQL, batch 10,000"
	contenderUnbatched = "unbatched DELETE ... RETURNING → INSERT"
)

const sweepBatch = 10_000

// runbookStep2SQL is the runbook's Step 2 statement exactly as written. Its
// DELETE ... USING archived joins on what the INSERT returned, so a row whose
// archive row already exists (ON CONFLICT DO NOTHING returns nothing for it)
// is never deleted: the runbook's known bug. The bench's archive starts
// empty, so no row conflicts and the statement moves every row.
const runbookStep2SQL = `
WITH expired AS (
    SELECT scoped_key, fingerprint, status_code, response->>'id' AS resource_id,
           created_at, expires_at
      FROM idempotency_keys
     WHERE expires_at < now()
     ORDER BY expires_at
     LIMIT 10000
     FOR UPDATE SKIP LOCKED             -- concurrent sweepers never block each other
), archived AS (
    INSERT INTO idempotency_key_archive
        (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
    SELECT scoped_key, fingerprint, status_code, resource_id, created_at, expires_at
      FROM expired
    ON CONFLICT (scoped_key, expired_at) DO NOTHING
    RETURNING scoped_key
)
DELETE FROM idempotency_keys k
 USING archived a
 WHERE k.scoped_key = a.scoped_key`

// unbatchedSQL moves every expired row in one statement: the practical limit
// of this machine and schema, with no bound on the lock or the transaction.
const unbatchedSQL = `
WITH moved AS (
    DELETE FROM idempotency_keys WHERE expires_at < now()
    RETURNING scoped_key, fingerprint, state, status_code, response, resource_id, created_at, expires_at
)
INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
SELECT scoped_key, fingerprint,
       CASE WHEN state = 'completed' THEN status_code ELSE 0 END,
       COALESCE(resource_id, response->>'id'),
       created_at, expires_at
  FROM moved`

// benchSweep loads rows expired live rows once into an unlogged source table,
// then, for each contender, reloads the live table from it, empties the
// archive, and times the contender moving everything.
func benchSweep(ctx context.Context, base string, rows, unexpired int, p *progress) (sweepSection, error) {
	sec := sweepSection{LiveRows: rows, Unexpired: unexpired, BatchSize: sweepBatch}
	db, parts, err := newLiveBenchDB(ctx, base, "sweep")
	if err != nil {
		return sec, err
	}
	defer db.Drop()
	start := time.Now()
	if err := loadLiveSource(ctx, db, rows, unexpired, p); err != nil {
		return sec, err
	}
	sec.LoadSeconds = time.Since(start).Seconds()
	if err := db.Pool.QueryRow(ctx, "SELECT avg(octet_length(scoped_key))::float8 FROM bench_live_source WHERE expires_at < now()").Scan(&sec.AvgKeyBytes); err != nil {
		return sec, fmt.Errorf("measure key length: %w", err)
	}

	contenders := []struct {
		name string
		run  func(context.Context, *benchDB, *partition.Manager, *progress, *sweepResult) error
	}{
		{contenderProject, runProjectSweeper},
		{contenderRunbook, runRunbookLoop},
		{contenderUnbatched, runUnbatched},
	}
	for _, c := range contenders {
		res := sweepResult{Contender: c.name}
		p.Step("sweep: reload %d live rows for %s", rows, c.name)
		if err := reloadLive(ctx, db); err != nil {
			return sec, err
		}
		p.Step("sweep: %s", c.name)
		lsn, err := walLSN(ctx, db.Pool)
		if err != nil {
			return sec, err
		}
		t0 := time.Now()
		if err := c.run(ctx, db, parts, p, &res); err != nil {
			return sec, fmt.Errorf("%s: %w", c.name, err)
		}
		elapsed := time.Since(t0)
		if res.WALBytes, err = walSince(ctx, db.Pool, lsn); err != nil {
			return sec, err
		}
		res.Seconds = elapsed.Seconds()
		res.RowsPerSec = float64(res.Moved) / elapsed.Seconds()
		res.WALPerRow = ratio(float64(res.WALBytes), float64(res.Moved))
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE expires_at < now()").Scan(&res.LeftLive); err != nil {
			return sec, fmt.Errorf("count what %s left: %w", c.name, err)
		}
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE expires_at >= now()").Scan(&res.Unexpired); err != nil {
			return sec, fmt.Errorf("count what %s left unexpired: %w", c.name, err)
		}
		if res.Unexpired != int64(unexpired) {
			return sec, fmt.Errorf("%s: %d rows not yet expired are left of %d", c.name, res.Unexpired, unexpired)
		}
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive").Scan(&res.Archived); err != nil {
			return sec, fmt.Errorf("count what %s archived: %w", c.name, err)
		}
		if res.Storage, err = measureStorage(ctx, db); err != nil {
			return sec, err
		}
		sec.Contenders = append(sec.Contenders, res)
	}
	byName := map[string]float64{}
	for _, c := range sec.Contenders {
		byName[c.Contender] = c.RowsPerSec
	}
	for i := range sec.Contenders {
		sec.Contenders[i].VsRunbook = ratio(sec.Contenders[i].RowsPerSec, byName[contenderRunbook])
		sec.Contenders[i].VsUnbatched = ratio(sec.Contenders[i].RowsPerSec, byName[contenderUnbatched])
	}
	return sec, nil
}

const liveColumns = "scoped_key, fingerprint, state, status_code, response, created_at, expires_at, skew_ms"

// liveRow is one generated completed live row: its key, stored response and
// times.
type liveRow struct {
	key              string
	response         []byte
	created, expires time.Time
}

// copyLiveSource creates the unlogged table source like idempotency_keys and
// copies total rows into it, row(i) making the i-th. skew_ms is set, as the
// middleware sets it, so the unbounded-writer trigger never fires.
func copyLiveSource(ctx context.Context, db *benchDB, source string, total int, g *keyGen, p *progress, row func(i int) liveRow) error {
	if _, err := db.Pool.Exec(ctx, "CREATE UNLOGGED TABLE "+pgx.Identifier{source}.Sanitize()+" (LIKE idempotency_keys INCLUDING DEFAULTS)"); err != nil {
		return fmt.Errorf("create the source table: %w", err)
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= total {
			return nil, nil
		}
		r := row(i)
		i++
		if i%50_000 == 0 {
			p.Update("%d/%d rows", i, total)
		}
		return []any{r.key, g.fingerprint(), "completed", int16(201), r.response, r.created, r.expires, int64(300_000)}, nil
	})
	cols := []string{"scoped_key", "fingerprint", "state", "status_code", "response", "created_at", "expires_at", "skew_ms"}
	n, err := db.Pool.CopyFrom(ctx, pgx.Identifier{source}, cols, src)
	if err != nil {
		return fmt.Errorf("copy live rows: %w", err)
	}
	if n != int64(total) {
		return fmt.Errorf("copy live rows: copied %d of %d", n, total)
	}
	return nil
}

// charge is a small stored charge response with resource id id.
func (g *keyGen) charge(id string, created time.Time) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"charge","amount":%d,"currency":"gbp","status":"succeeded","created":%d}`,
		id, 100+g.r.IntN(100_000), created.Unix())
}

// loadLiveSource fills bench_live_source with rows completed keys that
// expired over the last day and unexpired keys that expire over the next
// (the day of traffic a live table always holds), in expiry order (the
// order a live table is written in). A third of the keys are ULIDs, a third
// UUIDv7, a third plain; each stored response is a small charge with its id.
func loadLiveSource(ctx context.Context, db *benchDB, rows, unexpired int, p *progress) error {
	p.Step("sweep: generate and copy %d expired and %d unexpired live rows", rows, unexpired)
	g := newKeyGen(1)
	now := time.Now()
	first := now.Add(-25 * time.Hour)
	step := 24 * time.Hour / time.Duration(max(rows, 1))
	// Unexpired rows expire from an hour ahead: none expires during the run.
	ahead := now.Add(time.Hour)
	aheadStep := 23 * time.Hour / time.Duration(max(unexpired, 1))
	return copyLiveSource(ctx, db, "bench_live_source", rows+unexpired, g, p, func(i int) liveRow {
		expires := first.Add(time.Duration(i) * step)
		if i >= rows {
			expires = ahead.Add(time.Duration(i-rows) * aheadStep)
		}
		created := expires.Add(-24 * time.Hour)
		return liveRow{response: g.charge(g.resourceID(), created), key: g.key(g.r.IntN(shapes), created), created: created, expires: expires}
	})
}

// reloadLive empties the archive and the live table and refills the live
// table from the source, then vacuums and analyzes it and checkpoints, so
// every contender starts from the same state.
//
// The archive's insert trigger indexes each key without a timestamp in
// idempotency_archive_plain_keys (migration 006), so that table is emptied
// with the archive: left full, every contender after the first would find
// each of its plain keys already indexed (ON CONFLICT DO NOTHING, no insert)
// and be timed doing less work than the first.
// emptyArchiveSQL empties the archive and the plain keys' index with it:
// left full, a later contender's sweeper would meet every plain key already
// indexed, and do other work than the first (a unique violation, then the
// insert again with ON CONFLICT).
const emptyArchiveSQL = "TRUNCATE idempotency_key_archive, idempotency_archive_plain_keys"

func reloadLive(ctx context.Context, db *benchDB) error {
	for _, sql := range []string{
		"TRUNCATE idempotency_keys",
		emptyArchiveSQL,
		"INSERT INTO idempotency_keys (" + liveColumns + ") SELECT " + liveColumns + " FROM bench_live_source ORDER BY expires_at",
		"VACUUM (ANALYZE) idempotency_keys",
		"ANALYZE idempotency_key_archive",
	} {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("reload the live table: %s: %w", sql, err)
		}
	}
	// Flush what the reload dirtied, so that its writes do not land in a
	// contender's timing; a role that may not checkpoint skips it.
	_, _ = db.Pool.Exec(ctx, "CHECKPOINT")
	return nil
}

func runProjectSweeper(ctx context.Context, db *benchDB, parts *partition.Manager, p *progress, res *sweepResult) error {
	var batches []time.Duration
	s, err := sweep.New(db.Pool, sweep.Config{
		BatchSize: sweepBatch,
		Pause:     0,
		OnBatch: func(pr sweep.Progress) {
			batches = append(batches, pr.Took)
			p.Update("%d rows moved, %d batches", pr.Moved, pr.Batches)
		},
	}, parts, nil)
	if err != nil {
		return err
	}
	r, err := s.Run(ctx)
	if err != nil {
		return err
	}
	if !r.Drained {
		return fmt.Errorf("the sweeper stopped (%s) with %d expired rows left", r.Stopped, r.Backlog)
	}
	res.Moved = r.Moved
	setBatches(res, batches)
	return nil
}

// runRunbookLoop runs the runbook's Python loop: the statement, in its own
// transaction, until it moves nothing (without the runbook's 0.2 s pause,
// as the project's sweeper runs with Pause 0 here).
func runRunbookLoop(ctx context.Context, db *benchDB, _ *partition.Manager, p *progress, res *sweepResult) error {
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var batches []time.Duration
	for {
		t0 := time.Now()
		tag, err := conn.Exec(ctx, runbookStep2SQL)
		if err != nil {
			return fmt.Errorf("batch %d: %w", len(batches)+1, err)
		}
		moved := tag.RowsAffected()
		if moved == 0 {
			break
		}
		batches = append(batches, time.Since(t0))
		res.Moved += moved
		p.Update("%d rows moved, %d batches", res.Moved, len(batches))
	}
	setBatches(res, batches)
	return nil
}

func runUnbatched(ctx context.Context, db *benchDB, _ *partition.Manager, _ *progress, res *sweepResult) error {
	t0 := time.Now()
	tag, err := db.Pool.Exec(ctx, unbatchedSQL)
	if err != nil {
		return err
	}
	res.Moved = tag.RowsAffected()
	setBatches(res, []time.Duration{time.Since(t0)})
	return nil
}

func setBatches(res *sweepResult, batches []time.Duration) {
	res.Batches = len(batches)
	res.BatchP50MS = ms(percentile(batches, 50))
	res.BatchP95MS = ms(percentile(batches, 95))
	res.BatchMaxMS = ms(percentile(batches, 100))
}

// storage is the archive's size after a sweep.
type storage struct {
	Rows       int64 `json:"rows"`
	Partitions int   `json:"partitions"`
	HeapBytes  int64 `json:"heap_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	PKBytes    int64 `json:"primary_key_bytes"`
	// PlainKeysBytes is idempotency_archive_plain_keys (heap and indexes),
	// part of the archive's storage: counted in TotalBytes.
	PlainKeysBytes  int64   `json:"plain_keys_bytes"`
	TotalBytes      int64   `json:"total_bytes"`
	HeapPerRow      float64 `json:"heap_bytes_per_row"`
	IndexPerRow     float64 `json:"index_bytes_per_row"`
	PKPerRow        float64 `json:"primary_key_bytes_per_row"`
	PlainKeysPerRow float64 `json:"plain_keys_bytes_per_row"`
	TotalPerRow     float64 `json:"total_bytes_per_row"`
	FloorPerRow     float64 `json:"floor_bytes_per_row"` // full heap pages and a full primary key, from the rows' own sizes
	VsRunbook110    float64 `json:"vs_runbook_110"`
}

// runbookModelBytes is the runbook's modelled archive size per row.
const runbookModelBytes = 110

const storageSQL = `
SELECT count(*)::int,
       coalesce(sum(pg_relation_size(i.inhrelid)), 0)::bigint,
       coalesce(sum(pg_indexes_size(i.inhrelid)), 0)::bigint,
       coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint,
       coalesce((SELECT sum(pg_relation_size(x.indexrelid))
                   FROM pg_index x JOIN pg_inherits j ON j.inhrelid = x.indrelid
                  WHERE j.inhparent = 'idempotency_key_archive'::regclass AND x.indisprimary), 0)::bigint
  FROM pg_inherits i
 WHERE i.inhparent = 'idempotency_key_archive'::regclass`

// floorSQL estimates the smallest the archive could be: each heap tuple
// (pg_column_size of the row includes its 24-byte header) rounded up to 8
// bytes plus its 4-byte line pointer, and each primary-key entry (8-byte
// index tuple header, the key, the 8-byte timestamp, rounded up to 8) plus
// its line pointer; page headers and fill factor ignored.
const floorSQL = `
SELECT coalesce(avg(((pg_column_size(a.*) + 7) / 8) * 8 + 4
                  + ((8 + pg_column_size(a.scoped_key) + 7) / 8) * 8 + 8 + 4), 0)::float8
  FROM idempotency_key_archive a`

func measureStorage(ctx context.Context, db *benchDB) (storage, error) {
	var s storage
	err := db.Pool.QueryRow(ctx, storageSQL).Scan(&s.Partitions, &s.HeapBytes, &s.IndexBytes, &s.TotalBytes, &s.PKBytes)
	if err != nil {
		return s, fmt.Errorf("measure the archive: %w", err)
	}
	if err := db.Pool.QueryRow(ctx, "SELECT pg_total_relation_size('idempotency_archive_plain_keys')").Scan(&s.PlainKeysBytes); err != nil {
		return s, fmt.Errorf("measure the plain-key table: %w", err)
	}
	s.TotalBytes += s.PlainKeysBytes
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive").Scan(&s.Rows); err != nil {
		return s, fmt.Errorf("count the archive: %w", err)
	}
	if err := db.Pool.QueryRow(ctx, floorSQL).Scan(&s.FloorPerRow); err != nil {
		return s, fmt.Errorf("measure the archive's rows: %w", err)
	}
	n := float64(s.Rows)
	s.HeapPerRow = ratio(float64(s.HeapBytes), n)
	s.IndexPerRow = ratio(float64(s.IndexBytes), n)
	s.PKPerRow = ratio(float64(s.PKBytes), n)
	s.PlainKeysPerRow = ratio(float64(s.PlainKeysBytes), n)
	s.TotalPerRow = ratio(float64(s.TotalBytes), n)
	s.VsRunbook110 = s.TotalPerRow / runbookModelBytes
	return s, nil
}
