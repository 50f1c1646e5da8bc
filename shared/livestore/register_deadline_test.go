package livestore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

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
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: key, ExpiresAt: time.Now().Add(-time.Minute)})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "DELETE FROM idempotency_keys WHERE scoped_key = $1", key)
	require.NoError(t, err)

	// WHEN a retry with 300 ms left registers it
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = p.Register(rctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
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
	db := dbtest.New(t)
	db.Partition(t, 0)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	p := NewPostgres(pool)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	reg := idempotency.Registering{Key: "idem:v1:warm", Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour}
	_, err := p.Register(ctx, reg)
	require.NoError(t, err)
	busy, err := pool.Acquire(ctx)
	require.NoError(t, err)
	go func() {
		time.Sleep(time.Second)
		busy.Release()
	}()

	// WHEN a request with 200 ms left registers a key
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	reg.Key = "idem:v1:never-sent"
	_, err = p.Register(rctx, reg)

	// THEN it fails with its deadline
	require.True(t, errors.Is(err, context.DeadlineExceeded), "got %v", err)

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
