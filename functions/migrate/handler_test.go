package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/provision"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// cloudFormation stands in for the pre-signed S3 URL a custom resource
// answers: it records every response PUT to it.
type cloudFormation struct {
	URL string
	mu  sync.Mutex
	got []cfn.Response
}

func newCloudFormation(t *testing.T) *cloudFormation {
	t.Helper()
	c := &cloudFormation{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var resp cfn.Response
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPut || json.Unmarshal(body, &resp) != nil {
			http.Error(w, "want a PUT of a JSON response", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.got = append(c.got, resp)
		c.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL + "/response"
	return c
}

// last returns the one response received since the previous call.
func (c *cloudFormation) last(t *testing.T) cfn.Response {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.got, 1, "CloudFormation gets exactly one answer")
	r := c.got[0]
	c.got = nil
	return r
}

// bundle is one test's database, users and fake CloudFormation.
type bundle struct {
	db     *dbtest.DB
	users  provision.Users
	cfn    *cloudFormation
	stdout *testenv.SyncBuffer
	stderr *testenv.SyncBuffer
	invoke func(event []byte) cfn.Response
}

// setup gives a test an empty schema (nothing migrated: the custom resource
// does that), login user names of its own (roles are cluster-wide), and the
// handler wrapped as in main.
func setup(t *testing.T) bundle {
	t.Helper()
	ctx := context.Background()
	base := dbtest.URL(t)
	suffix := randomSuffix()
	name := "test_" + suffix
	admin, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	admin.Close(ctx)
	require.NoError(t, err)
	users := provision.Users{Sweeper: "sweeper_" + suffix, Reader: "reader_" + suffix, Owner: "owner_" + suffix, Writer: "api_" + suffix}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("clean up: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, u := range []string{users.Sweeper, users.Reader, users.Owner, users.Writer} {
			id := pgx.Identifier{u}.Sanitize()
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+id)
			_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+id)
		}
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	db := &dbtest.DB{Schema: name, URL: dbtest.WithSearchPath(t, base, name)}
	db.Pool = db.NewPool(t)

	env, stdout, stderr := testenv.FunctionEnv(t, db, nil)
	h := lambda.NewHandler(lambdaHandler(env))
	c := newCloudFormation(t)
	b := bundle{db: db, users: users, cfn: c, stdout: stdout, stderr: stderr}
	b.invoke = func(event []byte) cfn.Response {
		t.Helper()
		_, err := h.Invoke(testenv.Invocation("req-"+suffix), event)
		require.NoError(t, err, "the handler itself never fails: failures are answers")
		return c.last(t)
	}
	return b
}

func randomSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// event returns the fixture with this test's response URL and users, and
// changes applied to its properties.
func (b bundle) event(t *testing.T, fixture string, change func(props map[string]any)) []byte {
	t.Helper()
	var ev map[string]any
	require.NoError(t, json.Unmarshal(testenv.Event(t, fixture), &ev))
	ev["ResponseURL"] = b.cfn.URL
	props := ev["ResourceProperties"].(map[string]any)
	props["SweeperUser"], props["ReaderUser"], props["OwnerUser"] = b.users.Sweeper, b.users.Reader, b.users.Owner
	if b.users.Writer != "" {
		props["WriterUser"] = b.users.Writer
	}
	if change != nil {
		change(props)
	}
	out, err := json.Marshal(ev)
	require.NoError(t, err)
	return out
}

func count(t *testing.T, b bundle, sql string, args ...any) int64 {
	t.Helper()
	return dbtest.Count(t, b.db.Pool, sql, args...)
}

// update is the sample Create event as an Update of the resource that event
// created, its properties changed by mutate.
func (b bundle) update(t *testing.T, mutate func(map[string]any)) []byte {
	t.Helper()
	return b.transition(t, nil, mutate)
}

func memberOf(t *testing.T, b bundle, user, role string) bool {
	t.Helper()
	// Since PostgreSQL 16 a user may be a member by several grants (a
	// role's creator holds ADMIN by one, and grants itself INHERIT and SET
	// by another).
	return count(t, b, "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member WHERE r.rolname = $1 AND u.rolname = $2", role, user) > 0
}

func TestCreateMigratesCreatesUsersAndPartitions(t *testing.T) {
	t.Parallel()
	// GIVEN an empty schema and the Create event CloudFormation sends
	b := setup(t)

	// WHEN the function handles it
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))

	// THEN CloudFormation is told it succeeded, for the stable physical id
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.Equal(t, PhysicalID, resp.PhysicalResourceID)
	require.Equal(t, "MigrationSchema8F783001", resp.LogicalResourceID)
	require.Equal(t, "5d478078-13e9-baf0-464a-7ef285ecc786", resp.RequestID)
	require.EqualValues(t, schema.LatestVersion(), resp.Data["SchemaVersion"])
	require.EqualValues(t, 5, resp.Data["PartitionsCreated"])

	// AND the schema is migrated and partitioned
	require.EqualValues(t, 5, count(t, b, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
	require.Len(t, testenv.Lines(b.stdout.String(), `"idempotency_archive_newest_partition_days"`), 1, "the partition run's metrics, so the lead alarm has data from the deploy on")

	// AND each function has a login user with its least-privilege role
	for user, role := range map[string]string{b.users.Sweeper: schema.SweeperRole, b.users.Reader: schema.ReaderRole, b.users.Owner: schema.OwnerRole,
		b.users.Writer: schema.WriterRole} {
		require.EqualValues(t, 1, count(t, b, "SELECT count(*) FROM pg_roles WHERE rolname = $1 AND rolcanlogin AND NOT rolsuper", user), user)
		require.True(t, memberOf(t, b, user, role), "%s is granted %s", user, role)
	}
	require.False(t, memberOf(t, b, b.users.Reader, schema.SweeperRole), "no user gets another function's role")

	// AND the users can do their function's work, and no more
	ctx := context.Background()
	owner := b.db.NewPool(t, dbtest.AsRole(b.users.Owner))
	m, err := partition.NewManager(owner, partition.Config{LeadMonths: 6}, nil)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err, "the owner user runs the partition manager")
	require.Len(t, res.Created, 3)
	reader := b.db.NewPool(t, dbtest.AsRole(b.users.Reader))
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_keys")
	require.ErrorContains(t, err, "permission denied", "the reader has nothing on the live table")
	sweeper := b.db.NewPool(t, dbtest.AsRole(b.users.Sweeper))
	_, err = sweeper.Exec(ctx, "DELETE FROM idempotency_keys WHERE expires_at < now()")
	require.NoError(t, err)

	// WHEN the next deploy sends an Update
	resp = b.invoke(b.update(t, func(props map[string]any) { props["PackageSha256"] = strings.Repeat("ab", 32) }))
	// THEN it succeeds and has nothing left to do
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.EqualValues(t, 0, resp.Data["PartitionsCreated"])
}

func TestFailuresAreReportedWithTheirReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, tc := range map[string]struct {
		change func(map[string]any)
		want   string
	}{
		"misspelt property": {func(p map[string]any) { p["SweeperUsr"] = "x" }, `unknown resource property "SweeperUsr"`},
		"bad user name":     {func(p map[string]any) { p["ReaderUser"] = "Robert'); DROP TABLE" }, `invalid database user name "Robert'); DROP TABLE"`},
		"shared user":       {func(p map[string]any) { p["ReaderUser"] = p["SweeperUser"] }, "each function needs its own user"},
		"group role":        {func(p map[string]any) { p["OwnerUser"] = schema.OwnerRole }, "that is a group role"},
		"not a string":      {func(p map[string]any) { p["LeadMonths"] = 3 }, "LeadMonths must be a string, got a number"},
		// In JSON's terms, never Go's ([]interface {}, <nil>).
		"an array":  {func(p map[string]any) { p["WriterUser"] = []any{"a"} }, "WriterUser must be a string, got an array"},
		"an object": {func(p map[string]any) { p["WriterUser"] = map[string]any{} }, "WriterUser must be a string, got an object"},
		"null":      {func(p map[string]any) { p["WriterUser"] = nil }, "WriterUser must be a string, got null"},
		"a boolean": {func(p map[string]any) { p["WriterUser"] = true }, "WriterUser must be a string, got a boolean"},
	} {
		t.Run(name, func(t *testing.T) {
			// GIVEN a Create event the function must refuse
			// WHEN it is handled
			resp := b.invoke(b.event(t, "migrate-cfn-create.json", tc.change))
			// THEN CloudFormation is told it failed, why, and for which
			// resource (a failure without a physical id would show
			// "Invalid PhysicalResourceId" instead of the reason)
			require.Equal(t, cfn.StatusFailed, resp.Status)
			require.Contains(t, resp.Reason, tc.want)
			require.Equal(t, PhysicalID, resp.PhysicalResourceID)
		})
	}
	// AND nothing was migrated by the refused events
	require.EqualValues(t, 0, count(t, b, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"))

	// A reason longer than CloudFormation shows is cut between characters
	// (cut inside one, the stack events showed U+FFFD).
	for _, pad := range []string{"a", "ab", "abc"} {
		resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p[pad+strings.Repeat("é", 800)] = "x" }))
		require.Equal(t, cfn.StatusFailed, resp.Status)
		require.NotContains(t, resp.Reason, "\uFFFD", "a reason cut inside a character (its JSON shows U+FFFD)")
		require.True(t, strings.HasSuffix(resp.Reason, "é... (the function's log has the rest)"), resp.Reason)
	}
}

// CloudFormation passes the properties it reads itself on in every event:
// ServiceToken, and the ServiceTimeout the stack sets (as a string, or a
// number). A Create with them is what every deploy sends.
func TestThePropertiesCloudFormationReadsAreAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, timeout := range []any{"1200", 1200} {
		resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) {
			require.Contains(t, p, "ServiceToken")
			require.Equal(t, "1200", p["ServiceTimeout"], "the sample event carries what the stack sets (infra/stack/migration.go)")
			p["ServiceTimeout"] = timeout
		}))
		require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	}
}

// An answer that cannot be delivered fails the invocation, within the
// function's time, with an error (which the Lambda runtime logs) that does
// not carry the response URL's signature: with it, anyone who reads the log
// could answer for the function.
func TestAnUndeliverableAnswerLeaksNoSignature(t *testing.T) {
	t.Parallel()
	env, stdout, stderr := testenv.FunctionEnv(t, &dbtest.DB{URL: "postgres://nobody@127.0.0.1:1/none"}, nil)
	h := lambda.NewHandler(lambdaHandler(env))
	var ev map[string]any
	require.NoError(t, json.Unmarshal(testenv.Event(t, "migrate-cfn-delete.json"), &ev))
	ev["ResponseURL"] = "http://127.0.0.1:1/response?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=SECRETSIG"
	payload, _ := json.Marshal(ev)
	out, err := h.Invoke(testenv.Invocation("req-unreachable"), payload)
	require.Error(t, err)
	require.Contains(t, err.Error(), "answer CloudFormation at http://127.0.0.1:1/response")
	for _, text := range []string{err.Error(), string(out), stdout.String(), stderr.String()} {
		require.NotContains(t, text, "SECRETSIG")
		require.NotContains(t, text, "AKIAEXAMPLE")
	}
}

// A user name that is the migrating user or another privileged role is never
// taken over: granting it rds_iam would turn off its password sign-in (on
// RDS the master user would be locked out), and no function may run with
// its powers.
func TestAPrivilegedUserIsNeverTakenOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var me string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT current_user").Scan(&me))
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p["OwnerUser"] = me }))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "is the migrating user or a privileged role")

	// Roles that reach power through a membership, however indirect.
	ctx := context.Background()
	suffix := randomSuffix()
	powerful := "powerful_" + suffix
	for _, stmt := range []string{
		"CREATE ROLE " + powerful + " NOLOGIN CREATEROLE",
		"CREATE ROLE via_member_" + suffix + " LOGIN IN ROLE " + powerful,
		"CREATE ROLE via_superuser_" + suffix + " LOGIN IN ROLE " + me,
		"CREATE ROLE replicator_" + suffix + " LOGIN REPLICATION",
		"CREATE ROLE reads_all_" + suffix + " LOGIN IN ROLE pg_read_all_data",
	} {
		_, err := b.db.Pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		for _, r := range []string{"via_member_", "via_superuser_", "replicator_", "reads_all_", "powerful_"} {
			_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+r+suffix)
		}
	})
	for _, name := range []string{"via_member_", "via_superuser_", "replicator_", "reads_all_"} {
		resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p["ReaderUser"] = name + suffix }))
		require.Equal(t, cfn.StatusFailed, resp.Status, name)
		require.Contains(t, resp.Reason, "privileged role", name)
		require.False(t, memberOf(t, b, name+suffix, schema.ReaderRole), "%s was granted nothing", name)
	}
}

func TestDatabaseFailureFailsTheDeployWithTheReason(t *testing.T) {
	t.Parallel()
	// GIVEN a function whose search_path names a schema that does not exist
	db := &dbtest.DB{URL: dbtest.WithSearchPath(t, dbtest.URL(t), "no_such_schema_"+randomSuffix())}
	env, _, _ := testenv.FunctionEnv(t, db, nil)
	h := lambda.NewHandler(lambdaHandler(env))
	c := newCloudFormation(t)
	b := bundle{cfn: c, users: provision.Users{Sweeper: "s_" + randomSuffix(), Reader: "r_" + randomSuffix(), Owner: "o_" + randomSuffix()}}
	// WHEN the Create event is handled
	_, err := h.Invoke(testenv.Invocation("req-db"), b.event(t, "migrate-cfn-create.json", nil))
	require.NoError(t, err)
	// THEN the deploy fails with the database's reason
	resp := c.last(t)
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "no schema on the search_path exists")
}

func TestDeleteKeepsTheArchive(t *testing.T) {
	t.Parallel()
	// GIVEN a function whose database is unreachable
	env, _, _ := testenv.FunctionEnv(t, &dbtest.DB{URL: "postgres://nobody@127.0.0.1:1/none"}, nil)
	h := lambda.NewHandler(lambdaHandler(env))
	c := newCloudFormation(t)
	var ev map[string]any
	require.NoError(t, json.Unmarshal(testenv.Event(t, "migrate-cfn-delete.json"), &ev))
	ev["ResponseURL"] = c.URL
	payload, _ := json.Marshal(ev)
	// WHEN the stack deletes the resource
	_, err := h.Invoke(testenv.Invocation("req-del"), payload)
	require.NoError(t, err)
	// THEN it succeeds without touching the database (the archive is
	// permanent; a stack delete must never hang on it)
	resp := c.last(t)
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.Equal(t, PhysicalID, resp.PhysicalResourceID)
}

// TestRDSIAMIsGrantedWhereItExists is not parallel: rds_iam is cluster-wide,
// and this test creates and drops it.
func TestRDSIAMIsGrantedWhereItExists(t *testing.T) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	var exists bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_iam')").Scan(&exists))
	require.False(t, exists, "this test creates rds_iam itself: run it on a plain PostgreSQL (make test starts one), not on RDS")

	// GIVEN a plain PostgreSQL, which has no rds_iam
	b := setup(t)
	// WHEN the users are created
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	// THEN that is no failure
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	// GIVEN a server with rds_iam, as RDS has
	_, err = admin.Exec(ctx, "CREATE ROLE rds_iam NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS rds_iam") })
	// WHEN the next deploy (an Update, whose previous properties name the
	// users) runs
	resp = b.invoke(b.update(t, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	// THEN every function's user may sign in with IAM
	for _, u := range []string{b.users.Sweeper, b.users.Reader, b.users.Owner} {
		require.True(t, memberOf(t, b, u, provision.IAMRole), u)
	}
	// AND a Create naming them (no previous properties) finds them holding
	// rds_iam, made by a deploy
	resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
}

// A rollback runs the older package against the schema the failed deploy
// migrated further: it must answer SUCCESS (migrations only add), or the
// stack is stuck in UPDATE_ROLLBACK_FAILED. A Create against a newer schema
// fails, naming both versions.
func TestARollbackOverANewerSchemaSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	_, err := b.db.Pool.Exec(context.Background(), "UPDATE "+schema.VersionTable+" SET version = 99")
	require.NoError(t, err)

	resp := b.invoke(b.event(t, "migrate-cfn-update.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.EqualValues(t, 99, resp.Data["SchemaVersion"])
	require.Contains(t, b.stdout.String()+b.stderr.String(), "the schema is newer than this package")

	resp = b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, fmt.Sprintf("it is at version 99, this code knows versions up to %d", schema.LatestVersion()))
}
