// Package dbtest gives each database test its own freshly migrated schema on the
// real PostgreSQL server named by DATABASE_URL (make test starts a throwaway
// one). The pool's search_path holds only that schema, so a query that names
// another schema, or forgets to be schema-relative, fails instead of leaking
// between tests.
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		db := dbtest.New(t)
//		_, err := db.Pool.Exec(ctx, "INSERT INTO idempotency_keys ...")
//	}
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// DB is one isolated, migrated schema.
type DB struct {
	Schema string
	URL    string // DATABASE_URL with search_path set to Schema
	Pool   *pgxpool.Pool
}

// URL returns DATABASE_URL or fails the test with a message that says how to
// get one. Tests never skip for want of a database.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		t.Fatal("DATABASE_URL is not set: run the tests with `make test`, which starts a throwaway PostgreSQL, or point DATABASE_URL at a server you may create schemas on")
	}
	return u
}

// New creates a schema named after a random suffix, migrates it, and drops it
// when the test ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	base := URL(t)
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	name := "test_" + hex.EncodeToString(buf[:])

	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to DATABASE_URL: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})

	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("parse DATABASE_URL: %v", err)
	}
	cfg.RuntimeParams["search_path"] = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to schema %s: %v", name, err)
	}
	defer conn.Close(ctx)
	if _, err := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("migrate schema %s: %v", name, err)
	}

	db := &DB{Schema: name, URL: WithSearchPath(t, base, name)}
	db.Pool = db.NewPool(t)
	return db
}

// PoolOption adjusts a pool opened by NewPool.
type PoolOption func(*pgxpool.Config)

// AsRole makes every connection run SET ROLE role first, which is how tests
// prove that a least-privilege role is enough for a component.
func AsRole(role string) PoolOption {
	return func(cfg *pgxpool.Config) {
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
			return err
		}
	}
}

// WithParam sets a run-time parameter (TimeZone, say) on every connection.
func WithParam(name, value string) PoolOption {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams[name] = value }
}

// NewPool opens another pool on the same schema.
func (db *DB) NewPool(t testing.TB, opts ...PoolOption) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("parse pool config: %v", err)
	}
	cfg.MaxConns = 16
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("create pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// WithSearchPath returns the connection string u (URL or key=value form) with
// its search_path set (database.WithSearchPath).
func WithSearchPath(t testing.TB, u, searchPath string) string {
	t.Helper()
	out, err := database.WithSearchPath(u, searchPath)
	if err != nil {
		t.Fatalf("DATABASE_URL: %v", err)
	}
	return out
}

// Partition creates the archive partitions a run of the partition manager
// creates now (the previous month through three ahead), plus monthsBack more
// months before those, and returns the manager.
func (db *DB) Partition(t testing.TB, monthsBack int) *partition.Manager {
	t.Helper()
	ctx := context.Background()
	m, err := partition.NewManager(db.Pool, partition.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run(ctx, false); err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	for i := 2; i <= monthsBack+1; i++ {
		if _, err := m.EnsureMonth(ctx, partition.MonthStart(time.Now()).AddDate(0, -i, 0)); err != nil {
			t.Fatalf("create partition: %v", err)
		}
	}
	return m
}
