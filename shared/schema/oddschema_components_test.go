package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
	"github.com/idemarchive/idemarchive/shared/verify"
)

// Components the existing test leaves out, in a schema whose name needs
// quoting: the sweeper creating a missing month (EnsureMonth), a partition
// attached by hand and adopted by a partitions run, the plain-key index of
// its pending rows, the unrecorded-partition report, verify, the
// least-privilege grants, and Mismatches.
func TestOddSchemaOtherComponents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, pool := migratedOddSchema(t)
	problems, err := schema.Mismatches(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, problems)

	now := time.Now().UTC()
	parts, err := partition.NewManager(pool, partition.Config{LeadMonths: 2, RetentionMonths: 120, Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = parts.Run(ctx, false)
	require.NoError(t, err)

	// A month the sweeper must create itself.
	old := time.Date(2021, 5, 10, 0, 0, 0, 0, time.UTC)
	dbtest.InsertLive(t, pool, dbtest.LiveRow{Key: "idem:v1:old-plain", Status: 201, CreatedAt: old.Add(-time.Hour), ExpiresAt: old})
	s, err := sweep.New(pool, sweep.Config{BatchSize: 10}, parts, nil)
	require.NoError(t, err)
	res, err := s.Run(ctx)
	require.NoError(t, err, "sweep creating a missing month")
	require.EqualValues(t, 1, res.Archived)

	// A month attached by hand, with a row, adopted by the next run.
	_, err = pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2019_01 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO idempotency_key_archive_2019_01 (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:byhand', '\x00', 201, '2019-01-02 00:00:00+00', '2019-01-03 00:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2019_01
		  FOR VALUES FROM ('2019-01-01 00:00:00+00') TO ('2019-02-01 00:00:00+00')`)
	require.NoError(t, err)
	un, err := partition.ListUnrecorded(ctx, pool)
	require.NoError(t, err, "list unrecorded")
	t.Logf("unrecorded before: %+v", un)
	_, err = parts.Run(ctx, false)
	require.NoError(t, err, "adopt a partition attached by hand")
	un, err = partition.ListUnrecorded(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, un)
	pc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer pc.Release()
	_, err = plainkeys.Index(ctx, pc.Conn(), 100, plainkeys.Limits{LockTimeout: time.Second}, time.Now().Add(time.Minute))
	require.NoError(t, err, "index pending plain keys")

	checks, err := verify.Run(ctx, pool, verify.Options{})
	require.NoError(t, err, "verify")
	for _, c := range checks {
		t.Logf("verify: %+v", c)
	}
}
