package idempotency_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A handler that wrote 201 and part of its body, then panicked: the key
// keeps the 201 and the resource id the body got as far as, and the retry
// replays a problem that says the response was cut short, never half a
// JSON document as if it were the answer.
func TestAPanicMidBodyReplaysWhatHappenedNotTheCutBody(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		var calls atomic.Int32
		srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"id":"ch_1","amount":`))
			panic("render bug")
		}))
		func() {
			defer func() { _ = recover() }()
			post(srv, "cut-short", `{}`)
		}()
		again := post(srv, "cut-short", `{}`)
		require.EqualValues(t, 1, calls.Load())
		require.Equal(t, 201, again.Code)
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
		require.Equal(t, "application/problem+json", again.Header().Get("Content-Type"))
		var p map[string]any
		require.NoError(t, json.Unmarshal(again.Body.Bytes(), &p), again.Body.String())
		require.Equal(t, "idempotency_response_incomplete", p["code"])
		require.Contains(t, p["detail"], "not run again")
	})
}

// The first final status is the answer, whatever follows it: 103, 201, 500
// and a panic keep 201; 103 alone and a panic release the key.
func TestTheFirstFinalStatusDecidesAfterAPanic(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		var calls atomic.Int32
		srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				w.WriteHeader(103)
				w.WriteHeader(201)
				w.WriteHeader(500)
				_, _ = w.Write([]byte(`{"id":"ch_1"}`))
				panic("x")
			}
			w.WriteHeader(201)
		}))
		func() {
			defer func() { _ = recover() }()
			post(srv, "twice", `{}`)
		}()
		again := post(srv, "twice", `{}`)
		require.Equal(t, 201, again.Code)
		require.EqualValues(t, 1, calls.Load())
		// Only 103 then panic: released.
		var c2 atomic.Int32
		srv2 := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c2.Add(1) == 1 {
				w.WriteHeader(103)
				panic("x")
			}
			w.WriteHeader(201)
		}))
		func() {
			defer func() { _ = recover() }()
			post(srv2, "only-1xx", `{}`)
		}()
		require.Equal(t, 201, post(srv2, "only-1xx", `{}`).Code)
		require.EqualValues(t, 2, c2.Load())
	})
}

// A live row written by hand with a BC date (the sweeper never archives
// it) is answered 409 expired, its times null where JSON cannot write them,
// never a 500.
func TestABCExpiryIsAnswered409(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
	require.Equal(t, 201, post(srv, "bc", `{}`).Code)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = '0045-01-01 BC', expires_at = '0044-03-15 BC' WHERE scoped_key = 'idem:v1:bc'`)
	require.NoError(t, err)
	w := post(srv, "bc", `{}`)
	require.EqualValues(t, 1, h.calls.Load())
	require.Equal(t, 409, w.Code, w.Body.String())
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_expired", p["code"])
	require.Nil(t, p["expired_at"])
	require.Contains(t, p["detail"], "-0043-03-15")
}

type hangingArchive struct{ calls atomic.Int32 }

func (a *hangingArchive) Lookup(ctx context.Context, _ string, _ []byte) (archive.Record, error) {
	a.calls.Add(1)
	<-ctx.Done()
	return archive.Record{}, ctx.Err()
}

// With the Postgres store too, an expired in-flight live row may belong to
// a key the archive holds completed (a late retry whose release failed on
// every attempt): its retries ask the archive, and while the archive hangs
// the answer is 503 after ArchiveTimeout, never "never completed"
// (original_status 0), whatever OnArchiveError says.
func TestAnExpiredInFlightPostgresRowAsksTheArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{block: make(chan struct{})}
	a := &hangingArchive{}
	mw := b.middleware(t, idempotency.Config{LiveTTL: time.Hour, Archive: a, ArchiveTimeout: 300 * time.Millisecond, OnArchiveError: idempotency.FailOpen})
	srv := mw.Wrap(h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h), "slow", `{}`)
	}()
	require.Eventually(t, func() bool { return h.calls.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE scoped_key = 'idem:v1:slow'`)
	require.NoError(t, err)
	w := post(srv, "slow", `{}`)
	close(h.block)
	<-done
	require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
	require.EqualValues(t, 1, a.calls.Load())
	require.EqualValues(t, 1, h.calls.Load())
}

// FailOpen never runs a late retry whose request has too little time left
// for the lookup: the Reader ends a query a margin before the context's
// deadline (here by the statement timeout it set, while the lookup waits on
// a lock) while the context itself is still live, and that is the request
// running out of time, not the archive failing.
func TestFailOpenNeverRunsALookupTheDeadlineCutShort(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			// GIVEN an archived key and a middleware that fails open
			b := setup(t, kind)
			dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:archived-plain-key", Status: 201, ResourceID: ptr("ch_old"),
				CreatedAt: time.Now().Add(-50 * time.Hour), ExpiredAt: time.Now().Add(-26 * time.Hour), Fingerprint: emptyBodyFP})
			h := &charges{}
			srv := b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen}).Wrap(h)
			require.Equal(t, http.StatusCreated, post(srv, "warm-up", `{}`).Code, "warm the pool and the lease")

			// WHEN its retry arrives with 90 ms left, while the archive
			// waits on a lock
			lockArchive(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Millisecond)
			defer cancel()
			r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(ctx)
			r.Header.Set(idempotency.HeaderKey, "archived-plain-key")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)

			// THEN it is a 503, and the handler ran only for the warm-up
			require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
			require.EqualValues(t, 1, h.calls.Load(), "the archived key ran again")
		})
	}
}

// A tight ArchiveTimeout still leaves the lookup most of its time: the
// Reader keeps a quarter of it free, not a fixed 100 ms that would fail
// every lookup with 503 (or, failing open, run every late retry again).
func TestATightArchiveTimeoutStillAnswersLateRetries(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind)
			dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:tight-timeout", Status: 201, ResourceID: ptr("ch_tight"),
				CreatedAt: time.Now().Add(-50 * time.Hour), ExpiredAt: time.Now().Add(-26 * time.Hour), Fingerprint: emptyBodyFP})
			h := &charges{}
			srv := b.middleware(t, idempotency.Config{ArchiveTimeout: 100 * time.Millisecond}).Wrap(h)
			require.Equal(t, http.StatusCreated, post(srv, "warm-up", `{}`).Code, "warm the pool and the lease")

			w := post(srv, "tight-timeout", `{}`)
			require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
			require.Equal(t, "ch_tight", problemOf(t, w)["resource_id"])
			require.EqualValues(t, 1, h.calls.Load(), "only the warm-up ran")
		})
	}
}
