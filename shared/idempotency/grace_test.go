package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A request still in flight past its window that then fails (a 5xx, whose
// entry the middleware releases) keeps its Postgres entry: retries have been
// told 409 expired ("not run again") since, and a release that removed it
// would leave the key in neither the live table nor the archive, so the next
// retry would run. The sweeper archives it as expired in flight once its
// grace ends. (The Redis store has no such guard: see the README.)
func TestAnEntryPastItsWindowIsNeverReleased(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg} {
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

			// THEN the next retry is answered 409 too, and never runs,
			// also once the sweeper has archived the entry
			again := post(srv, "outlived", `{}`)
			require.Equal(t, http.StatusConflict, again.Code, again.Body.String())
			s, err = sweep.New(b.db.Pool, sweep.Config{}, nil, nil)
			require.NoError(t, err)
			res, err := s.Run(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, res.Moved)
			again = post(srv, "outlived", `{}`)
			require.Equal(t, http.StatusConflict, again.Code, again.Body.String())
			require.EqualValues(t, 1, h.calls.Load())
		})
	}
}

// archiveTimingOut is an archive whose every lookup fails after a while.
type archiveTimingOut struct{ after time.Duration }

func (a archiveTimingOut) Lookup(ctx context.Context, _ string, _ []byte) (archive.Record, error) {
	time.Sleep(a.after)
	return archive.Record{}, errors.New("archive unreachable")
}

// A release before the handler ran (nothing ran) goes through whatever the
// entry's window says: with a TTL shorter than an archive outage's lookup,
// the 503 asks for a retry, and that retry runs.
func TestAReleaseBeforeTheHandlerRanAlwaysFreesTheKey(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind)
			h := &charges{}
			down := b.middleware(t, idempotency.Config{LiveTTL: time.Second, Archive: archiveTimingOut{1500 * time.Millisecond}}).Wrap(h)
			w := post(down, "slow-archive", `{}`)
			require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			require.Zero(t, h.calls.Load())

			up := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
			retry := post(up, "slow-archive", `{}`)
			require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			require.EqualValues(t, 1, h.calls.Load())
		})
	}
}

// wrapped hides every method of the store but Store's, as a metrics or
// tracing decorator would.
type wrapped struct{ idempotency.Store }

// A store wrapped so that it hides ReleaseBeforeRun keeps the guard: an
// entry past its window whose handler answered a server error is still kept,
// and never runs twice.
func TestAWrappedStoreKeepsTheGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	b.store = wrapped{b.store}
	h := &scripted{started: make(chan int, 4), gates: map[int]chan struct{}{1: make(chan struct{})}, statuses: map[int]int{1: http.StatusServiceUnavailable}}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- post(srv, "wrapped", `{}`) }()
	require.Equal(t, 1, <-h.started)
	time.Sleep(1200 * time.Millisecond)
	require.Equal(t, "idempotency_key_expired", problemOf(t, post(srv, "wrapped", `{}`))["code"])
	close(h.gates[1])
	require.Equal(t, http.StatusServiceUnavailable, (<-done).Code)
	again := post(srv, "wrapped", `{}`)
	require.Equal(t, http.StatusConflict, again.Code, again.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
}
