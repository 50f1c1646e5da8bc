package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// benchDB is one schema of its own, migrated, with a pool whose search_path
// holds only that schema (as shared/dbtest does for tests).
type benchDB struct {
	Schema string
	URL    string
	Pool   *pgxpool.Pool
	base   string
}

// newBenchDB creates and migrates schema "bench_<random>_<purpose>".
func newBenchDB(ctx context.Context, base, purpose string) (*benchDB, error) {
	var buf [4]byte
	_, _ = rand.Read(buf[:])
	name := "bench_" + hex.EncodeToString(buf[:]) + "_" + purpose
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", name, err)
	}
	db := &benchDB{Schema: name, base: base}
	if db.URL, err = database.WithSearchPath(base, name); err != nil {
		_ = db.Drop()
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		_ = db.Drop()
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		_ = db.Drop()
		return nil, fmt.Errorf("connect to schema %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		_ = db.Drop()
		return nil, fmt.Errorf("migrate schema %s: %w", name, err)
	}
	if db.Pool, err = db.openPool(ctx, 8, false); err != nil {
		_ = db.Drop()
		return nil, err
	}
	return db, nil
}

// openPool opens a pool of at most maxConns connections on the schema, whose
// statements run in exec mode (DATABASE_EXEC_MODE=exec: none is prepared, as
// behind RDS Proxy) when exec is set, else in the connection string's mode
// (cache_statement unless it says otherwise).
func (db *benchDB) openPool(ctx context.Context, maxConns int32, exec bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	cfg.MaxConns = maxConns
	if exec {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open a pool on schema %s: %w", db.Schema, err)
	}
	return pool, nil
}

// Drop closes the pool and drops the schema, with its own timeout so that it
// also runs after the bench's context was canceled.
func (db *benchDB) Drop() error {
	if db.Pool != nil {
		db.Pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.base)
	if err != nil {
		return fmt.Errorf("drop schema %s: %w", db.Schema, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{db.Schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", db.Schema, err)
	}
	return nil
}

// partitions returns a partition manager over the schema, having run it once
// (the previous month through three ahead).
func (db *benchDB) partitions(ctx context.Context) (*partition.Manager, error) {
	m, err := partition.NewManager(db.Pool, partition.Config{}, nil)
	if err != nil {
		return nil, fmt.Errorf("partition manager: %w", err)
	}
	if _, err := m.Run(ctx, false); err != nil {
		return nil, fmt.Errorf("create partitions: %w", err)
	}
	return m, nil
}

// newLiveBenchDB is newBenchDB for the measurements that sweep the live
// table: partitions made (including the months of rows that expired over the
// last day, for contenders that cannot create partitions) and autovacuum off.
func newLiveBenchDB(ctx context.Context, base, purpose string) (*benchDB, *partition.Manager, error) {
	db, err := newBenchDB(ctx, base, purpose)
	if err != nil {
		return nil, nil, err
	}
	parts, err := db.partitions(ctx)
	if err == nil {
		for _, t := range []time.Time{time.Now().Add(-26 * time.Hour), time.Now()} {
			if _, err = parts.EnsureMonth(ctx, t); err != nil {
				err = fmt.Errorf("create partition: %w", err)
				break
			}
		}
	}
	if err == nil {
		err = db.withoutAutovacuum(ctx)
	}
	if err != nil {
		db.Drop()
		return nil, nil, err
	}
	return db, parts, nil
}

// partitionCount counts the archive's partitions.
func (db *benchDB) partitionCount(ctx context.Context) (int, error) {
	var n int
	err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count partitions: %w", err)
	}
	return n, nil
}

// withoutAutovacuum turns autovacuum off on the live table and on every
// archive partition, so that a vacuum the bench did not ask for never lands
// inside one contender's timing. The bench vacuums explicitly instead.
func (db *benchDB) withoutAutovacuum(ctx context.Context) error {
	rows, err := db.Pool.Query(ctx, `
		SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'idempotency_key_archive'::regclass`)
	if err != nil {
		return fmt.Errorf("list partitions: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list partitions: %w", err)
	}
	for _, t := range append(tables, "idempotency_keys") {
		// t comes from regclass output: already quoted where needed.
		if _, err := db.Pool.Exec(ctx, "ALTER TABLE "+t+" SET (autovacuum_enabled = off)"); err != nil {
			return fmt.Errorf("turn autovacuum off on %s: %w", t, err)
		}
	}
	return nil
}

// walLSN reads the current WAL insert position.
func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return "", fmt.Errorf("read the WAL position: %w", err)
	}
	return lsn, nil
}

// walSince returns the WAL bytes written since lsn.
func walSince(ctx context.Context, pool *pgxpool.Pool, lsn string) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", lsn).Scan(&n); err != nil {
		return 0, fmt.Errorf("measure WAL written: %w", err)
	}
	return n, nil
}
