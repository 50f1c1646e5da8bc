package main

import (
	"context"
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
