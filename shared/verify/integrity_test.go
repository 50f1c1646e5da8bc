package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/verify"
)

func checkNamed(t *testing.T, pool *pgxpool.Pool, name string) verify.Check {
	t.Helper()
	checks, err := verify.Run(context.Background(), pool, verify.Options{Now: func() time.Time { return now }})
	require.NoError(t, err)
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %v", name, checks)
	return verify.Check{}
}

// What keeps the rows and the skip's guarantee, broken by hand, fails
// "tables are as migrate made them", named.
func TestTheIntactCheckNamesWhatBreaksTheTables(t *testing.T) {
	t.Parallel()
	const name = "tables are as migrate made them"
	c := checkNamed(t, setup(t).Pool, name)
	require.True(t, c.Pass, c.Figure)
	for ddl, want := range map[string]string{
		`ALTER TABLE idempotency_key_archive_2026_12 SET UNLOGGED`:                                    "idempotency_key_archive_2026_12 is UNLOGGED",
		`ALTER TABLE idempotency_keys SET UNLOGGED`:                                                   "idempotency_keys is UNLOGGED",
		`ALTER TABLE idempotency_keys DISABLE TRIGGER idempotency_keys_unbounded_writer`:              "trigger idempotency_keys_unbounded_writer on idempotency_keys is disabled",
		`ALTER TABLE idempotency_keys ENABLE REPLICA TRIGGER idempotency_keys_unbounded_writer`:       "is replica-only",
		`DROP TRIGGER idempotency_keys_unbounded_writer ON idempotency_keys`:                          "idempotency_keys has no trigger idempotency_keys_unbounded_writer",
		`ALTER TABLE idempotency_writers DISABLE TRIGGER idempotency_writers_only_grow`:               "trigger idempotency_writers_only_grow on idempotency_writers is disabled",
		`DROP TRIGGER idempotency_copy_pending_range ON idempotency_archive_plain_keys_pending`:       "has no trigger idempotency_copy_pending_range",
		`DROP INDEX idempotency_keys_expires_at_idx`:                                                  "no valid index idempotency_keys_expires_at_idx",
		`ALTER TABLE idempotency_key_archive DROP CONSTRAINT idempotency_key_archive_pkey`:            "idempotency_key_archive has no primary key",
		`GRANT DELETE ON idempotency_key_archive TO PUBLIC`:                                           "PUBLIC may DELETE on idempotency_key_archive",
		`GRANT TRUNCATE ON idempotency_key_archive_2026_12 TO PUBLIC`:                                 "PUBLIC may TRUNCATE on idempotency_key_archive_2026_12",
		`GRANT DELETE ON idempotency_keys TO idempotency_reader`:                                      "idempotency_reader may DELETE on idempotency_keys",
		`DO $$ BEGIN EXECUTE format('GRANT CREATE ON SCHEMA %I TO PUBLIC', current_schema()); END $$`: "PUBLIC may CREATE in schema",
	} {
		t.Run(want, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			_, err := db.Pool.Exec(context.Background(), ddl)
			require.NoError(t, err)
			c := checkNamed(t, db.Pool, name)
			require.False(t, c.Pass, "%s: %s", ddl, c.Figure)
			require.Contains(t, c.Figure, want)
		})
	}
}

// An archive column retyped so that it can hold a payload under its name
// fails "no column can hold a payload".
func TestARetypedArchiveColumnFailsThePayloadCheck(t *testing.T) {
	t.Parallel()
	for ddl, want := range map[string]string{
		`ALTER TABLE idempotency_key_archive ALTER COLUMN status_code TYPE text`:                                                                "status_code text",
		`ALTER TABLE idempotency_key_archive ALTER COLUMN resource_id TYPE xml USING resource_id::xml`:                                          "resource_id xml",
		`ALTER TABLE idempotency_key_archive ALTER COLUMN resource_id TYPE jsonb USING to_jsonb(resource_id)`:                                   "resource_id jsonb",
		`ALTER TABLE idempotency_key_archive ALTER COLUMN resource_id TYPE varchar(100000)`:                                                     "resource_id character varying",
		"CREATE DOMAIN payload AS jsonb; ALTER TABLE idempotency_key_archive ALTER COLUMN resource_id TYPE payload USING to_jsonb(resource_id)": "resource_id payload",
	} {
		t.Run(want, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			_, err := db.Pool.Exec(context.Background(), ddl)
			require.NoError(t, err)
			c := checkNamed(t, db.Pool, "no column can hold a payload")
			require.False(t, c.Pass, c.Figure)
			require.Contains(t, c.Figure, want)
		})
	}
}

// Archive rows whose expiry is still ahead (a Redis store archives at
// completion, with the end of the key's window) did not expire recently:
// they show no sweep.
func TestArchiveRowsNotYetExpiredAreNotRecent(t *testing.T) {
	t.Parallel()
	db := setup(t)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:future", Status: 201, CreatedAt: now.Add(-time.Hour), ExpiredAt: now.Add(2 * time.Hour)})
	c := checkNamed(t, db.Pool, "recent archive rows exist")
	require.False(t, c.Pass, c.Figure)
	require.Equal(t, "0 rows expired in the last 24h", c.Figure)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:past", Status: 201, CreatedAt: now.Add(-3 * time.Hour), ExpiredAt: now.Add(-2 * time.Hour)})
	c = checkNamed(t, db.Pool, "recent archive rows exist")
	require.True(t, c.Pass, c.Figure)
	require.Equal(t, "1 rows expired in the last 24h", c.Figure)
}

// Through RDS Proxy (the exec and simple_protocol modes) a timestamp comes
// back as text, which parses only under DateStyle ISO: verify reads the
// database's clock under any.
func TestVerifyReadsTheDatabaseClockUnderAnyDateStyle(t *testing.T) {
	t.Parallel()
	db := setup(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		pool := db.NewPool(t, dbtest.WithParam("DateStyle", "German"), dbtest.WithParam("TimeZone", "Asia/Kathmandu"),
			func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
		checks, err := verify.Run(context.Background(), pool, verify.Options{})
		require.NoError(t, err, mode.String())
		require.Len(t, checks, 6)
	}
}
