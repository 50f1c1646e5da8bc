package schema_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
)

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t) // already migrated once
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			res, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil && res.FromVersion != res.ToVersion {
				t.Errorf("re-run applied migrations: %+v", res)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

func TestArchiveShape(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	// RANGE partitioned on expired_at, primary key (scoped_key, expired_at)
	var strategy, key string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT p.partstrat::text, pg_get_partkeydef(p.partrelid)
		  FROM pg_partitioned_table p WHERE p.partrelid = 'idempotency_key_archive'::regclass`).Scan(&strategy, &key))
	require.Equal(t, "r", strategy)
	require.Equal(t, "RANGE (expired_at)", key)
	var pk string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT pg_get_constraintdef(oid) FROM pg_constraint
		 WHERE conrelid = 'idempotency_key_archive'::regclass AND contype = 'p'`).Scan(&pk))
	require.Equal(t, "PRIMARY KEY (scoped_key, expired_at)", pk)
	// no DEFAULT partition (it would forbid DETACH ... CONCURRENTLY)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, `
		SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'idempotency_key_archive'::regclass AND partdefid <> 0`))
	// Exactly these columns, in this order, with these types: what a
	// retry's answer needs and nothing of the response (no body, payload or
	// json column of any name or type).
	rows, err := db.Pool.Query(context.Background(), `
		SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		       || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN ' COLLATE ' || quote_ident(c.collname) ELSE '' END
		       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
		  FROM pg_attribute a
		  JOIN pg_type t ON t.oid = a.atttypid
		  LEFT JOIN pg_collation c ON c.oid = a.attcollation
		 WHERE a.attrelid = 'idempotency_key_archive'::regclass AND a.attnum > 0 AND NOT a.attisdropped
		 ORDER BY a.attnum`)
	require.NoError(t, err)
	columns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		`scoped_key text COLLATE "C" NOT NULL`,
		"fingerprint bytea NOT NULL",
		"status_code smallint NOT NULL",
		"resource_id text",
		"created_at timestamp with time zone NOT NULL",
		"expired_at timestamp with time zone NOT NULL",
	}, columns)
}

func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	reader := db.NewPool(t, dbtest.AsRole(schema.ReaderRole))
	sweeper := db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
	writer := db.NewPool(t, dbtest.AsRole(schema.WriterRole))

	for _, tc := range []struct {
		role string
		sql  string
	}{
		{schema.ReaderRole, "SELECT * FROM idempotency_keys"},
		{schema.ReaderRole, "INSERT INTO idempotency_key_archive VALUES ('k', '\\x00', 201, NULL, now(), now())"},
		{schema.ReaderRole, "DELETE FROM idempotency_key_archive"},
		{schema.SweeperRole, "SELECT fingerprint FROM idempotency_key_archive"},
		{schema.SweeperRole, "UPDATE idempotency_keys SET state = 'completed'"},
		{schema.SweeperRole, "INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at) VALUES ('k', sha256('k'), now() + interval '1 day')"},
		{schema.SweeperRole, "DELETE FROM idempotency_key_archive"},
		{schema.SweeperRole, "CREATE TABLE x (a int)"},
		{schema.SweeperRole, "DELETE FROM idempotency_writers"},
		{schema.WriterRole, "UPDATE idempotency_writers SET bounded = true"},
		{schema.ReaderRole, "UPDATE idempotency_writers SET used_until = now()"},
		{schema.WriterRole, "DELETE FROM idempotency_writers"},
		// No role but the owner runs DDL.
		{schema.ReaderRole, "CREATE TABLE x (a int)"},
		{schema.ReaderRole, "DROP TABLE idempotency_key_archive"},
		{schema.ReaderRole, "ALTER TABLE idempotency_key_archive ADD COLUMN response jsonb"},
		{schema.SweeperRole, "ALTER TABLE idempotency_key_archive ADD COLUMN response jsonb"},
		{schema.SweeperRole, "DROP TABLE idempotency_keys"},
		{schema.SweeperRole, "TRUNCATE idempotency_key_archive"},
		{schema.WriterRole, "CREATE TABLE x (a int)"},
		{schema.WriterRole, "TRUNCATE idempotency_keys"},
		{schema.WriterRole, "DROP TRIGGER idempotency_keys_unbounded_writer ON idempotency_keys"},
		{schema.WriterRole, "SELECT * FROM idempotency_key_archive"},
		{schema.WriterRole, "INSERT INTO idempotency_key_archive VALUES ('k', '\\x00', 201, NULL, now(), now())"},
		// Only the owner says which partitions the plain-key records cover.
		{schema.SweeperRole, "INSERT INTO idempotency_archive_recorded_partitions VALUES (1)"},
		{schema.WriterRole, "DELETE FROM idempotency_archive_recorded_partitions"},
		{schema.ReaderRole, "SELECT idempotency_archive_adopt_partition('idempotency_key_archive'::regclass)"},
		{schema.SweeperRole, "SELECT idempotency_archive_adopt_partition('idempotency_key_archive'::regclass)"},
	} {
		pool := map[string]*pgxpool.Pool{schema.ReaderRole: reader, schema.SweeperRole: sweeper, schema.WriterRole: writer}[tc.role]
		_, err := pool.Exec(ctx, tc.sql)
		require.Equal(t, database.CodeInsufficientPrivilege, database.SQLState(err), "%s: %s: %v", tc.role, tc.sql, err)
	}
	_, err := reader.Exec(ctx, "SELECT status_code, resource_id FROM idempotency_key_archive")
	require.NoError(t, err)
	_, err = sweeper.Exec(ctx, "DELETE FROM idempotency_keys WHERE expires_at < now()")
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT bounded, skew_ms FROM idempotency_writers")
	require.NoError(t, err)

	// The Postgres live store works as idempotency_writer alone.
	store := livestore.NewPostgres(writer)
	key := "idem:v1:writer-role"
	token := []byte("registration-1")
	reg, err := store.Register(ctx, idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint(key), Token: token, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, reg.Fresh)
	require.NoError(t, store.Complete(ctx, key, idempotency.Completion{Fingerprint: dbtest.Fingerprint(key), Token: token, Status: 201, Body: []byte(`{}`)}))
	reg, err = store.Register(ctx, idempotency.Registering{Key: "idem:v1:writer-role-2", Fingerprint: dbtest.Fingerprint("2"), Token: token, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, store.Release(ctx, "idem:v1:writer-role-2", dbtest.Fingerprint("2"), token))
	require.EqualValues(t, 0, dbtest.Count(t, writer, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = 'idem:v1:writer-role-2'"))
}

// Upgrading a database that already holds keys records a writer that bounded
// nothing, so that keys stored before writers recorded their bounds are never
// skipped or pruned away; a fresh database records none.
func TestUpgradeRecordsUnboundedWriters(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_writers"), "a fresh database has no unbounded writer")

	conn, _ := upgradedSchema(t, db)
	_, err := schema.MigrateTo(ctx, conn, logger, 3)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at) VALUES ('idem:v1:old', sha256('old'), now() + interval '1 day')")
	require.NoError(t, err)
	res, err := schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	require.EqualValues(t, schema.LatestVersion(), res.ToVersion)
	var bounded bool
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*), bool_and(bounded) FROM idempotency_writers").Scan(&n, &bounded))
	require.Equal(t, 1, n)
	require.False(t, bounded)
}

// A re-run of migrate (every deploy) takes no exclusive lock on the archive:
// with a reader holding it, migrate still finishes.
func TestARerunOfMigrateDoesNotLockTheArchive(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_writers")
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SET lock_timeout = '2s'")
	require.NoError(t, err)
	res, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err, "migrate waited for an exclusive lock behind a reader")
	require.True(t, res.GrantsApplied)
}

// Upgrading a database whose archive holds rows marks them all pending for
// idempotency_archive_plain_keys, so that a lookup of a key without a
// timestamp still reads every partition for them; a Reader on a schema from
// before the table reads every partition too.
func TestUpgradeKeepsPlainKeysArchivedBeforeReachable(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"), "a fresh archive has nothing pending")

	conn, url := upgradedSchema(t, db)
	archiveOneRowAt(t, conn, 5)

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, "idem:v1:before", nil)
	require.NoError(t, err, "a schema without idempotency_archive_plain_keys: every partition is read")
	require.Equal(t, 201, rec.Status)

	_, err = schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending WHERE expired_from = '-infinity' AND expired_to = 'infinity'"))
	require.Zero(t, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_plain_keys"), "the trigger only sees rows archived after it")
	rec, err = r.Lookup(ctx, "idem:v1:before", nil)
	require.NoError(t, err, "the pending range reaches the row archived before migration 006")
	require.Equal(t, 201, rec.Status)
	_, err = r.Lookup(ctx, "idem:v1:never", nil)
	require.ErrorIs(t, err, archive.ErrNotFound)
}

// Upgrading a database whose archive holds rows marks them all pending for
// migration 010's rule (rows of timestamped keys used long after their
// timestamp), so that such a key's lookup still finds them until the
// partition manager has recorded them; a Reader on a schema from before the
// migration reads every month from the key's timestamp on.
func TestUpgradeKeepsLateRowsArchivedBeforeReachable(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, url := archiveBefore010(t, db)
	minted := time.Now().AddDate(0, -4, 0)
	late := "idem:v1:" + dbtest.UUIDv7(minted, 7)
	expired := time.Now().Add(-time.Hour)
	_, err := conn.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ($1, '\x00', 201, $2, $3)`, late, expired.Add(-24*time.Hour), expired)
	require.NoError(t, err)

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	find := func(msg string) {
		t.Helper()
		rec, err := r.Lookup(ctx, late, nil)
		require.NoError(t, err, msg)
		require.Equal(t, 201, rec.Status, msg)
	}
	find("a schema without migration 010: every month since the key's timestamp is read")

	_, err = schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending WHERE expired_from = '-infinity' AND expired_to = 'infinity'"))
	require.Zero(t, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"), "keys without a timestamp were recorded already")
	find("the pending range reaches the row archived before migration 010")

	p, err := plainkeys.Index(ctx, conn, 100, plainkeys.Limits{}, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, plainkeys.Progress{Scanned: 1, Recorded: 1, RangesDone: 1}, p)
	find("recorded")
	_, err = r.Lookup(ctx, "idem:v1:"+dbtest.UUIDv7(minted, 8), nil)
	require.ErrorIs(t, err, archive.ErrNotFound)
}

// Migration 010 waits for the archive inserts under way: a sweep batch
// that archived a late row under the previous trigger and committed after
// the migration would otherwise leave it neither recorded nor pending (the
// migration saw an empty archive), and its lookup would miss it. It waits
// without holding a place in the lock's queue, so inserts beside it never
// wait behind it, and without holding the pending table it creates a
// trigger on, so the partition manager's writes there do not wait either.
func TestMigration010WaitsForTheArchiveInsertsUnderWay(t *testing.T) {
	// Not parallel, as TestMigration12HoldsNoPartitionWhileItWaitsForAnother.
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, url := archiveBefore010(t, db)

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	late := "idem:v1:" + dbtest.ULID(time.Now().AddDate(0, -4, 0), "")
	sweep, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = sweep.Rollback(ctx) }()
	_, err = sweep.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ($1, '\x00', 201, now() - interval '2 days', now() - interval '1 day')`, late)
	require.NoError(t, err)

	var pid uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	migrated := make(chan error, 1)
	go func() {
		_, err := schema.Migrate(ctx, conn, logger)
		migrated <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep')", pid).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 10*time.Millisecond, "the migration waits for the open insert")
	// Meanwhile inserts do not queue behind it: the migration tries its
	// lock without waiting.
	other := "idem:v1:" + dbtest.ULID(time.Now().AddDate(0, -5, 0), "")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
			VALUES ($1, '\x00', 202, now() - interval '2 days', now() - interval '1 day')`, other)
		return err
	})
	require.NoError(t, err, "an archive insert beside the waiting migration")
	// Nor does the partition manager marking a range pending (a partition
	// attached with rows, under 006's rule).
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('2020-01-01', '2020-02-01')")
		return err
	})
	require.NoError(t, err, "a pending range marked beside the waiting migration")
	require.NoError(t, sweep.Commit(ctx))
	require.NoError(t, <-migrated)

	require.EqualValues(t, 1, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending WHERE expired_from = '-infinity' AND expired_to = 'infinity'"),
		"the row committed before the migration's check, which marks it pending")
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, late, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	rec, err = r.Lookup(ctx, other, nil)
	require.NoError(t, err)
	require.Equal(t, 202, rec.Status)
}

// archiveBefore010 is upgradedSchema migrated to version 9, the one before
// migration 010, with one partition that holds every expiry.
func archiveBefore010(t *testing.T, db *dbtest.DB) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	conn, url := upgradedSchema(t, db)
	_, err := schema.MigrateTo(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)), 9)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE idempotency_key_archive_all PARTITION OF idempotency_key_archive FOR VALUES FROM (MINVALUE) TO (MAXVALUE)")
	require.NoError(t, err)
	return conn, url
}

// upgradedSchema creates an empty schema beside db's, dropped at the end of
// the test, for migrations from an older version, and returns a connection
// to it and its connection string.
// archiveOneRowAt migrates conn's schema to version, then archives one row
// (idem:v1:before, expired in November 2026) in a partition made without
// the partition manager, as a database awaiting an upgrade may hold.
func archiveOneRowAt(t *testing.T, conn *pgx.Conn, version int32) {
	t.Helper()
	ctx := context.Background()
	_, err := schema.MigrateTo(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)), version)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2026_11 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00');
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:before', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	require.NoError(t, err)
}

func upgradedSchema(t *testing.T, db *dbtest.DB) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	name := db.Schema + "_up"
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	url := dbtest.WithSearchPath(t, db.URL, name)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, url
}

// Upgrading to migration 12 takes the partitions attached at that moment as
// covered by the records (the manager attached them), so that the first
// partitions run after the upgrade marks nothing pending; a table attached
// by hand after the upgrade is not.
func TestUpgradeTakesTheAttachedPartitionsAsRecorded(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, _ := upgradedSchema(t, db)
	archiveOneRowAt(t, conn, 11)

	_, err := schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	var recorded bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM idempotency_archive_recorded_partitions
		WHERE partition = 'idempotency_key_archive_2026_11'::regclass)`).Scan(&recorded))
	require.True(t, recorded)

	_, err = conn.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2026_10 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2026_10
		   FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00')`)
	require.NoError(t, err)
	for name, want := range map[string]*string{"idempotency_key_archive_2026_10": new(string), "idempotency_key_archive_2026_11": nil} {
		var problem *string
		require.NoError(t, conn.QueryRow(ctx, "SELECT idempotency_archive_adopt_partition($1::regclass)", name).Scan(&problem))
		require.Equal(t, want, problem, name)
	}
	var pending int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM idempotency_archive_plain_keys_pending").Scan(&pending))
	require.Zero(t, pending, "an empty table attached by hand leaves nothing to record")
}

// Upgrading to migration 12 gives every partition attached at that moment
// the archive's recording triggers, so that rows written into it directly
// from then on are recorded; a partition of another schema gets none.
func TestUpgradeGivesEveryPartitionTheRecordingTriggers(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	conn, _ := upgradedSchema(t, db)
	archiveOneRowAt(t, conn, 11)
	_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE public.%s (LIKE idempotency_key_archive);
		ALTER TABLE idempotency_key_archive ATTACH PARTITION public.%[1]s FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00')`,
		pgx.Identifier{db.Schema + "_elsewhere"}.Sanitize()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP TABLE IF EXISTS public."+pgx.Identifier{db.Schema + "_elsewhere"}.Sanitize())
	})

	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	var triggers int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'idempotency_key_archive_2026_11'::regclass
		AND tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update')`).Scan(&triggers))
	require.Equal(t, 2, triggers)
	// (Only the archive's row trigger, cloned by PostgreSQL, which records
	// into the tables beside the archive: migration 013.)
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal AND tgparentid = 0`,
		"public."+pgx.Identifier{db.Schema + "_elsewhere"}.Sanitize()).Scan(&triggers))
	require.Zero(t, triggers, "a partition of another schema has no tables beside it to record into")

	_, err = conn.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:direct', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-03 10:00:00+00')`)
	require.NoError(t, err)
	var recorded int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:direct')").Scan(&recorded))
	require.Equal(t, 1, recorded)
}

// Migration 12 takes every partition's SHARE ROW EXCLUSIVE lock at once or
// none: while December is held by a long write, it holds no lock on
// November, and an insert into November (a 1 s lock_timeout) goes on.
func TestMigration12HoldsNoPartitionWhileItWaitsForAnother(t *testing.T) {
	// Not parallel: the migration below holds tern's advisory lock, which
	// every schema of the test database shares, for seconds, and
	// TestARerunOfMigrateDoesNotLockTheArchive times any lock wait out at 2 s.
	db := dbtest.New(t)
	ctx := context.Background()
	conn, url := upgradedSchema(t, db)
	archiveOneRowAt(t, conn, 11)
	_, err := conn.Exec(ctx, `CREATE TABLE idempotency_key_archive_2026_12 PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-12-01 00:00:00+00') TO ('2027-01-01 00:00:00+00')`)
	require.NoError(t, err)

	blocker, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE idempotency_key_archive_2026_12 IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
		done <- err
	}()
	time.Sleep(time.Second)

	writer, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer writer.Close(ctx)
	_, err = writer.Exec(ctx, "SET lock_timeout = '1s'")
	require.NoError(t, err)
	start := time.Now()
	_, insertErr := writer.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:during-migration', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	waited := time.Since(start)
	time.Sleep(time.Second)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.NoError(t, insertErr, "an archive insert into November waited %s behind the migration", waited)
}

// Upgrading to migration 13 keeps the partitions recorded at 12 recorded,
// for the attachment they have then; a table detached and attached again
// by hand afterwards is another attachment, adopted again (its bounds
// marked pending), and so is a partition whose recording trigger was
// disabled by hand (the adoption enables it).
func TestUpgradeTo13RecordsAttachmentsNotTables(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, _ := upgradedSchema(t, db)
	archiveOneRowAt(t, conn, 11)
	_, err := schema.MigrateTo(ctx, conn, logger, 12)
	require.NoError(t, err)

	_, err = schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	adopt := func() *string {
		t.Helper()
		var problem *string
		require.NoError(t, conn.QueryRow(ctx, "SELECT idempotency_archive_adopt_partition('idempotency_key_archive_2026_11'::regclass)").Scan(&problem))
		return problem
	}
	pending := func() int {
		t.Helper()
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM idempotency_archive_plain_keys_pending").Scan(&n))
		return n
	}
	require.Nil(t, adopt(), "recorded at 12, covered at 13")
	require.Zero(t, pending())

	_, err = conn.Exec(ctx, `
		ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_11;
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2026_11
		   FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00')`)
	require.NoError(t, err)
	require.Equal(t, new(string), adopt(), "attached again: adopted again")
	require.Equal(t, 1, pending())
	require.Nil(t, adopt())

	_, err = conn.Exec(ctx, `DELETE FROM idempotency_archive_plain_keys_pending;
		ALTER TABLE idempotency_key_archive_2026_11 DISABLE TRIGGER idempotency_key_archive_plain_keys`)
	require.NoError(t, err)
	require.Equal(t, new(string), adopt(), "a disabled recording trigger: adopted again")
	require.Equal(t, 1, pending())
	var enabled int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'idempotency_key_archive_2026_11'::regclass
		AND tgname IN ('idempotency_key_archive_plain_keys', 'idempotency_key_archive_plain_keys_update') AND tgenabled = 'O'`).Scan(&enabled))
	require.Equal(t, 2, enabled)
	require.Nil(t, adopt())
}

// Migration 004 records a writer that bounded nothing when the live table
// holds rows. A row an older release inserted while the migration ran (its
// transaction still open when the migration began, committed while the
// migration waits for its lock) is such a row: the record is made for it,
// or the archive skip would take the key for one a bounded writer stored.
func TestMigration004SeesARowAnOlderWriterCommitsWhileItRuns(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, url := upgradedSchema(t, db)
	_, err := schema.MigrateTo(ctx, conn, logger, 3)
	require.NoError(t, err)

	w, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer w.Close(ctx)
	tx, err := w.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at) VALUES ('idem:v1:old-writer', sha256('old'), now() + interval '1 day')")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := schema.MigrateTo(ctx, conn, logger, 4); done <- err }()
	// Commit only once the migration waits for the writer's transaction.
	pid := conn.PgConn().PID()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", pid) == 1
	}, 30*time.Second, 5*time.Millisecond, "the migration never waited for the open insert")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)

	var unbounded int
	require.NoError(t, w.QueryRow(ctx, "SELECT count(*) FROM idempotency_writers WHERE NOT bounded").Scan(&unbounded))
	require.Equal(t, 1, unbounded, "a live row of an older writer, and no unbounded writer recorded")
}

// Migrations apply to the first schema on the connection's search_path,
// one SET after connecting included: tern's RESET ALL after each migration
// would put back the startup one, and send the migrations after the first
// into another schema, while the version table recorded them here. The
// connection keeps its search_path.
func TestMigrateKeepsASearchPathSetOnTheConnection(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	name := db.Schema + "_set"
	ident := pgx.Identifier{name}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+ident)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE") })
	// The connection's startup search_path is db's schema (migrated); it is
	// then SET to the new one.
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SET search_path TO "+ident)
	require.NoError(t, err)
	res, err := schema.Migrate(ctx, conn, logger)
	require.NoError(t, err)
	require.Equal(t, schema.LatestVersion(), res.ToVersion)
	require.Equal(t, int32(0), res.FromVersion)

	want := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace", db.Schema)
	got := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace", ident)
	require.Equal(t, want, got, "the SET schema holds what a migrated schema holds")
	var current string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_schema()").Scan(&current))
	require.Equal(t, name, current)
}

// Migration 004 waits for an archive insert still running only where
// neither table shows a row, and before it locks the live table: the
// archive's maintenance (autovacuum, ANALYZE: SHARE UPDATE EXCLUSIVE), which
// its lock also waits for, never holds up an upgrade of an archive with
// rows, nor queues reads or registrations of the live table.
func TestMigration004NeverQueuesTheLiveTableBehindArchiveMaintenance(t *testing.T) {
	t.Parallel()
	for _, rows := range []bool{true, false} {
		db := dbtest.New(t)
		ctx := context.Background()
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		conn, url := upgradedSchema(t, db)
		_, err := schema.MigrateTo(ctx, conn, logger, 3)
		require.NoError(t, err)
		if rows {
			archiveOneRowAt(t, conn, 3)
		}
		maint, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer maint.Close(ctx)
		tx, err := maint.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE UPDATE EXCLUSIVE MODE")
		require.NoError(t, err)
		live, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer live.Close(ctx)

		done := make(chan error, 1)
		go func() { _, err := schema.MigrateTo(ctx, conn, logger, 4); done <- err }()
		if rows {
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("migration 004 waited for the archive's maintenance, though the archive holds rows")
			}
			require.NoError(t, tx.Rollback(ctx))
			continue
		}
		// The wait for the maintenance holds nothing the live table needs.
		for until := time.Now().Add(1500 * time.Millisecond); time.Now().Before(until); time.Sleep(50 * time.Millisecond) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			started := time.Now()
			_, err := live.Exec(pctx, "SELECT count(*) FROM idempotency_keys")
			cancel()
			require.NoError(t, err)
			require.Less(t, time.Since(started), 2*time.Second, "a read of the live table queued behind migration 004's wait")
		}
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, <-done)
	}
}
