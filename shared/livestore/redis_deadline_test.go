package livestore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A Redis completion keeps its outcome safe within the request's deadline
// (a Lambda invocation's is the process's end): with the archive stalled
// on a lock, the store stops its archive write in time to keep the hash
// completed and without expiry before the deadline. Run past it, the
// completion left the hash in flight with its expiry at the deadline,
// recorded nowhere else, and a retry after window + 15 min would run the
// charge again.
func TestARedisCompletionKeepsTheOutcomeWithinTheRequestsDeadline(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:within-deadline"
	t.Cleanup(func() { s.client.Del(context.Background(), s.both(key)...) })

	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	var calls atomic.Int32
	mw, err := idempotency.New(idempotency.Config{Store: s, Archive: reader, SingleTenant: true, ArchiveTimeout: 5 * time.Second})
	require.NoError(t, err)
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))

	// Warm up (lease, scripts) so the request itself is fast up to its
	// completion.
	warm := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	warm.Header.Set(idempotency.HeaderKey, "warm-within-deadline")
	srv.ServeHTTP(httptest.NewRecorder(), warm)
	calls.Store(0)

	// The archive stalls (a migration's lock): inserts wait, lookups read.
	stall, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = stall.Rollback(ctx) }()
	_, err = stall.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	reqCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	deadline, _ := reqCtx.Deadline()
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`)).WithContext(reqCtx)
	r.Header.Set(idempotency.HeaderKey, strings.TrimPrefix(key, "idem:v1:"))
	done := make(chan time.Time, 1)
	w := httptest.NewRecorder()
	go func() {
		srv.ServeHTTP(w, r)
		done <- time.Now()
	}()

	// The invocation's deadline: Lambda ends the process here.
	time.Sleep(time.Until(deadline))
	h := s.client.HGetAll(ctx, s.prefix+key).Val()
	pttl := s.client.PTTL(ctx, s.prefix+key).Val()
	var archived int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key).Scan(&archived))
	t.Logf("at the request's deadline: handler calls %d, hash state %q, PTTL %s, archive rows %d", calls.Load(), h["state"], pttl, archived)

	require.True(t, archived > 0 || (h["state"] == "completed" && pttl == -1),
		"at the request's deadline the charge's outcome is recorded nowhere: hash %q with PTTL %s, %d archive rows (a Lambda killed now leaves it to run again after its window + 15 min)",
		h["state"], pttl, archived)

	// A process that lives on past the deadline (a server, not a Lambda)
	// goes on completing: once the archive is free, its next attempt
	// writes the row and gives the hash its expiry back.
	require.NoError(t, stall.Rollback(ctx))
	<-done
	require.EqualValues(t, 1, calls.Load(), "the handler ran")
	require.Equal(t, http.StatusCreated, w.Code)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key).Scan(&archived))
	require.EqualValues(t, 1, archived, "archived after the deadline")
	require.Positive(t, s.client.PTTL(ctx, s.prefix+key).Val(), "the hash has its expiry back")
}
