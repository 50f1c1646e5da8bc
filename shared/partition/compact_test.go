package partition_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// The tests in this file attack compaction: it must shrink what it rebuilds,
// never lose a row from a lookup, never touch a month that is still written
// to, and leave nothing behind that a later run does not repair.

// Months as seen from decNow (2026-12-02): December is current, November the
// previous month (still archived into after midnight on the 1st), so October
// and before are closed.
var (
	sep = month(2026, time.September)
	oct = month(2026, time.October)
	nov = month(2026, time.November)
	dec = month(2026, time.December)
	jan = month(2027, time.January)
)

// bloated gives db the partitions around decNow, September and October, and fills
// each month in months with n rows inserted in random key order (as the
// sweeper inserts them), and returns one key of each month.
func bloated(t *testing.T, db *dbtest.DB, n int, months ...time.Time) []string {
	t.Helper()
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	_, err := m.Run(ctx, false)
	require.NoError(t, err)
	for _, mo := range []time.Time{sep, oct} {
		_, err = m.EnsureMonth(ctx, mo)
		require.NoError(t, err)
	}
	var keys []string
	for _, mo := range months {
		// No autovacuum beside the test: its ANALYZE of the fresh rows
		// holds the lock a rebuild waits for, and a run would leave the
		// month pending ("another session holds it now").
		_, err := db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{partition.Name(mo)}.Sanitize()+" SET (autovacuum_enabled = false)")
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `
			INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
			SELECT k, sha256(convert_to(k, 'UTF8')), 201, 'ch_' || md5(k), $1::timestamptz - interval '1 day', $1::timestamptz + g * interval '1 second'
			  FROM generate_series(1, $2::int) g, LATERAL (SELECT 'idem:v1:ord_' || md5($3::text || g)) AS s(k)
			 ORDER BY random()`, mo, n, mo.Format("2006_01"))
		require.NoError(t, err)
		var key string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT 'idem:v1:ord_' || md5($1::text || $2::int)", mo.Format("2006_01"), n/2).Scan(&key))
		keys = append(keys, key)
	}
	return keys
}

// pk describes the primary-key index of a partition.
type pk struct {
	OID        uint32
	Bytes      int64
	Comment    string
	Reloptions string
}

func pkOf(t *testing.T, db *dbtest.DB, name string) pk {
	t.Helper()
	var p pk
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT x.indexrelid::oid, pg_relation_size(x.indexrelid), coalesce(obj_description(x.indexrelid, 'pg_class'), ''),
		       coalesce(array_to_string(c.reloptions, ','), '')
		  FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
		 WHERE x.indrelid = $1::regclass AND x.indisprimary AND x.indisvalid`, name).Scan(&p.OID, &p.Bytes, &p.Comment, &p.Reloptions))
	return p
}

func invalidIndexes(t *testing.T, db *dbtest.DB) int64 {
	t.Helper()
	return dbtest.Count(t, db.Pool, `
		SELECT count(*) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
		 WHERE NOT x.indisvalid AND c.relnamespace = current_schema()::regnamespace`)
}

func compacting(t *testing.T, db *dbtest.DB, cfg partition.Config) *partition.Manager {
	t.Helper()
	cfg.Now = at(decNow)
	cfg.CompactPerRun = max(cfg.CompactPerRun, 1)
	return newManager(t, db.Pool, cfg)
}

// lookUpUntil looks keys up through archive.Reader until stop is closed, and
// returns how many lookups ran and the first that did not find its key.
func lookUpUntil(t *testing.T, db *dbtest.DB, keys []string, stop <-chan struct{}) func() (int64, error) {
	t.Helper()
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	var n atomic.Int64
	var first error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, k := range keys {
				if _, err := r.Lookup(context.Background(), k, nil); err != nil && first == nil {
					first = errors.New(k + ": " + err.Error())
				}
				n.Add(1)
			}
		}
	}()
	return func() (int64, error) { wg.Wait(); return n.Load(), first }
}

func TestCompactionShrinksAClosedMonthOnceAndLookupsFindEveryRow(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN closed months (September, October) and open ones (November, the
	// previous month; December, the current one; January) whose primary
	// keys the random-order inserts left bloated
	keys := bloated(t, db, 20_000, sep, oct, nov, dec, jan)
	before := map[string]pk{}
	for _, mo := range []time.Time{sep, oct, nov, dec, jan} {
		before[partition.Name(mo)] = pkOf(t, db, partition.Name(mo))
	}

	// WHEN a run compacts, while lookups run
	stop := make(chan struct{})
	wait := lookUpUntil(t, db, keys, stop)
	res, err := compacting(t, db, partition.Config{CompactPerRun: 5}).Run(ctx, false)
	close(stop)
	require.NoError(t, err)
	n, lookupErr := wait()

	// THEN it rebuilt the closed months, newest first, and nothing else
	require.Equal(t, []string{partition.Name(oct), partition.Name(sep)}, res.Compacted)
	require.Empty(t, res.CompactPending)
	require.Empty(t, res.Failed)
	require.Contains(t, strings.Join(res.Statements, "\n"), `REINDEX INDEX CONCURRENTLY "`+db.Schema+`"."idempotency_key_archive_2026_10_pkey"`)
	for _, mo := range []time.Time{sep, oct} {
		name := partition.Name(mo)
		after := pkOf(t, db, name)
		require.NotEqual(t, before[name].OID, after.OID, "%s was rebuilt", name)
		require.Less(t, float64(after.Bytes), 0.8*float64(before[name].Bytes), "%s shrank", name)
		require.Equal(t, "fillfactor=100", after.Reloptions)
		require.Contains(t, after.Comment, "compacted by the partition manager")
	}
	for _, mo := range []time.Time{nov, dec, jan} {
		require.Equal(t, before[partition.Name(mo)], pkOf(t, db, partition.Name(mo)), "%s must not be touched", partition.Name(mo))
	}
	// AND every lookup found its key, during and after
	require.NoError(t, lookupErr)
	require.Positive(t, n)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	for _, k := range keys {
		_, err := r.Lookup(ctx, k, nil)
		require.NoError(t, err, k)
	}
	require.EqualValues(t, 5*20_000, rowsThroughTheParent(t, db))

	// AND the next run compacts nothing again
	res, err = compacting(t, db, partition.Config{CompactPerRun: 5}).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Compacted)
	require.NotContains(t, strings.Join(res.Statements, "\n"), "REINDEX")
}

func TestRowsArrivingAfterCompactionStayFindable(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN October compacted
	bloated(t, db, 5_000, oct)
	res, err := compacting(t, db, partition.Config{}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{partition.Name(oct)}, res.Compacted)
	compacted := pkOf(t, db, partition.Name(oct))

	// WHEN late rows of October arrive (a sweeper far behind), in random
	// key order into the packed pages
	late := []string{"idem:v1:ord_late_a", "idem:v1:ord_late_m", "idem:v1:ord_late_z"}
	for _, k := range late {
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, ExpiredAt: oct.Add(48 * time.Hour)})
	}
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		SELECT 'idem:v1:ord_' || md5('late' || g), '\x00', 201, $1::timestamptz, $1::timestamptz + interval '1 day'
		  FROM generate_series(1, 2000) g ORDER BY random()`, oct)
	require.NoError(t, err)

	// THEN they are found through the index as through the heap
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	for _, k := range late {
		rec, err := r.Lookup(ctx, k, nil)
		require.NoError(t, err, k)
		require.Equal(t, 201, rec.Status)
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
	require.NoError(t, err)
	var viaIndex int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+partition.Name(oct)+" WHERE scoped_key >= ''").Scan(&viaIndex))
	require.EqualValues(t, 5_000+3+2_000, viaIndex)

	// AND a later run leaves the compacted index alone
	res, err = compacting(t, db, partition.Config{}).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Compacted)
	require.Equal(t, compacted.OID, pkOf(t, db, partition.Name(oct)).OID)
}

// holdWriter opens a transaction that inserted into October and holds it:
// REINDEX ... CONCURRENTLY then waits for it after building its new index,
// with the invalid index left in place.
func holdWriter(t *testing.T, db *dbtest.DB) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	var once sync.Once
	var commitErr error
	commit := func() { once.Do(func() { commitErr = tx.Commit(ctx) }) }
	t.Cleanup(func() { commit(); require.NoError(t, commitErr) })
	_, err = tx.Exec(ctx, "INSERT INTO idempotency_key_archive VALUES ('idem:v1:writer ' || gen_random_uuid(), '\\x00', 201, NULL, $1, $1)", oct.Add(time.Hour))
	require.NoError(t, err)
	return commit
}

// october is a bloated October of 5,000 rows: the schema, one of its keys,
// the partition's name and its primary key.
func october(t *testing.T) (*dbtest.DB, []string, string, pk) {
	t.Helper()
	db := dbtest.New(t)
	keys := bloated(t, db, 5_000, oct)
	return db, keys, partition.Name(oct), pkOf(t, db, partition.Name(oct))
}

func TestARebuildKilledMidwayIsRepairedByTheNextRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, keys, name, before := october(t)

	// GIVEN a REINDEX ... CONCURRENTLY whose backend was terminated (a
	// Lambda killed mid-rebuild: nothing of it ran any cleanup)
	killRebuild(t, db, name)
	require.EqualValues(t, 1, invalidIndexes(t, db), "the killed rebuild left its new index")

	// AND lookups never use the leftover
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, keys[0], nil)
	require.NoError(t, err)

	// WHEN the dry run plans THEN it would drop it and compact, and changes nothing
	res, err := compacting(t, db, partition.Config{}).Run(ctx, true)
	require.NoError(t, err)
	require.Equal(t, []string{name + "_pkey_ccnew"}, res.DroppedIndexes)
	require.Equal(t, []string{name}, res.Compacted)
	ddl := strings.Join(res.Statements, "\n")
	require.Contains(t, ddl, `DROP INDEX CONCURRENTLY IF EXISTS "`+db.Schema+`"."`+name+`_pkey_ccnew"`)
	require.Contains(t, ddl, `ALTER INDEX "`+db.Schema+`"."`+name+`_pkey" SET (fillfactor = 100)`)
	require.EqualValues(t, 1, invalidIndexes(t, db))
	require.Equal(t, before, pkOf(t, db, name))

	// WHEN the next run comes THEN it drops the leftover and compacts
	res, err = compacting(t, db, partition.Config{}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{name + "_pkey_ccnew"}, res.DroppedIndexes)
	require.Equal(t, []string{name}, res.Compacted)
	require.EqualValues(t, 0, invalidIndexes(t, db))
	require.Contains(t, pkOf(t, db, name).Comment, "compacted")
	_, err = r.Lookup(ctx, keys[0], nil)
	require.NoError(t, err)
}

func TestARebuildCancelledOrTimedOutLeavesACleanState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, keys, name, before := october(t)

	// GIVEN a writer that holds the rebuild back for longer than its 1s,
	// timed from when the rebuild is seen waiting (not from now: on a loaded
	// machine the run may start late enough that a fixed delay ends first)
	commit := holdWriter(t, db)
	go func() {
		const waiting = `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'REINDEX INDEX CONCURRENTLY%' AND strpos(query, $1) > 0
			AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`
		for deadline := time.Now().Add(time.Minute); dbtest.Count(t, db.Pool, waiting, db.Schema) == 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond)
		commit()
	}()

	// WHEN a run with a 1s statement timeout compacts
	res, err := compacting(t, db, partition.Config{StatementTimeout: time.Second}).Run(ctx, false)

	// THEN the rebuild failed, and the run cleaned up after it: no invalid
	// index, the old primary key as it was, the timeout recorded
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.ErrorContains(t, err, "later runs skip it")
	require.Empty(t, res.Compacted)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "compact", res.Failed[0].Action)
	require.EqualValues(t, 0, invalidIndexes(t, db))
	after := pkOf(t, db, name)
	require.Equal(t, before.OID, after.OID)
	require.Equal(t, "", after.Reloptions, "the fillfactor is put back")
	require.Equal(t, "idemarchive: compaction timed out after 1s", after.Comment)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, keys[0], nil)
	require.NoError(t, err)

	// AND a run with no more time skips it, and says why
	res, err = compacting(t, db, partition.Config{StatementTimeout: time.Second}).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Compacted)
	require.Len(t, res.CompactPending, 1)
	require.Contains(t, res.CompactPending[0].Reason, "timed out after 1s")
	require.NotContains(t, strings.Join(res.Statements, "\n"), "REINDEX")

	// AND a run with longer compacts it
	res, err = compacting(t, db, partition.Config{StatementTimeout: time.Minute}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{name}, res.Compacted)

	// AND a cancel (pg_cancel_backend) of a rebuild is no timeout: nothing
	// is recorded, and the next run tries again
	_, err = db.Pool.Exec(ctx, "COMMENT ON INDEX "+name+"_pkey IS NULL")
	require.NoError(t, err)
	commit = holdWriter(t, db)
	go func() {
		// Only this test's rebuild: the statement names its schema.
		const reindexing = `FROM pg_stat_activity WHERE query LIKE 'REINDEX INDEX CONCURRENTLY%' AND strpos(query, $1) > 0
			AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`
		for dbtest.Count(t, db.Pool, "SELECT count(*) "+reindexing, db.Schema) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		dbtest.Count(t, db.Pool, "SELECT count(pg_cancel_backend(pid)) "+reindexing, db.Schema)
		time.Sleep(200 * time.Millisecond)
		commit()
	}()
	res, err = compacting(t, db, partition.Config{StatementTimeout: time.Minute}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.NotContains(t, err.Error(), "later runs skip it")
	require.EqualValues(t, 0, invalidIndexes(t, db))
	require.Equal(t, "", pkOf(t, db, name).Comment)
	res, err = compacting(t, db, partition.Config{StatementTimeout: time.Minute}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{name}, res.Compacted)
}

func TestCompactionIsBoundedPerRunAndByTheDeadline(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	bloated(t, db, 1_000, sep, oct)

	// GIVEN a run too close to its deadline THEN it starts no rebuild
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := compacting(t, db, partition.Config{CompactPerRun: 2}).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Compacted)
	require.Len(t, res.CompactPending, 2)
	require.Contains(t, res.CompactPending[0].Reason, "before the run's deadline")

	// GIVEN one compaction per run THEN the newest closed month goes first
	res, err = compacting(t, db, partition.Config{CompactPerRun: 1}).Run(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, []string{partition.Name(oct)}, res.Compacted)
	require.Equal(t, []partition.Pending{{Partition: partition.Name(sep),
		Reason: "this run compacted the 1 partitions a run may (PARTITION_COMPACT_PER_RUN)"}}, res.CompactPending)

	// AND a manager that does not compact touches no index
	res, err = newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(context.Background(), false)
	require.NoError(t, err)
	require.Empty(t, res.Compacted)
	require.Empty(t, res.CompactPending)
	require.Equal(t, "", pkOf(t, db, partition.Name(sep)).Comment)
}

// A partition attached from another schema is not the manager's to compact
// or clean: it never touches an index of the same name in the archive's
// schema.
func TestAPartitionInAnotherSchemaIsLeftAlone(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	bloated(t, db, 2000, sep)
	other := db.Schema + "_other"
	exec := func(sql string, args ...any) error {
		_, err := db.Pool.Exec(ctx, sql, args...)
		return err
	}
	require.NoError(t, exec("CREATE SCHEMA "+other))
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+other+" CASCADE") })
	// October lives in the other schema (a restore into a side schema,
	// attached by hand); drop the manager's own October first.
	require.NoError(t, exec("ALTER TABLE idempotency_key_archive DETACH PARTITION "+partition.Name(oct)))
	require.NoError(t, exec("DROP TABLE "+partition.Name(oct)))
	require.NoError(t, exec(fmt.Sprintf(`CREATE TABLE %s.%s (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`, other, partition.Name(oct))))
	require.NoError(t, exec(fmt.Sprintf(`ALTER TABLE idempotency_key_archive ATTACH PARTITION %s.%s FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00')`, other, partition.Name(oct))))
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:oct_a", Status: 201, ExpiredAt: oct.Add(time.Hour)})
	// An interrupted CREATE INDEX CONCURRENTLY leaves an invalid index there.
	err := exec(fmt.Sprintf(`CREATE INDEX CONCURRENTLY evil_ccnew ON %s.%s ((1 / (status_code - 201)))`, other, partition.Name(oct)))
	require.Error(t, err)
	// And in the archive's schema, a valid index of the same name on another table.
	require.NoError(t, exec(`CREATE UNIQUE INDEX evil_ccnew ON idempotency_keys (scoped_key, expires_at)`))

	for range 2 {
		res, err := compacting(t, db, partition.Config{CompactPerRun: 1}).Run(ctx, false)
		require.NoError(t, err)
		require.Empty(t, res.DroppedIndexes)
		require.Empty(t, res.Failed)
	}
	n := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'evil_ccnew' AND relnamespace = current_schema()::regnamespace")
	m := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'evil_ccnew' AND relnamespace = $1::regnamespace", other)
	require.EqualValues(t, 1, m, "not the manager's to drop")
	require.EqualValues(t, 1, n, "the manager dropped a valid index of another table")
}

// A rebuild whose time runs out after it swapped the new index in (its last
// wait, for the old index's users, outlasts the statement timeout) has
// compacted the primary key: the run drops the old index, marks the month
// compacted and does not rebuild it again, rather than marking the rebuilt
// index as a rebuild that timed out.
func TestARebuildThatTimedOutAfterItsSwapIsCompacted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, name, before := october(t)

	// GIVEN a transaction that used the partition's indexes (planning locks
	// them all) and stays open past the rebuild's 6 s. (The rebuild's waits
	// before its swap are for the transactions of the whole database, other
	// packages' tests among them, such as one that holds a snapshot for
	// seconds: 6 s leaves them time, so that the time runs out after the
	// swap, where the reader holds it up.)
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT 1 FROM "+name+" LIMIT 1")
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		time.Sleep(12 * time.Second)
		_ = reader.Rollback(ctx)
		close(released)
	}()

	// WHEN the month is compacted with a 6 s statement timeout
	cfg := partition.Config{StatementTimeout: 6 * time.Second}
	res, err := compacting(t, db, cfg).Run(ctx, false)

	// THEN the rebuilt index is in place, marked compacted, built with
	// fillfactor 100, and the month is not pending
	require.NoError(t, err)
	require.Equal(t, []string{name}, res.Compacted)
	after := pkOf(t, db, name)
	require.NotEqual(t, before.OID, after.OID, "the index was not rebuilt")
	require.Less(t, after.Bytes, before.Bytes)
	require.Equal(t, "fillfactor=100", after.Reloptions)
	require.NotContains(t, after.Comment, "timed out")
	<-released
	res, err = compacting(t, db, cfg).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.CompactPending)
	require.Empty(t, res.Compacted, "compacted again")
	require.Zero(t, invalidIndexes(t, db), "the old index is left")
	require.EqualValues(t, 5_000, dbtest.Count(t, db.Pool, "SELECT count(*) FROM "+name))
}

// killRebuild starts REINDEX INDEX CONCURRENTLY on name's primary key (a
// Lambda killed mid-rebuild, an operator's rebuild by hand), holds it after
// its build with an old snapshot, and terminates its backend, which runs
// no cleanup: the invalid <pk>_ccnew stays. It returns once the backend
// has exited (until then the rebuild may still be running, and the
// manager leaves it alone).
func killRebuild(t *testing.T, db *dbtest.DB, name string) {
	t.Helper()
	ctx := context.Background()
	// A snapshot held elsewhere (not a lock on the partition): the rebuild
	// builds its new index, marks it ready, and then waits for this
	// snapshot before it validates it.
	snap, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = snap.Exec(ctx, "SELECT count(*) FROM idempotency_keys")
	require.NoError(t, err)
	commit := func() { _ = snap.Rollback(ctx) }
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	var pid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "REINDEX INDEX CONCURRENTLY "+name+"_pkey")
		done <- err
	}()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", pid) == 1
	}, 20*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_terminate_backend($1)", pid))
	require.Error(t, <-done)
	conn.Release()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0
	}, 20*time.Second, 10*time.Millisecond)
	commit()
}
