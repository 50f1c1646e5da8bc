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
	user := "anyone_" + db.Schema
	_, err = db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{user}.Sanitize()+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{user}.Sanitize()) })
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.User = user
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	requireNoTriggerFunctionAttaches(t, conn, fns, user)

	// The archive's own triggers still fire: a row written records its key.
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:plain-after", Status: 201, ExpiredAt: time.Now()})
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:plain-after')"))
}
