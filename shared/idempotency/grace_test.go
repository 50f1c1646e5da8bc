package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A request still in flight past its window that then fails (a 5xx, whose
// entry the middleware releases) keeps its entry: retries have been told
// 409 expired ("not run again") since, and a release that removed it would
// leave the key in neither the live store nor the archive, so the next retry
// would run. With the Postgres store the sweeper then archives it as expired
// in flight once its grace ends; both stores answer every later retry 409.
func TestAnEntryPastItsWindowIsNeverReleased(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			// GIVEN a request still running past its 1-second window, its
			// entry kept by the sweeper's grace
			b := setup(t, kind)
			ctx := context.Background()
			h := &scripted{started: make(chan int, 4), gates: map[int]chan struct{}{1: make(chan struct{})}, statuses: map[int]int{1: http.StatusServiceUnavailable}}
			srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- post(srv, "outlived", `{}`) }()
			require.Equal(t, 1, <-h.started)
			time.Sleep(1200 * time.Millisecond)
			s, err := sweep.New(b.db.Pool, sweep.Config{InFlightGrace: 15 * time.Minute}, nil, nil)
			require.NoError(t, err)
			_, err = s.Run(ctx)
			require.NoError(t, err)

			// WHEN a retry is told it expired, and the request then fails
			late := post(srv, "outlived", `{}`)
			require.Equal(t, http.StatusConflict, late.Code, late.Body.String())
			require.Equal(t, "idempotency_key_expired", problemOf(t, late)["code"])
			close(h.gates[1])
			require.Equal(t, http.StatusServiceUnavailable, (<-done).Code)

			// THEN the next retry is answered 409 too, and never runs
			again := post(srv, "outlived", `{}`)
			require.Equal(t, http.StatusConflict, again.Code, again.Body.String())
			require.EqualValues(t, 1, h.calls.Load())
		})
	}
}
