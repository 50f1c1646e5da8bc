package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A retry whose registration waits on a sweep batch's lock, and whose client
// goes away meanwhile, leaves no entry behind: the store waits for the
// registration's outcome (the server commits it when the batch does), and
// the middleware releases what landed. Were the wait cut short on the
// client, the server would carry on, and unless pgx's cancel request reached
// it before the batch committed (a race: it is sent asynchronously), the row
// would commit after the release had found nothing, and every later retry
// would meet 409 in flight for the whole window instead of the archived
// answer. Several keys, each with the batch committing the moment the client
// leaves, so that the race is run more than once.
func TestARegistrationLeftWaitingOnASweepIsReleased(t *testing.T) {
	t.Parallel()
	// GIVEN keys completed and expired
	b := setup(t, pg)
	ctx := context.Background()
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
	const keys = 8
	for i := range keys {
		require.Equal(t, http.StatusCreated, post(srv, fmt.Sprintf("swept-while-retried-%d", i), `{}`).Code)
	}
	time.Sleep(1100 * time.Millisecond)

	for i := range keys {
		key := fmt.Sprintf("swept-while-retried-%d", i)
		scoped := "idem:v1:" + key
		// AND a sweep batch that has archived and deleted its row but not
		// committed yet
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
			SELECT scoped_key, fingerprint, status_code, resource_id, created_at, expires_at FROM idempotency_keys WHERE scoped_key = $1`, scoped)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE scoped_key = $1`, scoped)
		require.NoError(t, err)
		var batchPID, waiter int32
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&batchPID))

		// WHEN a retry's registration waits on that batch's lock, its
		// client goes away, and the batch commits
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(rctx)
			r.Header.Set(idempotency.HeaderKey, key)
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)
			done <- w
		}()
		// (Blocked by this batch: other tests' statements in the same
		// database do not count.)
		require.Eventually(t, func() bool {
			return b.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
				WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%INSERT INTO idempotency_keys%' LIMIT 1`, batchPID).Scan(&waiter) == nil
		}, 10*time.Second, 2*time.Millisecond, "the retry's insert waits on the batch's lock")
		cancel()
		require.NoError(t, tx.Commit(ctx))
		w := <-done

		// THEN the request that went away is a 503, and no registration
		// is left once the server is done
		require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
		require.Eventually(t, func() bool {
			var n int
			_ = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, waiter).Scan(&n)
			return n == 0
		}, 10*time.Second, 5*time.Millisecond, "the retry's insert no longer waits")
		time.Sleep(50 * time.Millisecond) // a connection pgx closed finishes its statement
		var live int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1`, scoped).Scan(&live))
		require.Zero(t, live, "key %d: the registration that landed after its client went away is left behind", i)

		// AND the next retry gets the archived answer
		retry := post(srv, key, `{}`)
		require.Equal(t, http.StatusConflict, retry.Code)
		require.Equal(t, "idempotency_key_expired", problemOf(t, retry)["code"])
	}
	require.EqualValues(t, keys, h.calls.Load(), "only the first requests ran")
}
