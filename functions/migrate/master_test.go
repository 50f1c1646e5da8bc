package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/provision"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// setupAsMaster is setup with a migrating user like RDS's master user: not a
// superuser, CREATEROLE, owner of the schema, and, on PostgreSQL 16 and
// later, holding what the creator of the group roles holds (see
// asTheirCreator).
func setupAsMaster(t *testing.T) (bundle, string) {
	t.Helper()
	return setupAsMasterWith(t, asTheirCreator)
}

// asTheirCreator gives master what a role's creator holds since PostgreSQL 16
// (ADMIN, neither INHERIT nor SET) on each group role, as the RDS master user
// holds them after the first deploy created them. The group roles are the
// test cluster's (see setupAsMasterWith).
func asTheirCreator(t *testing.T, admin *pgx.Conn, master string, _ provision.Users) {
	t.Helper()
	if serverVersion(t, admin) < 160000 {
		return // CREATEROLE may grant any role that is no superuser
	}
	for _, role := range groupRoles {
		stmt := "GRANT " + role + " TO " + master + " WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"
		_, err := execRetryingDeadlocks(context.Background(), admin, stmt)
		require.NoError(t, err, stmt)
	}
}

var groupRoles = []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole}

// asUpgradedFrom15 leaves master and users as a deploy on PostgreSQL 15
// left them, seen after an upgrade to 16 or later: roles.sql's grant of the
// owner role to master (INHERIT and SET, no ADMIN: a creator held nothing on
// 15), and each user holding its role by a grant pg_upgrade records as the
// bootstrap superuser's.
func asUpgradedFrom15(t *testing.T, admin *pgx.Conn, master string, users provision.Users) {
	t.Helper()
	stmts := []string{"GRANT idempotency_owner TO " + master}
	for user, role := range userRoles(users) {
		stmts = append(stmts, "CREATE ROLE "+user+" LOGIN", "GRANT "+role+" TO "+user)
	}
	for _, stmt := range stmts {
		_, err := execRetryingDeadlocks(context.Background(), admin, stmt)
		require.NoError(t, err, stmt)
	}
}

func serverVersion(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var v int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&v))
	return v
}

// setupAsMasterWith is setupAsMaster with grant giving the master user its
// memberships, as the test superuser, before the deploy's users are made.
func setupAsMasterWith(t *testing.T, grant func(t *testing.T, admin *pgx.Conn, master string, users provision.Users)) (bundle, string) {
	t.Helper()
	ctx := context.Background()
	base := dbtest.URL(t)
	suffix := randomSuffix()
	name, master := "test_"+suffix, "master_"+suffix
	admin, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	// The group roles are the cluster's: made here by the test superuser
	// where no test made them yet, so that no master user is their creator.
	for _, role := range groupRoles {
		_, err := execRetryingDeadlocks(ctx, admin, `DO $$ BEGIN CREATE ROLE `+role+` NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`)
		require.NoError(t, err, role)
	}
	for _, stmt := range []string{
		"CREATE ROLE " + master + " LOGIN CREATEROLE",
		"CREATE SCHEMA " + name + " AUTHORIZATION " + master,
	} {
		_, err = execRetryingDeadlocks(ctx, admin, stmt)
		require.NoError(t, err, stmt)
	}
	users := provision.Users{Sweeper: "sweeper_" + suffix, Reader: "reader_" + suffix, Owner: "owner_" + suffix, Writer: "api_" + suffix}
	grant(t, admin, master, users)
	admin.Close(ctx)
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

// Since PostgreSQL 16 CREATEROLE no longer lets a user grant a role it did
// not create: a master user whose group roles another user made (by hand,
// another tool) fails the deploy with what to run, and the deploy succeeds
// once that is run. Before 16, CREATEROLE suffices.
func TestAMasterUserThatDidNotCreateTheRolesIsToldWhatToGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, me := setupAsMasterWith(t, func(*testing.T, *pgx.Conn, string, provision.Users) {})
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	if serverVersion(t, admin) < 160000 {
		require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
		return
	}
	require.Equal(t, cfn.StatusFailed, resp.Status)
	remedy := "GRANT idempotency_owner, idempotency_sweeper, idempotency_reader, idempotency_writer TO " + me + " WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"
	require.Contains(t, resp.Reason, remedy)
	require.EqualValues(t, 0, count(t, b, "SELECT count(*) FROM pg_roles WHERE rolname = $1", b.users.Sweeper), "a failed deploy leaves no user behind")

	// A master user that holds the owner role (granted by hand) but may
	// grant no role is told the same when it comes to the users.
	_, err = execRetryingDeadlocks(ctx, admin, "GRANT idempotency_owner TO "+me)
	require.NoError(t, err)
	resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, remedy)
	require.EqualValues(t, 0, count(t, b, "SELECT count(*) FROM pg_roles WHERE rolname = $1", b.users.Sweeper), "a failed deploy leaves no user behind")

	_, err = execRetryingDeadlocks(ctx, admin, remedy)
	require.NoError(t, err)
	resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	for user, role := range userRoles(b.users) {
		require.True(t, memberOf(t, b, user, role), "%s in %s", user, role)
	}
}

// A database upgraded from PostgreSQL 15 to 16 or later: its master user
// created the roles and users on 15, where a role's creator held nothing,
// so it holds the owner role by roles.sql's grant and no role's ADMIN
// OPTION, and the users hold their roles by grants recorded as the
// bootstrap superuser's. Its deploys grant nothing again, and succeed. A
// new name needs the master user to hold the roles' ADMIN OPTION, and the
// old name's grant revoked by its grantor: each failure says what to run.
func TestAnUpgradedMasterUserWithoutAdminStillDeploys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, me := setupAsMasterWith(t, asUpgradedFrom15)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	resp = b.invoke(b.transition(t, nil, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	for user, role := range userRoles(b.users) {
		require.True(t, memberOf(t, b, user, role), "%s in %s", user, role)
	}

	// A new name for the sweeper's user.
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	renamed := "sweeper2_" + randomSuffix()
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), "DROP OWNED BY "+renamed)
		_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+renamed)
	})
	rename := func(p map[string]any) { p["SweeperUser"] = renamed }
	resp = b.invoke(b.transition(t, nil, rename))
	if serverVersion(t, admin) >= 160000 {
		require.Equal(t, cfn.StatusFailed, resp.Status)
		remedy := "GRANT idempotency_owner, idempotency_sweeper, idempotency_reader, idempotency_writer TO " + me + " WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"
		require.Contains(t, resp.Reason, remedy)
		_, err = execRetryingDeadlocks(ctx, admin, remedy)
		require.NoError(t, err)

		resp = b.invoke(b.transition(t, nil, rename))
		require.Equal(t, cfn.StatusFailed, resp.Status)
		var super string
		require.NoError(t, admin.QueryRow(ctx, "SELECT rolname FROM pg_roles WHERE oid = 10").Scan(&super))
		require.Contains(t, resp.Reason, "still a member of idempotency_sweeper after REVOKE")
		require.Contains(t, resp.Reason, "granted by "+super)
		require.Contains(t, resp.Reason, "REVOKE idempotency_sweeper FROM "+b.users.Sweeper+" GRANTED BY <grantor>")
		_, err = execRetryingDeadlocks(ctx, admin, "REVOKE idempotency_sweeper FROM "+b.users.Sweeper+" GRANTED BY "+super)
		require.NoError(t, err)
		resp = b.invoke(b.transition(t, nil, rename))
	}
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, renamed, schema.SweeperRole))
	require.False(t, memberOf(t, b, b.users.Sweeper, schema.SweeperRole), "the old name keeps no role")
}

// An owner user that lost what ownerPool needs (on 16 and later the SET
// option of its membership, before that the membership) is given it again
// before the migrations run as it, not found wanting by them on every deploy.
func TestAnOwnerUserThatLostItsRoleIsRepairedBeforeTheMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, me := setupAsMaster(t)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stmts := []string{"REVOKE idempotency_owner FROM " + b.users.Owner}
	if serverVersion(t, admin) >= 160000 {
		stmts = []string{
			"REVOKE idempotency_owner FROM " + b.users.Owner + " GRANTED BY " + me,
			"GRANT idempotency_owner TO " + b.users.Owner + " WITH INHERIT TRUE, SET FALSE",
		}
	}
	for _, stmt := range stmts {
		_, err := execRetryingDeadlocks(ctx, admin, stmt)
		require.NoError(t, err, stmt)
	}
	require.False(t, maySetOwnerRole(t, admin, b.users.Owner), "the premise: the owner user may not SET ROLE idempotency_owner")

	resp := b.invoke(b.transition(t, nil, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, maySetOwnerRole(t, admin, b.users.Owner))
}

// The master user that created the roles swaps two users' names: it may
// revoke its own grants.
func TestAMasterUserSwapsTwoUsersNames(t *testing.T) {
	t.Parallel()
	b, _ := setupAsMaster(t)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	swap := func(p map[string]any) { p["SweeperUser"], p["ReaderUser"] = b.users.Reader, b.users.Sweeper }
	resp := b.invoke(b.transition(t, nil, swap))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.False(t, memberOf(t, b, b.users.Sweeper, schema.SweeperRole))
	require.True(t, memberOf(t, b, b.users.Sweeper, schema.ReaderRole))
	require.False(t, memberOf(t, b, b.users.Reader, schema.ReaderRole))
	require.True(t, memberOf(t, b, b.users.Reader, schema.SweeperRole))
}

// userRoles maps each of users to the group role the deploy gives it.
func userRoles(users provision.Users) map[string]string {
	return map[string]string{users.Sweeper: schema.SweeperRole, users.Reader: schema.ReaderRole, users.Owner: schema.OwnerRole, users.Writer: schema.WriterRole}
}

// The owner user's membership stripped of what ownerPool needs by the
// master user's own grant (on 16 and later GRANT ... WITH SET FALSE GRANTED
// BY the master, which a GRANT without options leaves as it is; before 16,
// the membership revoked), after the owner user planted a
// pg_advisory_lock(double precision) for tern's lock: the deploy gives the
// owner user SET again and migrates as it. The migrations never fall back
// to the master user, whose run of the planted function would give the
// owner user CREATEROLE.
func TestAnOwnerUserWithoutSetNeverMakesTheMasterUserMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, master, owner := deployedAsMaster(t)
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	plantTernLock(t, owner, b.users.Owner)
	strip := "REVOKE idempotency_owner FROM " + b.users.Owner
	if serverVersion(t, admin) >= 160000 {
		strip = "GRANT idempotency_owner TO " + b.users.Owner + " WITH SET FALSE GRANTED BY " + master
	}
	_, err = execRetryingDeadlocks(ctx, admin, strip)
	require.NoError(t, err, strip)

	resp := redeploy(t, b, b.transition(t, nil, nil), nil)
	require.False(t, gainedCreateRole(t, owner, b.users.Owner),
		"the owner user %s gained CREATEROLE: tern ran as the master user %s", b.users.Owner, master)
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, maySetOwnerRole(t, admin, b.users.Owner), "the deploy gave the owner user SET again")
}

// Upgraded from 15 (the master user holds no ADMIN), the new sweeper name
// already holds its role (granted by hand), so nothing is granted and the
// first refusal is the REVOKE of the old name's grant: it says what to run,
// the grantor's REVOKE ... GRANTED BY among it.
func TestARefusedRevokeSaysWhatToRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, me := setupAsMasterWith(t, asUpgradedFrom15)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	renamed := "sweeper2_" + randomSuffix()
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+renamed)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+renamed)
	})
	for _, stmt := range []string{"CREATE ROLE " + renamed + " LOGIN", "GRANT idempotency_sweeper TO " + renamed} {
		_, err = execRetryingDeadlocks(ctx, admin, stmt)
		require.NoError(t, err, stmt)
	}
	resp := b.invoke(b.transition(t, nil, func(p map[string]any) { p["SweeperUser"] = renamed }))
	if serverVersion(t, admin) < 160000 {
		require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason) // CREATEROLE may revoke any grant
		require.False(t, memberOf(t, b, b.users.Sweeper, schema.SweeperRole))
		return
	}
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "may not revoke that role")
	require.Contains(t, resp.Reason, "GRANT idempotency_owner, idempotency_sweeper, idempotency_reader, idempotency_writer TO "+me+" WITH ADMIN TRUE, INHERIT FALSE, SET FALSE")
	require.Contains(t, resp.Reason, "REVOKE idempotency_sweeper FROM "+b.users.Sweeper+" GRANTED BY <grantor>")
	require.True(t, memberOf(t, b, b.users.Sweeper, schema.SweeperRole), "the failed deploy changed nothing")
}

// maySetOwnerRole says whether user may SET ROLE idempotency_owner (on
// PostgreSQL 16 and later its membership's SET option says).
func maySetOwnerRole(t *testing.T, admin *pgx.Conn, user string) bool {
	t.Helper()
	var may bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT pg_has_role($1, 'idempotency_owner', 'MEMBER') AND (current_setting('server_version_num')::int < 160000 OR pg_has_role($1, 'idempotency_owner', 'SET'))", user).Scan(&may))
	return may
}

// execRetryingDeadlocks runs a role statement of the test's own, again when
// PostgreSQL chose it as a deadlock's victim: roles are the cluster's, and
// the tests beside this one grant and revoke the same roles in their
// migrations.
func execRetryingDeadlocks(ctx context.Context, conn *pgx.Conn, sql string) (pgconn.CommandTag, error) {
	for attempt := 1; ; attempt++ {
		tag, err := conn.Exec(ctx, sql)
		if database.SQLState(err) != database.CodeDeadlockDetected || attempt == 5 {
			return tag, err
		}
	}
}
