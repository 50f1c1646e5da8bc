package main

import (
	"context"
	"net/url"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/schema"
)

// idempotency_owner owns the schema's functions and has CREATE on the
// schema, and the partitions function's user (OwnerUser) is a member: that
// user may replace idempotency_archive_partition_recorded(oid), which the
// partition manager calls for every partition. The deploy's partition run
// signs in as OwnerUser, so the next deploy runs the replaced body with the
// owner's privileges, never the migrating (master) user's.
func TestOwnerUserCannotEscalateThroughTheNextDeploy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, master, owner := deployedAsMaster(t)
	var can bool
	require.NoError(t, owner.QueryRow(ctx, "SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user").Scan(&can))
	require.False(t, can)

	_, err := owner.Exec(ctx, `
CREATE OR REPLACE FUNCTION idempotency_archive_partition_recorded(part oid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF current_user NOT IN ('`+b.users.Owner+`', 'idempotency_owner') THEN
        EXECUTE 'ALTER ROLE `+b.users.Owner+` CREATEROLE';
    END IF;
    RETURN true;
END
$f$`)
	require.NoError(t, err, "the owner's login user may replace the function")

	// The next deploy (an Update with the same properties).
	resp := b.invoke(b.transition(t, nil, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	require.NoError(t, owner.QueryRow(ctx, "SELECT rolcreaterole FROM pg_roles WHERE rolname = $1", b.users.Owner).Scan(&can))
	require.False(t, can, "the partitions function's user %s gained CREATEROLE: its function ran as the migrating user %s during the deploy", b.users.Owner, master)
}

// The same owner user creates format(text, text) in the archive's schema, a
// better match for format('... %I', role_name) than pg_catalog's
// format(text, VARIADIC "any"). roles.sql, run by every deploy as the
// migrating user, resolves every name in pg_catalog alone.
func TestOwnerUserCannotEscalateThroughRolesSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, master, owner := deployedAsMaster(t)
	_, err := owner.Exec(ctx, `
CREATE FUNCTION format(fmt text, arg text) RETURNS text
    LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF current_user NOT IN ('`+b.users.Owner+`', 'idempotency_owner') THEN
        EXECUTE 'ALTER ROLE `+b.users.Owner+` CREATEROLE';
    END IF;
    RETURN pg_catalog.format(fmt, arg);
END
$f$`)
	require.NoError(t, err, "the owner's login user may create functions in the archive's schema")

	// The deploy may fail (ensureUsers then finds the owner user
	// privileged), but roles.sql committed before it.
	resp := b.invoke(b.transition(t, nil, nil))
	t.Logf("the deploy answered %s: %s", resp.Status, resp.Reason)

	var can bool
	require.NoError(t, owner.QueryRow(ctx, "SELECT rolcreaterole FROM pg_roles WHERE rolname = $1", b.users.Owner).Scan(&can))
	require.False(t, can, "the partitions function's user %s gained CREATEROLE: its format(text, text) ran as the migrating user %s in roles.sql", b.users.Owner, master)
}

// deployedAsMaster runs a Create as a master user (CREATEROLE, not
// superuser) and signs in as the partitions function's user (the test
// server trusts local connections).
func deployedAsMaster(t *testing.T) (bundle, string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	b, master := setupAsMaster(t)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	u, err := url.Parse(b.db.URL)
	require.NoError(t, err)
	u.User = url.User(b.users.Owner)
	owner, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close(context.Background()) })
	return b, master, owner
}

// The owner's member creates pg_advisory_lock(double precision) and
// pg_advisory_unlock(double precision) in the archive's schema: tern takes
// its lock with an unqualified "select pg_advisory_lock($1)" whose $1
// reaches the server untyped, for which PostgreSQL prefers the float8
// candidate over pg_catalog's bigint one (CVE-2018-1058's pattern), on
// every deploy, even with no migration pending. The deploy applies the
// migrations as the owner user, so that code never runs as the migrating
// user, in either statement mode.
func TestOwnerUserCannotEscalateThroughTernsLock(t *testing.T) {
	t.Parallel()
	for _, execMode := range []string{"cache_statement", "exec"} {
		t.Run(execMode, func(t *testing.T) {
			t.Parallel()
			ownerEscalatesThroughTern(t, execMode)
		})
	}
}

func ownerEscalatesThroughTern(t *testing.T, execMode string) {
	b, master, owner := deployedAsMaster(t)
	plantTernLock(t, owner, b.users.Owner)
	// The next deploy (an Update with the same properties), from a fresh
	// execution environment (a new function version: a cold start, whose
	// pool has no statement prepared before the attack), with the exec mode
	// given: no migration is pending, tern still takes its lock.
	resp := redeploy(t, b, b.transition(t, nil, nil), map[string]string{"DATABASE_EXEC_MODE": execMode})
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.False(t, gainedCreateRole(t, owner, b.users.Owner),
		"the partitions function's user %s gained CREATEROLE: its pg_advisory_lock(double precision) ran as the migrating user %s in tern's lock", b.users.Owner, master)
}

// The owner's member puts a statement trigger on a table of the owner's
// that a migration writes (migration 13 updates
// idempotency_archive_recorded_partitions): the deploy that applies it runs
// the trigger as the owner, never as the migrating user.
func TestOwnerUserCannotEscalateThroughAMigrationsTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, master, owner := deployedAsMaster(t)
	_, err := owner.Exec(ctx, `
CREATE FUNCTION planted() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF current_user NOT IN ('`+b.users.Owner+`', 'idempotency_owner') THEN
        EXECUTE 'ALTER ROLE `+b.users.Owner+` CREATEROLE';
    END IF;
    RETURN NULL;
END
$f$;
CREATE TRIGGER planted AFTER INSERT OR UPDATE OR DELETE ON idempotency_archive_recorded_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION planted();`)
	require.NoError(t, err, "the owner's member may create triggers on the owner's tables")
	// A schema one migration behind (migration 13 is written to run again),
	// whose version table is still the migrating user's, as an earlier
	// release left it.
	_, err = b.db.Pool.Exec(ctx, "UPDATE "+schema.VersionTable+" SET version = 12")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "ALTER TABLE "+schema.VersionTable+" OWNER TO "+master)
	require.NoError(t, err)

	resp := b.invoke(b.transition(t, nil, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	var version int32
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT version FROM "+schema.VersionTable).Scan(&version))
	require.Equal(t, schema.LatestVersion(), version)
	var tableOwner string
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1", schema.VersionTable).Scan(&tableOwner))
	require.Equal(t, "idempotency_owner", tableOwner, "the owner role's members apply the migrations")
	var can bool
	require.NoError(t, owner.QueryRow(ctx, "SELECT rolcreaterole FROM pg_roles WHERE rolname = $1", b.users.Owner).Scan(&can))
	require.False(t, can, "the partitions function's user %s gained CREATEROLE: its trigger ran as the migrating user %s in migration 13", b.users.Owner, master)
}
