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
		`ALTER TABLE idempotency_key_archive_2026_12 SET UNLOGGED`:                                                                         "idempotency_key_archive_2026_12 is UNLOGGED",
		`ALTER TABLE idempotency_keys SET UNLOGGED`:                                                                                        "idempotency_keys is UNLOGGED",
		`ALTER TABLE idempotency_keys DISABLE TRIGGER idempotency_keys_unbounded_writer`:                                                   "trigger idempotency_keys_unbounded_writer on idempotency_keys is disabled",
		`ALTER TABLE idempotency_keys ENABLE REPLICA TRIGGER idempotency_keys_unbounded_writer`:                                            "is replica-only",
		`DROP TRIGGER idempotency_keys_unbounded_writer ON idempotency_keys`:                                                               "idempotency_keys has no trigger idempotency_keys_unbounded_writer",
		`ALTER TABLE idempotency_writers DISABLE TRIGGER idempotency_writers_only_grow`:                                                    "trigger idempotency_writers_only_grow on idempotency_writers is disabled",
		`DROP TRIGGER idempotency_copy_pending_range ON idempotency_archive_plain_keys_pending`:                                            "has no trigger idempotency_copy_pending_range",
		`ALTER TABLE idempotency_key_archive DROP CONSTRAINT idempotency_key_archive_pkey`:                                                 "idempotency_key_archive has no primary key",
		`GRANT DELETE ON idempotency_key_archive TO PUBLIC`:                                                                                "PUBLIC may DELETE on idempotency_key_archive",
		`GRANT TRUNCATE ON idempotency_key_archive_2026_12 TO PUBLIC`:                                                                      "PUBLIC may TRUNCATE on idempotency_key_archive_2026_12",
		`GRANT DELETE ON idempotency_keys TO idempotency_reader`:                                                                           "idempotency_reader may DELETE on idempotency_keys",
		`DO $$ BEGIN EXECUTE format('GRANT CREATE ON SCHEMA %I TO PUBLIC', current_schema()); END $$`:                                      "PUBLIC may CREATE in schema",
		`DROP INDEX idempotency_keys_expires_at_idx`:                                                                                       "no valid btree index idempotency_keys_expires_at_idx on (expires_at) alone",
		`DROP INDEX idempotency_keys_expires_at_idx; CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (state) WHERE false`: "no valid btree index idempotency_keys_expires_at_idx",
		`DROP TRIGGER idempotency_keys_unbounded_writer ON idempotency_keys;
		 CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
		 CREATE TRIGGER idempotency_keys_unbounded_writer AFTER TRUNCATE ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION noop()`: "trigger idempotency_keys_unbounded_writer on idempotency_keys is not the one migrate creates",
		`DROP TRIGGER idempotency_keys_unbounded_writer ON idempotency_keys;
		 CREATE TRIGGER idempotency_keys_unbounded_writer BEFORE INSERT ON idempotency_keys FOR EACH ROW WHEN (false) EXECUTE FUNCTION idempotency_record_unbounded_writer()`: "trigger idempotency_keys_unbounded_writer on idempotency_keys is not the one migrate creates",
		`DROP TRIGGER idempotency_writers_only_grow ON idempotency_writers;
		 CREATE TRIGGER idempotency_writers_only_grow BEFORE UPDATE OF first_used ON idempotency_writers FOR EACH ROW EXECUTE FUNCTION idempotency_writers_only_grow()`: "trigger idempotency_writers_only_grow on idempotency_writers is not the one migrate creates",
		`GRANT UPDATE (resource_id, status_code) ON idempotency_key_archive TO PUBLIC`:                                                                                     "PUBLIC may UPDATE (resource_id, status_code) on idempotency_key_archive",
		`GRANT INSERT (scoped_key) ON idempotency_key_archive_2026_12 TO PUBLIC`:                                                                                           "PUBLIC may INSERT (scoped_key) on idempotency_key_archive_2026_12",
		`GRANT UPDATE (ttl_ms) ON idempotency_writers TO idempotency_reader`:                                                                                               "idempotency_reader may UPDATE on idempotency_writers",
		`GRANT INSERT ON idempotency_archive_recorded_partitions TO PUBLIC`:                                                                                                "PUBLIC may INSERT on idempotency_archive_recorded_partitions",
		`GRANT DELETE ON idempotency_archive_schema_version TO idempotency_reader`:                                                                                         "idempotency_reader may DELETE on idempotency_archive_schema_version",
		`ALTER TABLE idempotency_key_archive ENABLE ROW LEVEL SECURITY`:                                                                                                    "idempotency_key_archive has row level security on",
		`ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY`:                                                                                                            "idempotency_keys has row level security on",
		`ALTER TABLE idempotency_key_archive_2026_12 ENABLE ROW LEVEL SECURITY`:                                                                                            "idempotency_key_archive_2026_12 has row level security on",
		`CREATE OR REPLACE FUNCTION idempotency_writers_only_grow() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$ BEGIN RETURN NEW; END $$`: "trigger idempotency_writers_only_grow on idempotency_writers is not the one migrate creates",
		`ALTER FUNCTION idempotency_record_unbounded_writer() SECURITY INVOKER`:                                                                                            "trigger idempotency_keys_unbounded_writer on idempotency_keys is not the one migrate creates",
		`ALTER FUNCTION idempotency_copy_pending_range() RESET search_path`:                                                                                                "trigger idempotency_copy_pending_range on idempotency_archive_plain_keys_pending is not the one migrate creates",
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

// Another's trigger on the project's tables, disabled, breaks no promise.
func TestAnotherDisabledTriggerPassesTheIntactCheck(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, err := db.Pool.Exec(context.Background(), `
		CREATE FUNCTION ops_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
		CREATE TRIGGER ops_audit AFTER INSERT ON idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION ops_audit();
		ALTER TABLE idempotency_keys DISABLE TRIGGER ops_audit`)
	require.NoError(t, err)
	c := checkNamed(t, db.Pool, "tables are as migrate made them")
	require.True(t, c.Pass, c.Figure)
}

// An archive partition in another schema (a month restored by hand, then
// adopted) is checked as the others are, named with its schema.
func TestAnArchivePartitionInAnotherSchemaIsChecked(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	side := db.Schema + "_side"
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+side+" CASCADE") })
	for _, sql := range []string{
		"CREATE SCHEMA " + side,
		"CREATE UNLOGGED TABLE " + side + ".restored_oct (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
		"ALTER TABLE idempotency_key_archive ATTACH PARTITION " + side + ".restored_oct FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00')",
		"GRANT DELETE ON " + side + ".restored_oct TO PUBLIC",
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	c := checkNamed(t, db.Pool, "tables are as migrate made them")
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, side+".restored_oct is UNLOGGED")
	require.Contains(t, c.Figure, "PUBLIC may DELETE on "+side+".restored_oct")
}

// Where the search_path's first schema holds no project table (the tables
// are further on the path), the check fails saying so: it and migrate read
// the first schema, the other checks the tables the path finds.
func TestTheIntactCheckFailsWhereThePathsFirstSchemaHoldsNoTables(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	first := db.Schema + "_first"
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+first)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+first+" CASCADE") })
	pool := db.NewPool(t, dbtest.WithParam("search_path", first+", "+db.Schema))
	c := checkNamed(t, pool, "tables are as migrate made them")
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "the search_path's first schema is "+first+", but it reads idempotency_keys from "+db.Schema)
}
