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

// shape.sql checks "the primary keys: the live store's and the sweep's ON
// CONFLICT targets" by their columns alone. A primary key of those columns
// made DEFERRABLE by another tool is no ON CONFLICT arbiter: PostgreSQL
// refuses every INSERT ... ON CONFLICT (scoped_key) the live store
// registers a key with. Migrate must refuse such a table, as it refuses a
// table without the primary key.
func TestADeferrableLivePrimaryKeyIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, _ := upgradedSchema(t, dbtest.New(t))
	_, err := conn.Exec(ctx, `CREATE TABLE idempotency_keys (
		scoped_key text COLLATE "C" PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, fingerprint bytea NOT NULL, state text NOT NULL DEFAULT 'in_flight',
		status_code smallint, response jsonb, created_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL,
		CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`)
	require.NoError(t, err)

	_, migErr := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// What the live store's register statement then meets on every key.
	_, insErr := conn.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at)
		VALUES ('idem:v1:k', '\x00', now() + interval '1 hour') ON CONFLICT (scoped_key) DO NOTHING`)
	require.ErrorIs(t, migErr, schema.ErrTableMismatch,
		"a DEFERRABLE primary key passed the shape check; every register then fails: %v", insErr)
}

// The same for the archive: the sweep's retry and the Redis store's archive
// write are INSERT ... ON CONFLICT (scoped_key, expired_at).
func TestADeferrableArchivePrimaryKeyIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, _ := upgradedSchema(t, dbtest.New(t))
	_, err := conn.Exec(ctx, `CREATE TABLE idempotency_key_archive (
		scoped_key text COLLATE "C" NOT NULL, fingerprint bytea NOT NULL, status_code smallint NOT NULL, resource_id text,
		created_at timestamptz NOT NULL, expired_at timestamptz NOT NULL,
		PRIMARY KEY (scoped_key, expired_at) DEFERRABLE INITIALLY DEFERRED) PARTITION BY RANGE (expired_at)`)
	require.NoError(t, err)

	_, migErr := schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var insErr error
	if migErr == nil {
		_, _ = conn.Exec(ctx, `CREATE TABLE deferred_part PARTITION OF idempotency_key_archive FOR VALUES FROM ('2020-01-01') TO ('2100-01-01')`)
		_, insErr = conn.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
			VALUES ('idem:v1:k', '\x00', 201, NULL, now(), now()) ON CONFLICT (scoped_key, expired_at) DO NOTHING`)
	}
	require.ErrorIs(t, migErr, schema.ErrTableMismatch,
		"a DEFERRABLE archive primary key passed the shape check; the sweep's and Redis store's ON CONFLICT then fail: %v", insErr)
}
