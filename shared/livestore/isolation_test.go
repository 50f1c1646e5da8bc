package livestore

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

func randomToken() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

// Under a default_transaction_isolation of REPEATABLE READ or SERIALIZABLE
// (a parameter group's, a role's), a registration that waits for another
// of the same key, and a lease renewal that waits for another process's,
// fail with a serialization failure that wrote nothing: the store runs
// them again and answers as under READ COMMITTED (the key in flight; the
// lease renewed), never a store failure, which the middleware answers 503.
func TestAStricterDefaultIsolationIsNoStoreFailure(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			db.Partition(t, 0)
			ctx, fp := context.Background(), dbtest.Fingerprint("a")
			strict := db.NewPool(t, dbtest.WithParam("default_transaction_isolation", level))
			_, err := NewPostgres(db.Pool).Register(ctx, idempotency.Registering{Key: "idem:v1:warm", Fingerprint: fp, TTL: time.Hour})
			require.NoError(t, err)

			// GIVEN another registration of the key, committed while this one waits
			p := NewPostgres(strict)
			_, err = p.Register(ctx, idempotency.Registering{Key: "idem:v1:warm2", Fingerprint: fp, TTL: time.Hour}) // its lease taken
			require.NoError(t, err)
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at, skew_ms, registration) VALUES ('idem:v1:k', $1, now() + interval '1 hour', 0, $2)", fp, randomToken())
			require.NoError(t, err)
			type answer struct {
				reg idempotency.Registration
				err error
			}
			done := make(chan answer)
			go func() {
				reg, err := p.Register(ctx, idempotency.Registering{Key: "idem:v1:k", Fingerprint: fp, Token: randomToken(), TTL: time.Hour})
				done <- answer{reg, err}
			}()
			waitForLockWait(t, db, tx)
			require.NoError(t, tx.Commit(ctx))
			a := <-done
			// THEN it is the key in flight
			require.NoError(t, a.err)
			require.False(t, a.reg.Fresh)
			require.Equal(t, idempotency.InFlight, a.reg.Entry.State)

			// GIVEN another process's renewal of the lease, committed while this one's waits
			fresh := NewPostgres(strict) // a new process: its lease is due
			tx, err = db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "UPDATE idempotency_writers SET used_until = used_until + interval '1 second' WHERE ttl_ms = 3600000 AND skew_ms = 0")
			require.NoError(t, err)
			go func() {
				reg, err := fresh.Register(ctx, idempotency.Registering{Key: "idem:v1:k2", Fingerprint: fp, Token: randomToken(), TTL: time.Hour})
				done <- answer{reg, err}
			}()
			waitForLockWait(t, db, tx)
			require.NoError(t, tx.Commit(ctx))
			a = <-done
			// THEN the key is registered
			require.NoError(t, a.err)
			require.True(t, a.reg.Fresh)
		})
	}
}

// waitForLockWait waits until a session waits for a lock holder holds.
func waitForLockWait(t *testing.T, db *dbtest.DB, holder pgx.Tx) {
	t.Helper()
	var pid int32
	require.NoError(t, holder.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))", pid) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no session waited for the holder's lock")
}

// A burst of new processes (a scale-out: each renews its lease on its first
// registration) waiting for one lease row under a stricter isolation: each
// round lets one through, and every one gets through in turn.
func TestABurstOfRenewalsUnderAStricterIsolationAllGetThrough(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	strict := db.NewPool(t, dbtest.WithParam("default_transaction_isolation", "serializable"))
	_, err := NewPostgres(db.Pool).Register(ctx, idempotency.Registering{Key: "idem:v1:warm", Fingerprint: fp, TTL: time.Hour})
	require.NoError(t, err)
	// GIVEN the lease row held while twelve new stores register
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "UPDATE idempotency_writers SET used_until = used_until + interval '1 second' WHERE ttl_ms = 3600000 AND skew_ms = 0")
	require.NoError(t, err)
	const n = 12
	errs := make(chan error, n)
	for i := range n {
		s := NewPostgres(strict)
		go func() {
			_, err := s.Register(ctx, idempotency.Registering{Key: "idem:v1:burst" + strconv.Itoa(i), Fingerprint: fp, Token: randomToken(), TTL: time.Hour})
			errs <- err
		}()
	}
	waitForLockWait(t, db, tx)
	time.Sleep(200 * time.Millisecond) // let the others queue behind the first
	require.NoError(t, tx.Commit(ctx))
	// THEN every registration succeeds
	for range n {
		require.NoError(t, <-errs)
	}
}
