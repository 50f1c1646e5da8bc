package schema_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
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
		{
			// One completed row of status 40000 fails every sweep batch on
			// the archive's smallint.
			name: "status as an integer",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, state text NOT NULL,
				status_code integer, response jsonb, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
				CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`,
			want: "idempotency_keys.status_code is integer, not smallint",
		},
		{
			name: "no response column",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, state text NOT NULL,
				status_code smallint, body bytea, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
				CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`,
			want: "idempotency_keys has no column response (jsonb)",
		},
		{
			name: "fingerprint as hex text",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text COLLATE "C" PRIMARY KEY, fingerprint text NOT NULL, state text NOT NULL,
				status_code smallint, response jsonb, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
				CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`,
			want: "idempotency_keys.fingerprint is text, not bytea",
		},
		{
			// An investigation's byte range of a key prefix misses keys
			// under a collation that orders bytes otherwise.
			name: "archive keys in another collation",
			ddl: `CREATE TABLE idempotency_key_archive (
				scoped_key text COLLATE "und-x-icu" NOT NULL, fingerprint bytea NOT NULL, status_code smallint NOT NULL, resource_id text,
				created_at timestamptz NOT NULL, expired_at timestamptz NOT NULL, PRIMARY KEY (scoped_key, expired_at))
				PARTITION BY RANGE (expired_at)`,
			want: `idempotency_key_archive.scoped_key is not in the "C" collation`,
		},
		{
			name: "a later migration's column of another type",
			ddl: `CREATE TABLE idempotency_keys (
				scoped_key text COLLATE "C" PRIMARY KEY, fingerprint bytea NOT NULL, state text NOT NULL,
				status_code smallint, response jsonb, resource_id bigint, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
				CONSTRAINT idempotency_keys_completed_has_status CHECK ((state = 'completed') = (status_code IS NOT NULL)))`,
			want: "idempotency_keys.resource_id is bigint, not text",
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

// No false positive on a legitimately migrated database at any older
// version, with data in it, nor after an operator's usual additions (an
// extra column and index, the status check re-created NOT VALID and then
// validated, a same-named table in a schema later on the search_path).
func TestMigrateTakesItsOwnTablesFromAnyVersion(t *testing.T) {
	t.Parallel()
	for v := int32(1); v < schema.LatestVersion(); v++ {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbtest.New(t)
			conn, _ := upgradedSchema(t, db)
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			if v >= 2 {
				archiveOneRowAt(t, conn, v)
			} else {
				_, err := schema.MigrateTo(ctx, conn, logger, v)
				require.NoError(t, err)
			}
			_, err := conn.Exec(ctx, `
				INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, created_at, expires_at)
				VALUES ('idem:v1:live', decode(repeat('00', 32), 'hex'), 'completed', 201, '{"id":"x"}', now() - interval '2 hours', now() - interval '1 hour'),
				       ('idem:v1:fly', decode(repeat('00', 32), 'hex'), 'in_flight', NULL, NULL, now() - interval '2 hours', now() + interval '1 hour')`)
			require.NoError(t, err)
			_, err = schema.Migrate(ctx, conn, logger)
			require.NoError(t, err, "upgrade from version %d", v)

			// An operator's additions, then the next deploy's migrate.
			_, err = conn.Exec(ctx, `
				ALTER TABLE idempotency_keys ADD COLUMN tenant text;
				CREATE INDEX ON idempotency_keys (tenant);
				ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_completed_has_status;
				ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_completed_has_status
				      CHECK ((state = 'completed') = (status_code IS NOT NULL)) NOT VALID;
				ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_completed_has_status;
				ALTER TABLE idempotency_key_archive ADD COLUMN note text`)
			require.NoError(t, err)
			other := db.Schema + "_other"
			_, err = db.Pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{other}.Sanitize()+
				"; CREATE TABLE "+pgx.Identifier{other, "idempotency_keys"}.Sanitize()+" (x int)"+
				"; CREATE TABLE "+pgx.Identifier{other, "idempotency_key_archive"}.Sanitize()+" (x int)")
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{other}.Sanitize()+" CASCADE")
			})
			_, err = conn.Exec(ctx, "SET search_path = "+pgx.Identifier{db.Schema + "_up"}.Sanitize()+", "+pgx.Identifier{other}.Sanitize())
			require.NoError(t, err)
			_, err = schema.Migrate(ctx, conn, logger)
			require.NoError(t, err, "the next deploy after an operator's additions (from version %d)", v)
		})
	}
}
