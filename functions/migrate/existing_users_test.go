package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/provision"
)

// An existing user named as a function's, whose settings keep it from doing
// that function's work, used to be adopted and the deploy answered SUCCESS:
// every invocation then failed. The deploy fails instead, saying what to
// run; once it is run, the next deploy succeeds and the user works.
func TestAnExistingUserThatCouldNotWorkFailsTheDeployWithTheRemedy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		user    func(provision.Users) string
		setup   []string
		want    string
		remedy  string
		canWork string
	}{
		{"connection limit 0", func(u provision.Users) string { return u.Sweeper }, []string{"CREATE ROLE %[1]s LOGIN CONNECTION LIMIT 0"},
			"CONNECTION LIMIT 0", "ALTER ROLE %[1]s CONNECTION LIMIT -1", "SELECT 1"},
		{"read only", func(u provision.Users) string { return u.Sweeper },
			[]string{"CREATE ROLE %[1]s LOGIN", "ALTER ROLE %[1]s SET default_transaction_read_only = on"},
			"default_transaction_read_only", "ALTER ROLE %[1]s RESET default_transaction_read_only", "DELETE FROM idempotency_keys WHERE false"},
		{"read only in this database", func(u provision.Users) string { return u.Writer },
			[]string{"CREATE ROLE %[1]s LOGIN", "ALTER ROLE %[1]s IN DATABASE %[2]s SET default_transaction_read_only = yes"},
			"default_transaction_read_only", "ALTER ROLE %[1]s IN DATABASE %[2]s RESET default_transaction_read_only", "DELETE FROM idempotency_keys WHERE false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			user := tc.user(b.users)
			id := pgx.Identifier{user}.Sanitize()
			var dbName string
			require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT quote_ident(current_database())").Scan(&dbName))
			sprintf := func(format, id string) string { return fmt.Sprintf(format, id, dbName) }
			for _, stmt := range tc.setup {
				_, err := b.db.Pool.Exec(ctx, sprintf(stmt, id))
				require.NoError(t, err)
			}
			resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
			require.Equal(t, cfn.StatusFailed, resp.Status)
			require.Contains(t, resp.Reason, tc.want)
			require.Contains(t, resp.Reason, sprintf(tc.remedy, id))

			_, err := b.db.Pool.Exec(ctx, sprintf(tc.remedy, id))
			require.NoError(t, err)
			resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
			require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
			pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User, c.ConnConfig.Password = user, "" })
			_, err = pool.Exec(ctx, tc.canWork)
			require.NoError(t, err, "%s cannot do its function's work after a deploy that succeeded", user)
		})
	}
}

// A NOINHERIT user would not use its group role's privileges: on
// PostgreSQL 15 the deploy fails saying so; on 16 and later its grant
// (WITH INHERIT TRUE) makes it inherit, and the deploy succeeds with a user
// that works.
func TestAnExistingNoInheritUserFailsTheDeployOrIsMadeToWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := pgx.Identifier{b.users.Reader}.Sanitize()
	_, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+id+" LOGIN NOINHERIT")
	require.NoError(t, err)
	var version int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	if version < 160000 {
		require.Equal(t, cfn.StatusFailed, resp.Status)
		require.Contains(t, resp.Reason, "NOINHERIT")
		require.Contains(t, resp.Reason, "ALTER ROLE "+id+" INHERIT")
		_, err = b.db.Pool.Exec(ctx, "ALTER ROLE "+id+" INHERIT")
		require.NoError(t, err)
		resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	}
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User, c.ConnConfig.Password = b.users.Reader, "" })
	_, err = pool.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err, "the lookup function's user cannot read the archive after a deploy that succeeded")
}

// Not parallel: rds_iam is cluster-wide. Another application's user, which
// signs in with a password, named by mistake as a function's: granting it
// rds_iam would turn its password sign-in off on RDS, and it would get the
// function's rights. No deploy made it (it holds neither rds_iam nor a role
// of this project), so the deploy refuses it, changing nothing; an
// operator who means it grants it rds_iam first.
func TestAnotherApplicationsUserIsNotTakenOver(t *testing.T) {
	ctx := context.Background()
	admin, b := setupWithRDSIAM(t)
	var err error
	id := pgx.Identifier{b.users.Owner}.Sanitize()
	_, err = admin.Exec(ctx, "CREATE ROLE "+id+" LOGIN PASSWORD 'app-secret'")
	require.NoError(t, err)

	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "no deploy made it")
	require.Contains(t, resp.Reason, "GRANT rds_iam TO "+id)
	require.False(t, memberOf(t, b, b.users.Owner, provision.IAMRole))
	require.False(t, memberOf(t, b, b.users.Owner, "idempotency_owner"))

	// An operator's grant of one of the project's roles (an API's user
	// reading the archive) does not make the user the deploy's.
	_, err = admin.Exec(ctx, "GRANT idempotency_reader TO "+id)
	require.NoError(t, err)
	owner2 := "owner2_" + randomSuffix()
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+owner2) })
	resp = b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p["WriterUser"] = b.users.Owner; p["OwnerUser"] = owner2 }))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "no deploy made it")
	require.False(t, memberOf(t, b, b.users.Owner, provision.IAMRole))

	_, err = admin.Exec(ctx, "GRANT rds_iam TO "+id)
	require.NoError(t, err)
	resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, b.users.Owner, "idempotency_owner"))
}

// Not parallel: rds_iam is cluster-wide. CloudFormation's rollback of an
// Update refused for naming another application's user sends the refused
// properties as the previous ones: that user is "dropped", and its role,
// one an operator granted by hand (a Redis archive pool's user, which signs
// in with a password), was revoked. No deploy made it (it does not hold
// rds_iam): its roles are left alone.
func TestTheRollbackOfARefusedUpdateKeepsAnOperatorsGrant(t *testing.T) {
	ctx := context.Background()
	admin, b := setupWithRDSIAM(t)
	var err error
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	app := "redis_archiver_" + randomSuffix()
	id := pgx.Identifier{app}.Sanitize()
	for _, stmt := range []string{"CREATE ROLE " + id + " LOGIN PASSWORD 'app-secret'", "GRANT idempotency_sweeper TO " + id} {
		_, err = admin.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+id) })

	mistaken := func(p map[string]any) { p["SweeperUser"] = app }
	resp = b.invoke(b.transition(t, nil, mistaken))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "no deploy made it")
	require.True(t, memberOf(t, b, app, "idempotency_sweeper"), "the refused Update changed nothing")

	resp = b.invoke(b.transition(t, mistaken, nil)) // the rollback
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.False(t, memberOf(t, b, app, provision.IAMRole))
	require.True(t, memberOf(t, b, app, "idempotency_sweeper"), "the rollback revoked the operator's grant")
	require.True(t, memberOf(t, b, b.users.Sweeper, "idempotency_sweeper"), "the sweeper's own user keeps its role")
}

// setupWithRDSIAM is setup on a server with rds_iam, as RDS has, and a
// connection of the cluster's test user. Its tests are not parallel:
// rds_iam is cluster-wide.
func setupWithRDSIAM(t *testing.T) (*pgx.Conn, bundle) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	b := setup(t)
	_, err = admin.Exec(ctx, "CREATE ROLE rds_iam NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS rds_iam") })
	return admin, b
}
