package livestore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A lease renewal waits for a lock on idempotency_writers (a migration, an
// operator's transaction) no longer than a registration may: a request
// without a deadline whose lease is due fails after registerTimeout rather
// than hang, holding its pool connection, for as long as the lock is held.
func TestALeaseRenewalIsBoundedLikeARegistration(t *testing.T) {
	t.Parallel()
	// GIVEN idempotency_writers locked by another transaction
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_writers IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	// (a timeout shorter than registerTimeout, the default, keeps this
	// test's lock wait from showing in other tests' pg_stat_activity)
	require.Equal(t, registerTimeout, newLeases(db.Pool).timeout)
	const timeout = 300 * time.Millisecond
	pg, rds := NewPostgres(db.Pool), NewRedis(nil, db.Pool, "unused:") // the lease comes before Redis is touched
	pg.leases.timeout, rds.leases.timeout = timeout, timeout
	for name, store := range map[string]idempotency.Store{"postgres": pg, "redis": rds} {
		t.Run(name, func(t *testing.T) { // not parallel: the lock is this function's
			// WHEN a fresh process (its lease due) registers without a deadline
			start := time.Now()
			_, err := store.Register(ctx, idempotency.Registering{Key: "idem:v1:lease-wait", Fingerprint: dbtest.Fingerprint("a"), Token: []byte("0123456789abcdef"), TTL: time.Hour})
			took := time.Since(start)

			// THEN the wait ends within the timeout and the grace for the
			// server's answer (the statement timeout, or the context that
			// bounds the preparation of the pool's cache_statement mode),
			// and the request fails
			require.ErrorContains(t, err, "idempotency_writers")
			require.Less(t, took, timeout+registerGrace+time.Second, "the renewal outlived its timeout and grace")
		})
	}
}
