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

// A table of the same name made by another tool survives CREATE TABLE IF
// NOT EXISTS as it is. Migrate refuses it, naming what is missing, before
// applying anything: under the first case one completed row without a
// status fails every sweep batch on the archive's NOT NULL.
func TestMigrateRefusesATablePreExistingWithAnotherDefinition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ddl, want string
	}{
		{
			name: "live table without the status check",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, state text NOT NULL,
				status_code smallint, response jsonb, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)`,
			want: "idempotency_keys_completed_has_status",
		},
		{
			name: "live table with nullable columns",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text PRIMARY KEY, fingerprint bytea, state text, status_code smallint, response jsonb,
				created_at timestamptz, expires_at timestamptz,
				CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`,
			want: "idempotency_keys.fingerprint is not NOT NULL",
		},
		{
			name: "archive not partitioned",
			ddl: `CREATE TABLE idempotency_key_archive (
				scoped_key text NOT NULL, fingerprint bytea NOT NULL, status_code smallint NOT NULL, resource_id text,
				created_at timestamptz NOT NULL, expired_at timestamptz NOT NULL, PRIMARY KEY (scoped_key, expired_at))`,
			want: "idempotency_key_archive is not a partitioned table",
		},
		{
			name: "archive keyed by the key alone",
			ddl: `CREATE TABLE idempotency_key_archive (
				scoped_key text NOT NULL, fingerprint bytea NOT NULL, status_code smallint NOT NULL, resource_id text,
				created_at timestamptz NOT NULL, expired_at timestamptz NOT NULL, PRIMARY KEY (scoped_key))
				PARTITION BY LIST (scoped_key)`,
			want: "idempotency_key_archive has no primary key (scoped_key, expired_at)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			conn, _ := upgradedSchema(t, dbtest.New(t))
			_, err := conn.Exec(ctx, tc.ddl)
			require.NoError(t, err)

			_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
			require.ErrorIs(t, err, schema.ErrTableMismatch)
			require.ErrorContains(t, err, tc.want)
			var applied bool
			require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", schema.VersionTable).Scan(&applied))
			require.False(t, applied, "a migration ran on the refused table")
		})
	}
}

// A table exactly as migration 001 makes it, created before (another
// schema's copy, a restore of the live table alone), is taken as it is.
func TestMigrateTakesATablePreExistingWithTheSameDefinition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	conn, _ := upgradedSchema(t, db)
	_, err := conn.Exec(ctx, "CREATE TABLE idempotency_keys (LIKE "+db.Schema+".idempotency_keys INCLUDING ALL)")
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	problems, err := schema.Mismatches(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, problems)
}
