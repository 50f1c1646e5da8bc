package main

import (
	"context"
	"net/url"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
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
    IF current_user <> '`+b.users.Owner+`' THEN
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
    IF current_user <> '`+b.users.Owner+`' THEN
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
