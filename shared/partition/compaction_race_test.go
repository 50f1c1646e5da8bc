package partition_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A compaction (real clocks: the closed month is two months before the
// current one) racing a sweeper that moves a backlog of late rows of that
// very month into it, lookups of its keys, and a second partition run (a
// second Lambda). Every row must end up archived, findable through the
// rebuilt index, and nothing must fail.
func TestCompactionRacesTheSweeperLookupsAndASecondRun(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	closed := partition.MonthStart(time.Now()).AddDate(0, -2, 0)
	name := partition.Name(closed)
	m := newManager(t, db.Pool, partition.Config{CompactPerRun: 1})
	_, err := m.Run(ctx, false)
	require.NoError(t, err)
	_, err = m.EnsureMonth(ctx, closed)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{name}.Sanitize()+" SET (autovacuum_enabled = false)")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		SELECT 'idem:v1:old_' || md5(g::text), '\x00', 201, NULL, $1::timestamptz, $1::timestamptz + g * interval '1 second'
		  FROM generate_series(1, 30000) g ORDER BY random()`, closed)
	require.NoError(t, err)
	// The backlog: 20,000 late rows of the closed month in the live table.
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
		SELECT 'idem:v1:late_' || md5(g::text), decode(repeat('00', 32), 'hex'), 'completed', 201,
		       $1::timestamptz, $1::timestamptz + interval '1 hour' + g * interval '1 second'
		  FROM generate_series(1, 20000) g`, closed)
	require.NoError(t, err)
	var lateKey string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT 'idem:v1:late_' || md5('17')").Scan(&lateKey))

	sweeperPool := db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
	s, err := sweep.New(sweeperPool, sweep.Config{BatchSize: 300, Pause: 0}, m, nil)
	require.NoError(t, err)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)

	var wg sync.WaitGroup
	var res1, res2 partition.Result
	var err1, err2, errSweep error
	stop := make(chan struct{})
	var lookupErr error
	wg.Add(3)
	go func() { defer wg.Done(); res1, err1 = m.Run(ctx, false) }()
	go func() {
		defer wg.Done()
		time.Sleep(50 * time.Millisecond)
		res2, err2 = newManager(t, db.Pool, partition.Config{CompactPerRun: 1}).Run(ctx, false)
	}()
	go func() { defer wg.Done(); _, errSweep = s.Run(ctx) }()
	var lwg sync.WaitGroup
	lwg.Add(1)
	go func() {
		defer lwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.Lookup(ctx, "idem:v1:old_"+"x", nil); err != nil && !isNotFound(err) && lookupErr == nil {
				lookupErr = err
			}
		}
	}()
	wg.Wait()
	close(stop)
	lwg.Wait()
	t.Logf("run1 compacted=%v pending=%v failed=%v err=%v", res1.Compacted, res1.CompactPending, res1.Failed, err1)
	t.Logf("run2 compacted=%v pending=%v failed=%v err=%v", res2.Compacted, res2.CompactPending, res2.Failed, err2)
	require.NoError(t, errSweep)
	require.NoError(t, err1)
	require.NoError(t, err2)
	require.NoError(t, lookupErr)
	require.Equal(t, []string{name}, append(res1.Compacted, res2.Compacted...), "compacted exactly once")
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 0, invalidIndexes(t, db))

	// Every row is in the heap and in the rebuilt primary key.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
	require.NoError(t, err)
	var viaIndex int64
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()+" WHERE scoped_key >= ''").Scan(&viaIndex))
	require.EqualValues(t, 50_000, viaIndex)
	rec, err := r.Lookup(ctx, lateKey, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
}

func isNotFound(err error) bool { return err != nil && err.Error() == "archive: key not found" }
