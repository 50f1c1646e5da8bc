package sweep_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A key whose expired in-flight row is released and registered again (a new
// life, not expired) while sweepers claim expired rows one at a time: the
// new row is never moved, and the old one ends in exactly one place, the
// archive, unless the release took it first.
func TestAKeyRegisteredAgainDuringABatchKeepsItsNewRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const keys, sweepers = 400, 3
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, created_at, expires_at, skew_ms)
		SELECT 'idem:v1:re-' || i, sha256(convert_to('old', 'UTF8')), now() - interval '25 hours', now() - interval '1 hour' + i * interval '1 ms', 0
		  FROM generate_series(1, $1) i`, keys)
	require.NoError(t, err)

	var released atomic.Int64
	var wg sync.WaitGroup
	var stop atomic.Bool
	for range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 1, InFlightGrace: 0}, nil, nil)
			for !stop.Load() {
				if _, err := s.Run(ctx); err != nil {
					t.Errorf("sweep: %v", err)
					return
				}
			}
		}()
	}
	// Live traffic: release the old row if it is still live, then register a
	// new life of the key, each in its own transaction.
	for i := 1; i <= keys; i++ {
		key := fmt.Sprintf("idem:v1:re-%d", i)
		tag, err := b.db.Pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE scoped_key = $1 AND state = 'in_flight' AND expires_at < now()`, key)
		require.NoError(t, err)
		released.Add(tag.RowsAffected())
		_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at, skew_ms)
			VALUES ($1, sha256(convert_to('new', 'UTF8')), now() + interval '1 hour', 0)`, key)
		require.NoError(t, err, key)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("released by traffic %d of %d", released.Load(), keys)

	require.EqualValues(t, keys, dbtest.Count(t, b.db.Pool, `SELECT count(*) FROM idempotency_keys WHERE fingerprint = sha256(convert_to('new', 'UTF8'))`),
		"every new life is live")
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, `SELECT count(*) FROM idempotency_key_archive WHERE fingerprint = sha256(convert_to('new', 'UTF8'))`))
	require.EqualValues(t, keys-released.Load(), dbtest.Count(t, b.db.Pool, `SELECT count(*) FROM idempotency_key_archive`),
		"each old life not released is archived once")
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, `SELECT count(*) FROM idempotency_keys WHERE fingerprint = sha256(convert_to('old', 'UTF8'))`))
}
