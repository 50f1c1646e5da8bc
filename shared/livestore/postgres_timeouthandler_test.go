package livestore

import (
	"context"
	"fmt"
	"io"
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

// Behind http.TimeoutHandler, a charge answered 20 ms before the timeout
// meets a 100 ms lock on the live table: the completion waits it out past
// the request's deadline, and the retry replays the 201. Cut at the
// deadline, the row stayed in flight (a retry got 409 in flight) and was
// archived as never completed.
func TestAPostgresCompletionOutlivesTheRequestsDeadlineThroughABlip(t *testing.T) {
	_, db := newRedisStore(t) // a schema partitioned for this month
	s := NewPostgres(db.Pool)
	ctx := context.Background()
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	mw, err := idempotency.New(idempotency.Config{Store: s, Archive: reader, SingleTenant: true, LiveTTL: time.Hour})
	require.NoError(t, err)
	var calls atomic.Int32
	var slow atomic.Bool
	const margin = 20 * time.Millisecond
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		if slow.Load() {
			d, _ := r.Context().Deadline()
			go func() { // a brief lock on the live table (a DDL, a vacuum truncation)
				time.Sleep(time.Until(d.Add(-margin - 10*time.Millisecond)))
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					return
				}
				_, _ = tx.Exec(ctx, "LOCK TABLE idempotency_keys IN SHARE MODE")
				time.Sleep(100 * time.Millisecond)
				_ = tx.Rollback(ctx)
			}()
			time.Sleep(time.Until(d.Add(-margin)))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	}))
	srv := httptest.NewServer(http.TimeoutHandler(h, 500*time.Millisecond, "timeout"))
	defer srv.Close()
	post := func(key string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	post("warm")
	calls.Store(0)

	slow.Store(true)
	code, body := post("pg-near-deadline")
	slow.Store(false)
	time.Sleep(300 * time.Millisecond)
	var state string
	var status *int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT state::text, status_code FROM idempotency_keys WHERE scoped_key = $1", "idem:v1:pg-near-deadline").Scan(&state, &status))
	t.Logf("first answer %d %q; live row then: state %s status %v", code, body, state, status)
	code, body = post("pg-near-deadline")
	t.Logf("retry: %d %q", code, body)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, http.StatusCreated, code, "the retry of a charge that answered 201 replays it (the live row stayed %s: archived as never completed after its window)", state)
}
