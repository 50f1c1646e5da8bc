package schema_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// An archive primary key added with ALTER TABLE ONLY to a partitioned table
// that already has a partition is a non-DEFERRABLE primary key of the right
// columns, but its index on the parent is not valid (indisvalid false)
// until every partition's own index is attached: PostgreSQL infers no
// arbiter from it, and the sweep's retry and the Redis store's archive
// write (INSERT ... ON CONFLICT (scoped_key, expired_at)) fail. Migrate's
// shape check refuses it, as it refuses a DEFERRABLE one.
func TestAnArchivePrimaryKeyWhoseIndexIsNotValidIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, _ := upgradedSchema(t, dbtest.New(t))
	for _, stmt := range []string{
		`CREATE TABLE idempotency_key_archive (
		scoped_key text COLLATE "C" NOT NULL, fingerprint bytea NOT NULL, status_code smallint NOT NULL, resource_id text,
		created_at timestamptz NOT NULL, expired_at timestamptz NOT NULL) PARTITION BY RANGE (expired_at)`,
		`CREATE TABLE old_part PARTITION OF idempotency_key_archive FOR VALUES FROM ('2000-01-01') TO ('2001-01-01')`,
		`ALTER TABLE ONLY idempotency_key_archive ADD PRIMARY KEY (scoped_key, expired_at)`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	_, migErr := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var valid bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i JOIN pg_constraint c ON c.conindid = i.indexrelid
		WHERE c.conrelid = 'idempotency_key_archive'::regclass AND c.contype = 'p'`).Scan(&valid))
	_, insErr := conn.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:k', '\x00', 201, NULL, now(), now()) ON CONFLICT (scoped_key, expired_at) DO NOTHING`)
	t.Logf("migrate: %v; pk index valid: %v; ON CONFLICT insert: %v", migErr, valid, insErr)
	if insErr == nil {
		t.Skip("ON CONFLICT works on this install")
	}
	require.ErrorIs(t, migErr, schema.ErrTableMismatch,
		"an archive primary key ON CONFLICT cannot use passed the shape check; the sweep's and Redis store's ON CONFLICT then fail: %v", insErr)
}
