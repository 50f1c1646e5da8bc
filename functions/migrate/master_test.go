package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/provision"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// setupAsMaster is setup with a migrating user like RDS's master user: not a
// superuser, CREATEROLE, owner of the schema.
func setupAsMaster(t *testing.T) (bundle, string) {
	t.Helper()
	ctx := context.Background()
	base := dbtest.URL(t)
	suffix := randomSuffix()
	name, master := "test_"+suffix, "master_"+suffix
	admin, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	for _, stmt := range []string{
		"CREATE ROLE " + master + " LOGIN CREATEROLE",
		"CREATE SCHEMA " + name + " AUTHORIZATION " + master,
	} {
		_, err = admin.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	admin.Close(ctx)
	users := provision.Users{Sweeper: "sweeper_" + suffix, Reader: "reader_" + suffix, Owner: "owner_" + suffix, Writer: "api_" + suffix}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP SCHEMA "+name+" CASCADE")
		for _, u := range []string{users.Sweeper, users.Reader, users.Owner, users.Writer, master} {
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+u)
			_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+u)
		}
	})
	// The test server trusts local connections, so the master signs in
	// without a password.
	parsed, err := url.Parse(base)
	require.NoError(t, err, "DATABASE_URL must be a postgres:// URL")
	parsed.User = url.User(master)
	u := parsed.String()
	db := &dbtest.DB{Schema: name, URL: dbtest.WithSearchPath(t, u, name)}
	db.Pool = db.NewPool(t)
	env, stdout, stderr := testenv.FunctionEnv(t, db, nil)
	h := lambda.NewHandler(lambdaHandler(env))
	c := newCloudFormation(t)
	b := bundle{db: db, users: users, cfn: c, stdout: stdout, stderr: stderr}
	b.invoke = func(event []byte) cfn.Response {
		t.Helper()
		_, err := h.Invoke(testenv.Invocation("req-"+suffix), event)
		require.NoError(t, err)
		return c.last(t)
	}
	return b, master
}

// The first deploy as a migrating user like RDS's master user (not a
// superuser, CREATEROLE, owner of the schema): roles.sql gives the owner
// role CREATE on the schema before it makes it the tables' owner, which
// PostgreSQL requires of every migrating user but a superuser.
func TestACreateAsANonSuperuserMasterSucceeds(t *testing.T) {
	t.Parallel()
	b, me := setupAsMaster(t)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, me, schema.OwnerRole), "roles.sql makes the migrating user a member of the owner role")
	require.EqualValues(t, 1, count(t, b, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('idempotency_key_archive') AND relowner = $1::regrole", schema.OwnerRole))
}

// The rollback of an Update that named the migrating user (refused: it is
// privileged) gets the refused properties as its previous ones: the
// migrating user's name is "dropped", and must keep the owner role
// roles.sql gave it, or the rollback's own partition run fails.
func TestTheRollbackOfARefusedUpdateLeavesTheMigratingUsersRoles(t *testing.T) {
	t.Parallel()
	b, me := setupAsMaster(t)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	mistaken := func(p map[string]any) { p["OwnerUser"] = me }
	resp = b.invoke(b.transition(t, nil, mistaken))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "privileged role")

	resp = b.invoke(b.transition(t, mistaken, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, me, schema.OwnerRole), "the rollback revoked %s from the migrating user", schema.OwnerRole)
}

// WriterUser is optional, and the live API may still connect as a user an
// Update leaves out: it keeps its role. Were that name later given to a
// function, the function's user would hold that function's role alone.
func TestADroppedWriterUserKeepsItsRoleUntilAFunctionTakesTheName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	noWriter := func(p map[string]any) { delete(p, "WriterUser") }
	resp := b.invoke(b.transition(t, nil, noWriter))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, b.users.Writer, schema.WriterRole), "the live API's user lost its role")

	// The next deploy gives the writer's old name to the lookup function.
	resp = b.invoke(b.transition(t, noWriter, func(p map[string]any) { delete(p, "WriterUser"); p["ReaderUser"] = b.users.Writer }))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	for _, r := range []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole} {
		require.Equal(t, r == schema.ReaderRole, memberOf(t, b, b.users.Writer, r), "%s in %s", b.users.Writer, r)
	}
}
