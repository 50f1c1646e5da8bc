package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// triggerFunctions returns the schema's trigger functions, qualified.
func triggerFunctions(t *testing.T, db *dbtest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT format('%I.%I', n.nspname, p.proname) FROM pg_proc p
		JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.prorettype = 'trigger'::regtype ORDER BY 1`, db.Schema)
	require.NoError(t, err)
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(fns), 4, "the schema's trigger functions: %v", fns)
	return fns
}

// requireNoTriggerFunctionAttaches tries to attach every trigger function
// of the schema to a temporary table of conn's role: each is refused for
// want of EXECUTE.
func requireNoTriggerFunctionAttaches(t *testing.T, conn *pgx.Conn, fns []string, who string) {
	t.Helper()
	ctx := context.Background()
	_, err := conn.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS carrier (x int)`)
	require.NoError(t, err, who)
	for _, fn := range fns {
		_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER borrow AFTER INSERT ON pg_temp.carrier FOR EACH ROW EXECUTE FUNCTION %s()`, fn))
		require.Error(t, err, "%s attached %s, which runs as the owner", who, fn)
		require.Equal(t, database.CodeInsufficientPrivilege, database.SQLState(err), "%s: %s: %v", who, fn, err)
	}
}

// The archive's trigger functions run as the owner (SECURITY DEFINER) and
// name what they act on through the schema of the table that fired them.
// Attached by another role to a temporary table of its own, one acted as
// the owner on that role's temporary tables and functions, whose own code
// then ran as the owner: a reader, a sweeper, a writer, or in the public
// schema any login, could delete archive rows (and a late retry would run
// again). Only the owner may attach them (migration 019, roles.sql): every
// other role is refused EXECUTE, and the attack leaves the archive whole.
func TestOnlyTheOwnerMayAttachTheTriggerFunctions(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:charged-once", Status: 201, ExpiredAt: time.Now()})
	fns := triggerFunctions(t, db)

	for _, role := range []string{schema.ReaderRole, schema.SweeperRole, schema.WriterRole} {
		conn, err := db.NewPool(t, dbtest.AsRole(role)).Acquire(ctx)
		require.NoError(t, err)
		requireNoTriggerFunctionAttaches(t, conn.Conn(), fns, role)

		// The attack whole, through the writers' trigger: stopped at its
		// CREATE TRIGGER, and the archive keeps its row.
		archive := pgx.Identifier{db.Schema, "idempotency_key_archive"}.Sanitize()
		for _, s := range []string{
			`CREATE TEMP TABLE idempotency_writers (ttl_ms bigint, skew_ms bigint, bounded boolean, first_used timestamptz, used_until timestamptz)`,
			fmt.Sprintf(`CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM %s; RETURN NEW; END $$`, archive),
			`CREATE TRIGGER evil BEFORE INSERT ON pg_temp.idempotency_writers FOR EACH ROW EXECUTE FUNCTION pg_temp.evil()`,
			`CREATE TEMP TABLE idempotency_keys (skew_ms bigint)`,
			fmt.Sprintf(`CREATE TRIGGER borrow BEFORE INSERT ON pg_temp.idempotency_keys FOR EACH ROW EXECUTE FUNCTION %s()`,
				pgx.Identifier{db.Schema, "idempotency_record_unbounded_writer"}.Sanitize()),
			`INSERT INTO pg_temp.idempotency_keys VALUES (NULL)`,
		} {
			if _, err := conn.Exec(ctx, s); err != nil {
				require.Equal(t, database.CodeInsufficientPrivilege, database.SQLState(err), "%s: %s: %v", role, s, err)
				break
			}
		}
		conn.Release()
		require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"), role)
	}

	// A login holding no project role, where PUBLIC has USAGE on the
	// schema (as on public, PostgreSQL's default schema).
	_, err := db.Pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+pgx.Identifier{db.Schema}.Sanitize()+" TO PUBLIC")
	require.NoError(t, err)
	requireNoTriggerFunctionAttaches(t, login(t, db, ""), fns, "a login with no project role")

	// The archive's own triggers still fire: a row written records its key.
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:plain-after", Status: 201, ExpiredAt: time.Now()})
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:plain-after')"))
}

// login signs in as a new LOGIN role of the test holding role ("" for
// none), as a function's database user does.
func login(t *testing.T, db *dbtest.DB, role string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	user := pgx.Identifier{"login_" + role + "_" + db.Schema}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+user+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+user)
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+user)
	})
	if role != "" {
		_, err = db.Pool.Exec(ctx, "GRANT "+role+" TO "+user)
		require.NoError(t, err)
	}
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.User = "login_" + role + "_" + db.Schema
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// The functions that run as the owner search pg_temp last. A search_path
// that does not name it searches it first for types and tables: the
// archive's recording trigger declares timestamptz and text variables,
// which resolved to domains of those names in the temporary schema of the
// session that fired it. The sweeper (which may insert archive rows) made
// such a domain, whose CHECK called a function of its own, and inserted a
// row: the function ran as the owner and deleted an archive row. Now the
// insert records its row, and the sweeper's code never runs.
func TestTheOwnersCodeNeverResolvesAnotherSessionsTemporaryNames(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:charged-once", Status: 201, ExpiredAt: time.Now()})

	var unsafe []string
	rows, err := db.Pool.Query(ctx, `SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.prosecdef AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)`, db.Schema)
	require.NoError(t, err)
	unsafe, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, unsafe, "SECURITY DEFINER functions whose search_path does not name pg_temp last")

	conn := login(t, db, schema.SweeperRole)
	archive := pgx.Identifier{db.Schema, "idempotency_key_archive"}.Sanitize()
	for _, s := range []string{
		fmt.Sprintf(`CREATE FUNCTION pg_temp.evil(pg_catalog.timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
			BEGIN DELETE FROM %s WHERE scoped_key = 'idem:v1:charged-once'; RETURN true; END $$`, archive),
		`CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamptz CHECK (pg_temp.evil(VALUE))`,
		`CREATE FUNCTION pg_temp.who(pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'the sweeper''s code ran as %', current_user; END $$`,
		`CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.who(VALUE))`,
	} {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:other', '\x00', 201, now(), now())`, archive))
	require.NoError(t, err, "the sweeper's insert runs the owner's trigger, not the sweeper's code")
	require.EqualValues(t, 2, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:other')"))
}

// A lease only grows: the writer and the sweeper may renew theirs (UPDATE
// of first_used and used_until), and an update that would shrink one
// (which the archive skip reads as the proof that no key of that writer
// was archived outside it) keeps the wider bounds. Neither may delete one.
func TestALeaseOnlyGrows(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until)
		VALUES (86400000, 1000, true, '2026-01-01 00:00:00+00', '2026-12-01 00:00:00+00')`)
	require.NoError(t, err)
	bounds := func() (string, string) {
		var from, until string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_char(first_used AT TIME ZONE 'UTC', 'YYYY-MM-DD'), to_char(used_until AT TIME ZONE 'UTC', 'YYYY-MM-DD')
			FROM idempotency_writers WHERE ttl_ms = 86400000`).Scan(&from, &until))
		return from, until
	}
	var writer *pgx.Conn
	for _, role := range []string{schema.WriterRole, schema.SweeperRole} {
		conn := login(t, db, role)
		if role == schema.WriterRole {
			writer = conn
		}
		_, err := conn.Exec(ctx, `UPDATE idempotency_writers SET first_used = '2026-06-01', used_until = '2026-06-02' WHERE ttl_ms = 86400000`)
		require.NoError(t, err, role)
		from, until := bounds()
		require.Equal(t, "2026-01-01", from, role)
		require.Equal(t, "2026-12-01", until, role)
		_, err = conn.Exec(ctx, `DELETE FROM idempotency_writers`)
		require.Equal(t, database.CodeInsufficientPrivilege, database.SQLState(err), "%s: %v", role, err)
	}
	// Growing it is a renewal, and is kept.
	_, err = writer.Exec(ctx, `UPDATE idempotency_writers SET first_used = '2025-12-01', used_until = '2027-01-01' WHERE ttl_ms = 86400000`)
	require.NoError(t, err)
	from, until := bounds()
	require.Equal(t, "2025-12-01", from)
	require.Equal(t, "2027-01-01", until)
}
