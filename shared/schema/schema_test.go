package schema_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
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
	// no response column, no json anywhere
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, `
		SELECT count(*) FROM information_schema.columns
		 WHERE table_schema = current_schema() AND table_name = 'idempotency_key_archive'
		   AND (column_name = 'response' OR data_type IN ('json', 'jsonb'))`))
}

func TestLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	reader := db.NewPool(t, dbtest.AsRole(schema.ReaderRole))
	sweeper := db.NewPool(t, dbtest.AsRole(schema.SweeperRole))

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
	} {
		pool := reader
		if tc.role == schema.SweeperRole {
			pool = sweeper
		}
		_, err := pool.Exec(ctx, tc.sql)
		require.ErrorContains(t, err, "permission denied", "%s: %s", tc.role, tc.sql)
	}
	_, err := reader.Exec(ctx, "SELECT status_code, resource_id FROM idempotency_key_archive")
	require.NoError(t, err)
	_, err = sweeper.Exec(ctx, "DELETE FROM idempotency_keys WHERE expires_at < now()")
	require.NoError(t, err)
}
