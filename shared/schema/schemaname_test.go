package schema_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// oddSchema creates a schema beside db's whose name needs quoting (upper
// case, a space, a dot, a double quote), dropped at the end of the test, and
// returns a connection whose search_path is it.
func oddSchema(t *testing.T, db *dbtest.DB) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	name := `Odd "S.c ` + db.Schema
	ident := pgx.Identifier{name}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+ident)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE") })
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = ident
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// migratedOddSchema is oddSchema migrated, with a pool on it beside the
// connection.
func migratedOddSchema(t *testing.T) (*pgx.Conn, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	db := dbtest.New(t)
	conn := oddSchema(t, db)
	_, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = conn.Config().RuntimeParams["search_path"]
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return conn, pool
}

// In a schema whose name needs quoting, a partition gets the recording
// triggers (what every partitions run does for each table it attaches or
// adopts), and an owner's UPDATE that moves an archive row is recorded.
// Both failed: the functions quoted an already quoted name.
func TestASchemaNameThatNeedsQuotingTakesPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := oddSchema(t, dbtest.New(t))
	_, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)

	_, err = conn.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2026_11 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT idempotency_archive_partition_triggers('idempotency_key_archive_2026_11'::regclass)`)
	require.NoError(t, err, "give a partition the recording triggers")

	_, err = conn.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:plain', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE idempotency_key_archive SET expired_at = '2026-11-03 10:00:00+00' WHERE scoped_key = 'idem:v1:plain'`)
	require.NoError(t, err, "move an archive row")
	var recorded bool
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM idempotency_archive_plain_keys
		                WHERE key_hash = idempotency_key_hash('idem:v1:plain') AND expired_at = '2026-11-03 10:00:00+00')`).Scan(&recorded))
	require.True(t, recorded)
}

// An installation in such a schema, with partitions, upgrades from before
// migration 012 (which gives every partition the triggers).
func TestASchemaNameThatNeedsQuotingUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := oddSchema(t, dbtest.New(t))
	archiveOneRowAt(t, conn, 11)
	_, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
}

// The whole path in a schema whose name needs quoting: partitions created
// and retired, expired keys swept and recorded, plain and timestamped keys
// found, and the records of retired months pruned while a detached month's
// stay.
func TestASchemaNameThatNeedsQuotingRunsEveryComponent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := migratedOddSchema(t)
	_, err := pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2020_03 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2020-03-01 00:00:00+00') TO ('2020-04-01 00:00:00+00')`)
	require.NoError(t, err)
	now := time.Now().UTC()
	parts, err := partition.NewManager(pool, partition.Config{LeadMonths: 2, RetentionMonths: 3, Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = parts.Run(ctx, false)
	require.NoError(t, err, "create, adopt and retire partitions")
	var old *string
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('idempotency_key_archive_2020_03')::text").Scan(&old))
	require.Nil(t, old, "the month out of retention is dropped")

	timestamped := "idem:v1:" + dbtest.ULID(now.Add(-26*time.Hour), "0000000000000001")
	dbtest.InsertLive(t, pool,
		dbtest.LiveRow{Key: "idem:v1:plain", Status: 201, CreatedAt: now.Add(-26 * time.Hour), ExpiresAt: now.Add(-2 * time.Hour)},
		dbtest.LiveRow{Key: timestamped, Status: 200, CreatedAt: now.Add(-26 * time.Hour), ExpiresAt: now.Add(-2 * time.Hour)})
	s, err := sweep.New(pool, sweep.Config{BatchSize: 10}, parts, nil)
	require.NoError(t, err)
	res, err := s.Run(ctx)
	require.NoError(t, err, "sweep")
	require.EqualValues(t, 2, res.Archived)

	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	for _, k := range []string{"idem:v1:plain", timestamped} {
		rec, err := r.Lookup(ctx, k, nil)
		require.NoError(t, err, k)
		require.Equal(t, k, rec.ScopedKey)
	}

	// A month detached beside the archive keeps its records; one no table
	// holds loses them.
	_, err = pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2020_02 (LIKE idempotency_key_archive);
		INSERT INTO idempotency_archive_plain_keys VALUES (-1, '2020-02-10'), (-2, '2020-01-10')`)
	require.NoError(t, err)
	pc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer pc.Release()
	n, err := plainkeys.Prune(ctx, pc.Conn(), 10, plainkeys.Limits{LockTimeout: time.Second}, time.Now().Add(time.Minute))
	require.NoError(t, err, "prune")
	require.EqualValues(t, 1, n, "only the record of January 2020")
}
