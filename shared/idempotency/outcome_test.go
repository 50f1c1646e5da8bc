package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// A status net/http takes but HTTP does not define (600-999), or one it
// would panic on (0): it says nothing of what the handler did, so the
// request is answered 500 and the key keeps that answer. It is never
// released for a retry (a 5xx the handler chose says nothing happened; this
// does not), and the middleware never panics on it.
func TestAStatusOutsideHTTPIsKeptAs500(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		for _, status := range []int{0, 99, 600, 999, 1000, -1} {
			calls := 0
			srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls++
				w.WriteHeader(status)
				_, _ = w.Write([]byte(`{"id":"ch_odd"}`))
			}))
			key := fmt.Sprintf("odd-status-%d", status)
			first := post(srv, key, `{}`)
			require.Equal(t, 500, first.Code, "status %d", status)
			again := post(srv, key, `{}`)
			require.Equal(t, 500, again.Code, "status %d", status)
			require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "status %d: kept, not released", status)
			require.Equal(t, 1, calls, "status %d", status)
		}
	})
}

// A handler that answered and then panicked (a render bug after the charge)
// did what it answered: its key keeps that answer, and the retry replays it.
// One that panicked before answering, or after a 5xx, frees the key.
func TestAPanicAfterAnAnswerKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		for _, tc := range []struct {
			key      string
			status   int // 0: panics before answering
			released bool
		}{
			{"panic-after-201", 201, false},
			{"panic-after-409", 409, false},
			{"panic-before", 0, true},
			{"panic-after-503", 503, true},
		} {
			var calls atomic.Int32
			srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := calls.Add(1)
				if n == 1 {
					if tc.status != 0 {
						w.WriteHeader(tc.status)
						fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
					}
					panic("a bug after the work")
				}
				w.WriteHeader(201)
				fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
			}))
			func() {
				defer func() { require.NotNil(t, recover(), "the panic goes on to the server") }()
				post(srv, tc.key, `{}`)
			}()
			again := post(srv, tc.key, `{}`)
			if tc.released {
				require.Equal(t, 201, again.Code, tc.key)
				require.EqualValues(t, 2, calls.Load(), "%s runs again", tc.key)
			} else {
				require.Equal(t, tc.status, again.Code, tc.key)
				require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), tc.key)
				p := problemOf(t, again)
				require.Equal(t, "idempotency_response_incomplete", p["code"], tc.key)
				require.Equal(t, "ch_1", p["resource_id"], tc.key)
				require.EqualValues(t, 1, calls.Load(), "%s never runs again", tc.key)
			}
		}
	})
}

// cancelThenLookup ends the request (its client goes away) while the
// archive lookup runs.
type cancelThenLookup struct {
	inner  idempotency.Archive
	cancel context.CancelFunc
}

func (a cancelThenLookup) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	a.cancel()
	return a.inner.Lookup(ctx, key, fp)
}

// With FailOpen, a lookup that fails because the request ended is not an
// archive outage: the handler never runs a key the archive may hold, and
// the key is released.
func TestFailOpenNeverRunsAKeyWhoseRequestEnded(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:late-open", Status: 201, ResourceID: ptr("ch_orig"),
			CreatedAt: time.Now().Add(-30 * time.Hour), ExpiredAt: time.Now().Add(-6 * time.Hour), Fingerprint: emptyBodyFP})
		ctx, cancel := context.WithCancel(context.Background())
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{Archive: cancelThenLookup{inner: b.reader, cancel: cancel}, OnArchiveError: idempotency.FailOpen}).Wrap(h)
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(ctx)
		r.Header.Set(idempotency.HeaderKey, "late-open")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		require.Zero(t, h.calls.Load(), "answered %d", w.Code)
		require.Equal(t, 503, w.Code)

		late := post(b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen}).Wrap(h), "late-open", `{}`)
		require.Equal(t, 409, late.Code, "the key was released: %s", late.Body.String())
		require.Equal(t, "ch_orig", problemOf(t, late)["resource_id"])
		require.Zero(t, h.calls.Load())
	})
}

// flakyComplete fails the first n Completes, as a database blip would, or
// lands the first and loses its reply.
type flakyComplete struct {
	idempotency.Store
	failures   atomic.Int32
	lostReplay bool
}

func (f *flakyComplete) Complete(ctx context.Context, key string, c idempotency.Completion) error {
	if f.failures.Add(-1) >= 0 {
		if f.lostReplay {
			_ = f.Store.Complete(ctx, key, c)
			return errors.New("read tcp: i/o timeout")
		}
		return errors.New("conn reset by peer")
	}
	return f.Store.Complete(ctx, key, c)
}

// A completion that fails once is tried again: the outcome is kept, and a
// late retry after the sweep is told the original status and resource id,
// not "never completed". One whose reply was lost after it landed stops at
// the next attempt's ErrNotInFlight.
func TestACompletionThatFailsIsTriedAgain(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		b := setup(t, pg)
		store := &flakyComplete{Store: b.store, lostReplay: lost}
		store.failures.Store(2)
		var logs strings.Builder
		mw, err := idempotency.New(idempotency.Config{Store: store, SingleTenant: true, Archive: b.reader, LiveTTL: time.Second,
			ArchiveTimeout: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		h := &charges{}
		srv := mw.Wrap(h)
		require.Equal(t, 201, post(srv, "blip", `{}`).Code)
		require.Contains(t, logs.String(), "attempt=1", "lost=%v: each failed attempt is logged", lost)
		require.NotContains(t, logs.String(), "attempt=3", "lost=%v: the third attempt landed, or the second found it landed", lost)
		time.Sleep(1100 * time.Millisecond)
		require.EqualValues(t, 1, sweepAll(t, b))
		w := post(srv, "blip", `{}`)
		require.Equal(t, 409, w.Code, w.Body.String())
		p := problemOf(t, w)
		require.EqualValues(t, 201, p["original_status"], w.Body.String())
		require.Equal(t, "ch_1", p["resource_id"])
		require.EqualValues(t, 1, h.calls.Load())
	}
}

// A Redis completion that archived its row but could not mark the hash
// completed (a reset, a crash) leaves an in-flight hash: once its window
// ends, retries are answered from the archive's outcome, not as never
// completed.
func TestAnExpiredInFlightEntryIsAnsweredFromTheArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	client, prefix := testenv.Redis(t)
	client.AddHook(failCompletion{})
	mw, err := idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, b.db.Pool, prefix), SingleTenant: true, Archive: b.reader,
		LiveTTL: time.Second, ArchiveTimeout: 30 * time.Second})
	require.NoError(t, err)
	h := &charges{}
	srv := mw.Wrap(h)
	require.Equal(t, 201, post(srv, "half", `{}`).Code)
	time.Sleep(1200 * time.Millisecond)
	w := post(srv, "half", `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_expired", p["code"])
	require.EqualValues(t, 201, p["original_status"], w.Body.String())
	require.Equal(t, "ch_1", p["resource_id"])
	require.EqualValues(t, 1, h.calls.Load())
}

// With KeepServerErrors, a request whose handler started never runs again:
// a 5xx is kept and replayed, and so is a panic before any answer, as a 500
// problem (the handler may have acted before it failed).
func TestKeepServerErrorsNeverRunsAStartedRequestAgain(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		var calls atomic.Int32
		srv := b.middleware(t, idempotency.Config{KeepServerErrors: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			switch r.URL.Query().Get("do") {
			case "503":
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":"provider timed out"}`))
			case "panic":
				panic("after the charge, before the answer")
			}
		}))
		send := func(key, do string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/v1/charges?do="+do, strings.NewReader(`{}`))
			r.Header.Set(idempotency.HeaderKey, key)
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)
			return w
		}
		require.Equal(t, 503, send("kept-503", "503").Code)
		again := send("kept-503", "503")
		require.Equal(t, 503, again.Code)
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
		require.Equal(t, `{"error":"provider timed out"}`, again.Body.String())

		func() {
			defer func() { require.NotNil(t, recover()) }()
			send("kept-panic", "panic")
		}()
		again = send("kept-panic", "panic")
		require.Equal(t, 500, again.Code)
		require.Equal(t, "idempotency_response_incomplete", problemOf(t, again)["code"])
		require.EqualValues(t, 2, calls.Load(), "each key's handler ran once")
	})
}

// lostRegisterReply registers the key but reports an error, as when the
// reply to a committed INSERT (or EVAL) is lost to a timeout or a reset.
type lostRegisterReply struct {
	idempotency.Store
	lost atomic.Bool
}

func (l *lostRegisterReply) Register(ctx context.Context, req idempotency.Registering) (idempotency.Registration, error) {
	reg, err := l.Store.Register(ctx, req)
	if err == nil && reg.Fresh && l.lost.CompareAndSwap(false, true) {
		return idempotency.Registration{}, errors.New("read tcp: i/o timeout")
	}
	return reg, err
}

// A registration that landed but whose reply was lost is answered 503
// "retry later" and released (by its own token): the retry runs, once,
// instead of meeting 409 in flight for the whole window.
func TestALostRegistrationReplyIsReleasedForTheRetry(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		store := &lostRegisterReply{Store: b.store}
		mw, err := idempotency.New(idempotency.Config{Store: store, SingleTenant: true, Archive: b.reader, ArchiveTimeout: 30 * time.Second})
		require.NoError(t, err)
		h := &charges{}
		srv := mw.Wrap(h)
		require.Equal(t, 503, post(srv, "lost-reply", `{}`).Code)
		retry := post(srv, "lost-reply", `{}`)
		require.Equal(t, 201, retry.Code, retry.Body.String())
		require.Equal(t, 201, post(srv, "lost-reply", `{}`).Code)
		require.EqualValues(t, 1, h.calls.Load())
	})
}

// Complete and Release act only on the entry registered with their token:
// a request holding another token (a duplicate of the same request, the
// same fingerprint) neither completes nor frees it. An entry registered
// without a token (an older writer's) is matched without one.
func TestOnlyTheRegistrationsTokenCompletesOrReleasesIt(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		fp := dbtest.Fingerprint("same request")
		mine, other := []byte("token-of-the-registration"), []byte("token-of-a-duplicate")
		reg, err := b.store.Register(ctx, idempotency.Registering{Key: "idem:v1:tokens", Fingerprint: fp, Token: mine, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, reg.Fresh)

		require.NoError(t, b.store.Release(ctx, "idem:v1:tokens", fp, other))
		require.NoError(t, b.store.Release(ctx, "idem:v1:tokens", fp, nil))
		again, err := b.store.Register(ctx, idempotency.Registering{Key: "idem:v1:tokens", Fingerprint: fp, Token: other, TTL: time.Hour})
		require.NoError(t, err)
		require.False(t, again.Fresh, "still registered: another token freed nothing")

		c := idempotency.Completion{Fingerprint: fp, Status: 201, Body: []byte(`{"id":"ch_1"}`)}
		c.Token = other
		require.ErrorIs(t, b.store.Complete(ctx, "idem:v1:tokens", c), idempotency.ErrNotInFlight)
		c.Token = mine
		require.NoError(t, b.store.Complete(ctx, "idem:v1:tokens", c))

		legacy, err := b.store.Register(ctx, idempotency.Registering{Key: "idem:v1:no-token", Fingerprint: fp, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, legacy.Fresh)
		require.NoError(t, b.store.Release(ctx, "idem:v1:no-token", fp, mine))
		require.NoError(t, b.store.Release(ctx, "idem:v1:no-token", fp, nil))
		fresh, err := b.store.Register(ctx, idempotency.Registering{Key: "idem:v1:no-token", Fingerprint: fp, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, fresh.Fresh, "released without a token")
	})
}

// A middleware upgraded before its database was migrated (no registration
// column yet) still registers, completes and releases, without tokens.
func TestThePostgresStoreWorksBeforeTheTokenMigration(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := b.db.Pool.Exec(context.Background(), "ALTER TABLE idempotency_keys DROP COLUMN registration")
	require.NoError(t, err)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	require.Equal(t, 201, post(srv, "before-008", `{}`).Code)
	again := post(srv, "before-008", `{}`)
	require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
	failing := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	require.Equal(t, 503, post(failing, "before-008-released", `{}`).Code)
	require.Equal(t, 201, post(srv, "before-008-released", `{}`).Code, "the 503 released its key")
	require.EqualValues(t, 2, h.calls.Load())
}

// failRegister fails Register without reaching the store (a connection
// refused before the statement was sent) while fail is set.
type failRegister struct {
	idempotency.Store
	fail atomic.Bool
}

func (f *failRegister) Register(ctx context.Context, req idempotency.Registering) (idempotency.Registration, error) {
	if f.fail.Load() {
		return idempotency.Registration{}, errors.New("dial tcp: connection refused")
	}
	return f.Store.Register(ctx, req)
}

// A Register that failed before it landed is released by its token like
// one whose reply was lost; on a database without the registration column
// (no tokens kept) that release must not match a concurrent duplicate's
// entry by key and fingerprint: the duplicate in flight stays in flight.
func TestAFailedRegisterNeverFreesADuplicatesEntry(t *testing.T) {
	t.Parallel()
	for _, migrated := range []bool{true, false} {
		b := setup(t, pg)
		if !migrated {
			_, err := b.db.Pool.Exec(context.Background(), "ALTER TABLE idempotency_keys DROP COLUMN registration")
			require.NoError(t, err)
		}
		store := &failRegister{Store: b.store}
		b.store = store
		h := &charges{block: make(chan struct{}), started: make(chan struct{}, 1)}
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)
		done := make(chan int)
		go func() { done <- post(srv, "dup", `{"amount":1}`).Code }()
		<-h.started // the first request is running the charge

		store.fail.Store(true)
		require.Equal(t, 503, post(srv, "dup", `{"amount":1}`).Code, "migrated=%v", migrated)
		store.fail.Store(false)

		h2 := &charges{}
		c := post(b.middleware(t, idempotency.Config{}).Wrap(h2), "dup", `{"amount":1}`)
		close(h.block)
		require.Equal(t, 201, <-done)
		require.Equal(t, 409, c.Code, "migrated=%v: the first request is still in flight", migrated)
		require.Zero(t, h2.calls.Load(), "migrated=%v", migrated)
	}
}

// An archive that stalls past the whole completion budget (a lock held by
// a migration or a DDL statement) leaves the Redis store time to keep the
// completed hash without expiry: a retry replays the outcome, however late,
// and never runs the operation again.
func TestARedisCompletionWhoseArchiveStallsKeepsTheHash(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	ctx := context.Background()
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{})
	handler := srv.Wrap(h)

	stall, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = stall.Rollback(ctx) }()
	_, err = stall.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE ROW EXCLUSIVE MODE")
	require.NoError(t, err)
	first := post(handler, "stalled", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.Code)
	require.NoError(t, stall.Rollback(ctx))

	hash := b.prefix + "idem:v1:stalled"
	t.Cleanup(func() { b.redis.Del(context.Background(), hash) })
	require.Equal(t, time.Duration(-1), b.redis.PTTL(ctx, hash).Val(), "kept without expiry until archived")
	require.Equal(t, "completed", b.redis.HGet(ctx, hash, "state").Val())
	retry := post(handler, "stalled", `{"amount":1}`)
	require.Equal(t, first.Body.String(), retry.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
}

// A slow archive (a write of several seconds, within the completion budget
// less the Redis steps' reserve) is written at the first attempt, and the
// hash keeps its expiry.
func TestARedisCompletionWhoseArchiveIsSlowIsArchived(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	ctx := context.Background()
	h := &charges{}
	handler := b.middleware(t, idempotency.Config{}).Wrap(h)
	_, err := b.db.Pool.Exec(ctx, `
		CREATE FUNCTION slow_archive() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(6); RETURN NULL; END $$;
		CREATE TRIGGER slow_archive BEFORE INSERT ON idempotency_key_archive FOR EACH STATEMENT EXECUTE FUNCTION slow_archive()`)
	require.NoError(t, err)
	first := post(handler, "slow", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.Code)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:slow'"))
	require.Positive(t, b.redis.PTTL(ctx, b.prefix+"idem:v1:slow").Val(), "archived: the hash expires with its window")
}
