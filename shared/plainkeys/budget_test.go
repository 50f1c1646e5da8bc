package plainkeys_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/plainkeys"
)

// Each later statement of a batch's transaction is bounded by what is left
// of the budget. Bounded by what was left when the transaction began, a
// second statement that waited on a lock after a first that used more than a
// second of it outlasted the context's backstop (deadline + 1 s); pgx then
// closed the connection, and Index, documented as not failing when out of
// budget, failed, with every later step of the run on that connection.
func TestABatchCutByTheBudgetKeepsTheConnection(t *testing.T) {
	db, _ := setup(t)
	ctx := context.Background()
	key := "idem:v1:plain-000"
	var expired time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT expired_at FROM idempotency_key_archive WHERE scoped_key = $1", key).Scan(&expired))

	// T1: an uncommitted record of the same (hash, expiry): indexSQL's
	// ON CONFLICT waits for it.
	t1, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	_, err = t1.Exec(ctx, "INSERT INTO idempotency_archive_plain_keys (key_hash, expired_at) VALUES (idempotency_key_hash($1), $2)", key, expired)
	require.NoError(t, err)
	// T2: holds the pending row: the advance waits for it.
	t2, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t2.Rollback(ctx) }()
	_, err = t2.Exec(ctx, "SELECT 1 FROM idempotency_archive_plain_keys_pending FOR UPDATE")
	require.NoError(t, err)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		time.Sleep(1500 * time.Millisecond)
		_ = t1.Commit(ctx)
	}()
	start := time.Now()
	p, err := plainkeys.Index(ctx, conn.Conn(), plainkeys.DefaultBatch, plainkeys.Limits{LockTimeout: 5 * time.Second}, time.Now().Add(2*time.Second))
	<-committed // before t1's deferred Rollback
	require.NoError(t, err, "after %s: %+v", time.Since(start), p)
	require.False(t, conn.Conn().IsClosed())
	require.Less(t, time.Since(start), 3*time.Second, "the budget's end, not the lock's")
	require.Positive(t, p.RangesLeft, "the batch was rolled back: its range still waits")
}
