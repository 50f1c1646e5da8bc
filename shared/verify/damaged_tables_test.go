package verify_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The status check replaced by hand with one of the same name and another
// rule: the intact check (and migrate's shape check) must not pass it.
func TestASameNamedStatusCheckWithAnotherRuleFailsTheIntactCheck(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, err := db.Pool.Exec(context.Background(), `ALTER TABLE idempotency_keys
		DROP CONSTRAINT idempotency_keys_completed_has_status,
		ADD CONSTRAINT idempotency_keys_completed_has_status CHECK (state = 'completed' OR status_code IS NULL)`)
	require.NoError(t, err)
	c := checkNamed(t, db.Pool, "tables are as migrate made them")
	require.False(t, c.Pass, "a completed row without a status is now allowed, yet: %s", c.Figure)
	require.Contains(t, c.Figure, "idempotency_keys_completed_has_status")
}

// idempotency_writers dropped: the skip's proof and its triggers are gone
// (the live store cannot lease, lookups cannot bound a key). The check read
// only the tables that exist, and passed.
func TestAMissingWritersTableFailsTheIntactCheck(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, err := db.Pool.Exec(context.Background(), `DROP TABLE idempotency_writers CASCADE`)
	require.NoError(t, err)
	c := checkNamed(t, db.Pool, "tables are as migrate made them")
	require.False(t, c.Pass, "idempotency_writers is gone, yet: %s", c.Figure)
	require.Contains(t, c.Figure, "idempotency_writers is missing, and its trigger idempotency_writers_only_grow with it")
}

// idempotency_archive_plain_keys_pending dropped: the copy trigger it
// carried is gone with it, which the check says.
func TestAMissingPendingTableFailsTheIntactCheck(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, err := db.Pool.Exec(context.Background(), `DROP TABLE idempotency_archive_plain_keys_pending CASCADE`)
	require.NoError(t, err)
	c := checkNamed(t, db.Pool, "tables are as migrate made them")
	require.False(t, c.Pass, "idempotency_archive_plain_keys_pending is gone, yet: %s", c.Figure)
}
