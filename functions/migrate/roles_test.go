package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// An Update that moves user names between functions leaves each user with
// its new function's role alone: swapping the sweeper's and the reader's
// users must not leave the lookup function's user able to delete live keys,
// nor moving the owner's name leave another function running DDL.
func TestAnUpdateThatMovesUserNamesRevokesTheirOldRoles(t *testing.T) {
	t.Parallel()
	// GIVEN a deployed stack
	b := setup(t)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	// WHEN an Update swaps the sweeper's and the reader's users, and gives
	// the writer's name to the owner and the owner's to the writer
	resp = b.invoke(b.update(t, func(props map[string]any) {
		props["SweeperUser"], props["ReaderUser"] = b.users.Reader, b.users.Sweeper
		props["OwnerUser"], props["WriterUser"] = b.users.Writer, b.users.Owner
	}))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	// THEN each user holds exactly its new role
	for user, role := range map[string]string{
		b.users.Sweeper: schema.ReaderRole, b.users.Reader: schema.SweeperRole,
		b.users.Owner: schema.WriterRole, b.users.Writer: schema.OwnerRole,
	} {
		for _, r := range []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole} {
			require.Equal(t, r == role, memberOf(t, b, user, r), "%s in %s", user, r)
		}
	}
	// AND the lookup function's new user cannot delete live keys
	reader := b.db.NewPool(t, dbtest.AsRole(b.users.Sweeper))
	_, err := reader.Exec(context.Background(), "DELETE FROM idempotency_keys")
	require.Error(t, err)
}

// A role the deploy never gave a name is left alone: an API that reads the
// archive with its live store's user (examples/charges does) holds
// idempotency_reader by an operator's grant, and a redeploy must not take
// it away (every archive lookup would fail).
func TestARedeployKeepsARoleGrantedByHand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	_, err := b.db.Pool.Exec(context.Background(), "GRANT "+schema.ReaderRole+" TO "+b.users.Writer)
	require.NoError(t, err)

	resp = b.invoke(b.update(t, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	require.True(t, memberOf(t, b, b.users.Writer, schema.ReaderRole), "the operator's grant was revoked")
	require.True(t, memberOf(t, b, b.users.Writer, schema.WriterRole))
}

// transition is an Update event from the sample's properties changed by
// from to the sample's properties changed by to.
func (b bundle) transition(t *testing.T, from, to func(map[string]any)) []byte {
	t.Helper()
	var ev, old map[string]any
	require.NoError(t, json.Unmarshal(b.event(t, "migrate-cfn-create.json", to), &ev))
	require.NoError(t, json.Unmarshal(b.event(t, "migrate-cfn-create.json", from), &old))
	ev["RequestType"], ev["PhysicalResourceId"] = "Update", PhysicalID
	ev["OldResourceProperties"] = old["ResourceProperties"]
	out, err := json.Marshal(ev)
	require.NoError(t, err)
	return out
}

// A name dropped by one deploy loses its role then, not when a later deploy
// reuses it: that deploy's previous properties no longer name it. Renaming
// the sweeper's user S to S2, then giving S to the lookup function, must
// not leave the lookup function's user able to delete live keys.
func TestANameDroppedByOneDeployAndReusedByTheNextHoldsOnlyItsNewRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s2 := "sweeper2_" + randomSuffix()
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+s2) })
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)

	// WHEN one deploy renames the sweeper's user
	renamed := func(p map[string]any) { p["SweeperUser"] = s2 }
	resp := b.invoke(b.transition(t, nil, renamed))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	// THEN the old name holds no role of the deploy's (its LOGIN is kept)
	require.False(t, memberOf(t, b, b.users.Sweeper, schema.SweeperRole), "the dropped name keeps idempotency_sweeper")
	require.True(t, memberOf(t, b, s2, schema.SweeperRole))

	// WHEN the next deploy gives the old name to the lookup function
	resp = b.invoke(b.transition(t, renamed, func(p map[string]any) { p["SweeperUser"], p["ReaderUser"] = s2, b.users.Sweeper }))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	// THEN the lookup function's user holds idempotency_reader alone
	for _, r := range []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole} {
		require.Equal(t, r == schema.ReaderRole, memberOf(t, b, b.users.Sweeper, r), "%s in %s", b.users.Sweeper, r)
	}
	lookupUser := b.db.NewPool(t, dbtest.AsRole(b.users.Sweeper))
	_, err := lookupUser.Exec(context.Background(), "DELETE FROM idempotency_keys WHERE false")
	require.Error(t, err)
}

// The rollback of an Update that swapped two functions' users, over a
// schema that Update's package migrated further, still gives each user its
// own role back: the functions run as their old users again.
func TestARollbackOverANewerSchemaRestoresTheUsersRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, cfn.StatusSuccess, b.invoke(b.event(t, "migrate-cfn-create.json", nil)).Status)
	swapped := func(p map[string]any) { p["SweeperUser"], p["ReaderUser"] = b.users.Reader, b.users.Sweeper }
	resp := b.invoke(b.transition(t, nil, swapped))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	_, err := b.db.Pool.Exec(context.Background(), "UPDATE "+schema.VersionTable+" SET version = version + 1")
	require.NoError(t, err)

	resp = b.invoke(b.transition(t, swapped, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)

	for user, role := range map[string]string{b.users.Sweeper: schema.SweeperRole, b.users.Reader: schema.ReaderRole} {
		for _, r := range []string{schema.OwnerRole, schema.SweeperRole, schema.ReaderRole, schema.WriterRole} {
			require.Equal(t, r == role, memberOf(t, b, user, r), "%s in %s after the rollback", user, r)
		}
	}
}

// A Create or Update that leaves out a function's user fails the deploy
// instead of deploying that function with a user that does not exist.
func TestAMissingUserPropertyFailsTheDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, prop := range []string{"SweeperUser", "ReaderUser", "OwnerUser"} {
		resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { delete(p, prop) }))
		require.Equal(t, cfn.StatusFailed, resp.Status, prop)
		require.Contains(t, resp.Reason, "resource property "+prop+" is required")
		resp = b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { p[prop] = "" }))
		require.Equal(t, cfn.StatusFailed, resp.Status, prop)
	}
	require.EqualValues(t, 0, count(t, b, "SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)", []string{b.users.Sweeper, b.users.Reader, b.users.Owner}))
	// WriterUser stays optional.
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", func(p map[string]any) { delete(p, "WriterUser") }))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
}

// A project role a function's user holds through another role (an
// operator's group that holds the owner role) gives it that role's
// privileges as a direct grant does: the deploy fails, naming the chain,
// rather than answer SUCCESS with the lookup function able to write.
func TestAProjectRoleHeldThroughAGroupFailsTheDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	ops, team := "ops_"+randomSuffix(), "team_"+randomSuffix()
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+team+"; DROP ROLE IF EXISTS "+ops)
	})
	_, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+ops+" NOLOGIN; CREATE ROLE "+team+" NOLOGIN; GRANT "+schema.OwnerRole+" TO "+ops+"; GRANT "+ops+" TO "+team+"; GRANT "+team+" TO "+b.users.Reader)
	require.NoError(t, err)

	resp = b.invoke(b.update(t, nil))
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "user "+b.users.Reader+" holds "+schema.OwnerRole+" through "+team+" -> "+ops+" -> "+schema.OwnerRole)
	require.Contains(t, resp.Reason, "run REVOKE "+team+" FROM "+b.users.Reader)

	// AND once the operator revokes it, the deploy succeeds
	_, err = b.db.Pool.Exec(ctx, "REVOKE "+team+" FROM "+b.users.Reader)
	require.NoError(t, err)
	resp = b.invoke(b.update(t, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
}

// A user's own role held through a group is no other role: the deploy
// succeeds.
func TestItsOwnRoleHeldThroughAGroupIsNoOtherRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	resp := b.invoke(b.event(t, "migrate-cfn-create.json", nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
	readers := "readers_" + randomSuffix()
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+readers) })
	_, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+readers+" NOLOGIN; GRANT "+schema.ReaderRole+" TO "+readers+"; GRANT "+readers+" TO "+b.users.Reader)
	require.NoError(t, err)
	resp = b.invoke(b.update(t, nil))
	require.Equal(t, cfn.StatusSuccess, resp.Status, resp.Reason)
}
