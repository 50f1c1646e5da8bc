package livestore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
)

// sweepHolding stands for a sweep batch that has deleted key's expired row
// and not committed yet: a registration of key waits on it. The batch
// rolls back at the end of the test unless it was committed.
func sweepHolding(t *testing.T, db *dbtest.DB, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: key, ExpiresAt: time.Now().Add(-time.Minute)})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "DELETE FROM idempotency_keys WHERE scoped_key = $1", key)
	require.NoError(t, err)
	return tx
}

// oneConnectionStore is a Postgres store over a pool of one connection,
// its writer lease already taken.
func oneConnectionStore(t *testing.T) (*dbtest.DB, *pgxpool.Pool, *Postgres) {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 0)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	p := NewPostgres(pool)
	_, err := p.Register(context.Background(), idempotency.Registering{Key: "idem:v1:warm", Fingerprint: dbtest.Fingerprint("a"), TTL: time.Hour})
	require.NoError(t, err)
	return db, pool, p
}

// busyFor holds one of pool's connections for d.
func busyFor(t *testing.T, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	busy, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	go func() {
		time.Sleep(d)
		busy.Release()
	}()
}

// A registration that waits on a sweep batch's lock ends by its request's
// deadline, on the server: the statement timeout is what is left of the
// deadline, not the full registerTimeout, and the registration never lands
// once the batch commits.
func TestARegistrationWaitingOnALockEndsByItsDeadline(t *testing.T) {
	t.Parallel()
	// GIVEN a key whose expired row a sweep batch has deleted, uncommitted
	db := dbtest.New(t)
	db.Partition(t, 0)
	p := NewPostgres(db.Pool)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	const key = "idem:v1:locked"
	tx := sweepHolding(t, db, key)

	// WHEN a retry with 300 ms left registers it
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Register(rctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
	took := time.Since(start)

	// THEN the server ended the insert by the deadline, well before
	// registerTimeout
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57014", pgErr.Code, "the server's statement timeout ended the wait")
	require.Less(t, took, registerTimeout, "the wait was bounded by the request's deadline")

	// AND once the batch commits, the registration has not landed
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1", key))
}

// A request whose context ends while it waits for a pool connection sends
// no registration: it returns its context's error at once, and when the
// connection comes free nothing is registered for a request that is gone.
func TestARegistrationThatNeverGotAConnectionSendsNothing(t *testing.T) {
	t.Parallel()
	// GIVEN a store whose only connection is busy, its lease already held
	db, pool, p := oneConnectionStore(t)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	reg := idempotency.Registering{Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour}
	busyFor(t, pool, time.Second)

	// WHEN a request with 200 ms left registers a key
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	reg.Key = "idem:v1:never-sent"
	_, err := p.Register(rctx, reg)

	// THEN it fails with its deadline, saying it sent nothing
	require.True(t, errors.Is(err, context.DeadlineExceeded), "got %v", err)
	require.ErrorIs(t, err, idempotency.ErrNotSent)

	// AND nothing was registered once the connection came free
	require.Eventually(t, func() bool { return pool.Stat().IdleConns() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1", reg.Key))
}

// A request whose context has ended registers nothing, even with
// connections free.
func TestAnEndedRequestRegistersNothing(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	p := NewPostgres(db.Pool)
	rctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := p.Register(rctx, idempotency.Registering{Key: "idem:v1:gone", Fingerprint: dbtest.Fingerprint("a"), TTL: time.Hour})
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
}

// The deadline bounds the statement from when it is sent: a request that
// waited for a pool connection has that much less, and the server's
// timeout ends by its deadline all the same.
func TestTheStatementTimeoutCountsTheWaitForAConnection(t *testing.T) {
	t.Parallel()
	// GIVEN a key whose expired row a sweep batch holds, and a store whose
	// only connection is busy for 1.5 s
	db, pool, p := oneConnectionStore(t)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	const key = "idem:v1:locked"
	tx := sweepHolding(t, db, key)
	busyFor(t, pool, 1500*time.Millisecond)

	// WHEN a request with 2 s left registers the key
	const left = 2 * time.Second
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	start := time.Now()
	_, err := p.Register(rctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
	took := time.Since(start)

	// THEN the server's timeout ended it by the deadline (not 2 s after
	// the connection came free), and nothing landed
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57014", pgErr.Code)
	require.Less(t, took, left+time.Second, "the statement ran past the request's deadline")
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1", key))
}

// In the modes that prepare a statement in a round trip of its own (the
// default cache_statement among them), the preparation runs under the
// request's context: one that waits on a relation lock (a migration's)
// ends with the request, sends nothing, and registers nothing when the
// lock is released. Were it bounded only by the registration's wait, the
// insert would start after the request had ended, with the client about
// to give up on it.
func TestAPreparationWaitingOnALockEndsWithTheRequest(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			// GIVEN a fresh pool, its lease held, and a migration holding
			// the live table
			db := dbtest.New(t)
			db.Partition(t, 0)
			pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2; c.ConnConfig.DefaultQueryExecMode = mode })
			p := NewPostgres(pool)
			ctx, fp := context.Background(), dbtest.Fingerprint("a")
			require.NoError(t, p.leases.renew(ctx, lease{ttlMS: durationMS(time.Hour), skewMS: durationMS(keytime.DefaultClockSkew)}, false))
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
			require.NoError(t, err)

			// WHEN a request with 300 ms left registers a key
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := p.Register(rctx, idempotency.Registering{Key: "idem:v1:migrating", Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour, ClockSkew: keytime.DefaultClockSkew})
				done <- err
			}()

			// THEN it ends with the request, having sent nothing
			select {
			case err := <-done:
				require.ErrorIs(t, err, idempotency.ErrNotSent)
			case <-time.After(3 * time.Second):
				t.Fatal("the registration is still waiting on the migration's lock")
			}

			// AND nothing is registered once the migration commits
			require.NoError(t, tx.Commit(ctx))
			require.Eventually(t, func() bool {
				return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()") == 0
			}, 10*time.Second, 10*time.Millisecond)
			time.Sleep(50 * time.Millisecond)
			require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
		})
	}
}

// A live row written by hand with created_at '-infinity' is read like any
// other: its time unknown (zero), its window ended by the database's clock.
func TestALiveRowWithAnInfiniteCreationIsRead(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx, fp := context.Background(), dbtest.Fingerprint("idem:v1:hand")
	_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at, skew_ms)
		VALUES ('idem:v1:hand', $1, 'completed', 201, '-infinity', now() - interval '1 minute', 0)`, fp)
	require.NoError(t, err)
	reg, err := NewPostgres(db.Pool).Register(ctx, idempotency.Registering{Key: "idem:v1:hand", Fingerprint: fp, TTL: time.Hour})
	require.NoError(t, err)
	require.False(t, reg.Fresh)
	require.True(t, reg.Entry.CreatedAt.IsZero())
	require.NotNil(t, reg.Entry.WindowEnded)
	require.True(t, *reg.Entry.WindowEnded)
	require.Equal(t, 201, reg.Entry.Status)
}
