package main

import (
	"context"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// plantTernLock has the owner's login user create
// pg_advisory_lock(double precision) and pg_advisory_unlock(double precision)
// in the archive's schema (tern's unqualified "select pg_advisory_lock($1)"
// resolves to them), whose body gives the attacker CREATEROLE whenever it
// runs as a role that may create roles (the migrating user).
func plantTernLock(t *testing.T, owner *pgx.Conn, attacker string) {
	t.Helper()
	for _, fn := range []string{"pg_advisory_lock", "pg_advisory_unlock"} {
		ret, body := "void", "PERFORM pg_catalog."+fn+"(k::pg_catalog.int8);"
		if fn == "pg_advisory_unlock" {
			ret, body = "boolean", "RETURN pg_catalog."+fn+"(k::pg_catalog.int8);"
		}
		_, err := owner.Exec(context.Background(), `
CREATE FUNCTION `+fn+`(k double precision) RETURNS `+ret+`
    LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF (SELECT r.rolcreaterole OR r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        EXECUTE 'ALTER ROLE `+attacker+` CREATEROLE';
    END IF;
    `+body+`
END
$f$`)
		require.NoError(t, err, "the owner's login user may create functions in the archive's schema")
	}
}

// redeploy runs event from a fresh execution environment (no statement
// prepared before the attack), and returns CloudFormation's answer.
func redeploy(t *testing.T, b bundle, event []byte, vars map[string]string) cfn.Response {
	t.Helper()
	env, _, _ := testenv.FunctionEnv(t, b.db, vars)
	_, err := lambda.NewHandler(lambdaHandler(env)).Invoke(testenv.Invocation("req-redeploy"), event)
	require.NoError(t, err)
	return b.cfn.last(t)
}

func gainedCreateRole(t *testing.T, owner *pgx.Conn, who string) bool {
	t.Helper()
	var can bool
	require.NoError(t, owner.QueryRow(context.Background(), "SELECT rolcreaterole FROM pg_roles WHERE rolname = $1", who).Scan(&can))
	return can
}

// An Update swaps OwnerUser and SweeperUser while the old owner user has
// planted pg_advisory_lock(double precision) in the schema: the new
// OwnerUser is no member of idempotency_owner yet, so the users are
// provisioned first (the old owner user loses the role) and the migrations
// run as the new one, never as the migrating user.
func TestSwappingOwnerUserNeverRunsTheOldOwnersCode(t *testing.T) {
	t.Parallel()
	b, master, owner := deployedAsMaster(t)
	plantTernLock(t, owner, b.users.Owner)

	swapped := func(p map[string]any) { p["OwnerUser"], p["SweeperUser"] = b.users.Sweeper, b.users.Owner }
	resp := redeploy(t, b, b.transition(t, nil, swapped), nil)
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, b.users.Sweeper, "idempotency_owner"))
	require.False(t, memberOf(t, b, b.users.Owner, "idempotency_owner"), "the old owner user is the sweeper's now, and holds its role alone")

	require.False(t, gainedCreateRole(t, owner, b.users.Owner),
		"the old partitions user %s gained CREATEROLE: its pg_advisory_lock(double precision) ran as the migrating user %s (the new OwnerUser was no member yet, so the migrations ran as master)", b.users.Owner, master)
}

// The same with an Update that renames OwnerUser to a new user (credential
// rotation): the new user is made and given the role before any migration.
func TestRenamingOwnerUserNeverRunsTheOldOwnersCode(t *testing.T) {
	t.Parallel()
	b, master, owner := deployedAsMaster(t)
	renamed := "owner2_" + randomSuffix()
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "SELECT 1") // keep owner open until here
		_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+renamed)
	})
	plantTernLock(t, owner, b.users.Owner)

	resp := redeploy(t, b, b.transition(t, nil, func(p map[string]any) { p["OwnerUser"] = renamed }), nil)
	t.Logf("the rename deploy answered %s: %s", resp.Status, resp.Reason)
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.False(t, memberOf(t, b, b.users.Owner, "idempotency_owner"), "the old owner user loses the role")
	require.True(t, memberOf(t, b, renamed, "idempotency_owner"))

	require.False(t, gainedCreateRole(t, owner, b.users.Owner),
		"the old partitions user %s gained CREATEROLE: its planted code ran as the migrating user %s during the rename", b.users.Owner, master)
}

// An Update that names a privileged user (here the migrating user) as
// OwnerUser is refused before any migration runs, so the planted code of
// the owner user still in place never runs as the migrating user.
func TestARefusedOwnerUserNameRunsNoMigration(t *testing.T) {
	t.Parallel()
	b, master, owner := deployedAsMaster(t)
	plantTernLock(t, owner, b.users.Owner)

	resp := redeploy(t, b, b.transition(t, nil, func(p map[string]any) { p["OwnerUser"] = master }), nil)
	t.Logf("the mistaken Update answered %s: %s", resp.Status, resp.Reason)
	require.Equal(t, cfn.StatusFailed, resp.Status)

	require.False(t, gainedCreateRole(t, owner, b.users.Owner),
		"the partitions user %s gained CREATEROLE: an Update naming a privileged OwnerUser ran tern as the migrating user %s before refusing it", b.users.Owner, master)
}
