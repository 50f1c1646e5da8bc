package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
)

// releaseBlip is a store whose releases fail (a connection reset, a
// failover) the first fail times; everything else goes through.
type releaseBlip struct {
	idempotency.Store
	fail  atomic.Int32
	tries atomic.Int32
}

// Unwrap lets the middleware see the store's own interfaces beneath.
func (s *releaseBlip) Unwrap() idempotency.Store { return s.Store }

func (s *releaseBlip) blip() error {
	s.tries.Add(1)
	if s.fail.Add(-1) >= 0 {
		return errors.New("release idempotency key: read tcp: connection reset by peer")
	}
	return nil
}

func (s *releaseBlip) Release(ctx context.Context, key string, fp, token []byte) error {
	if err := s.blip(); err != nil {
		return err
	}
	return s.Store.Release(ctx, key, fp, token)
}

func (s *releaseBlip) ReleaseBeforeRun(ctx context.Context, key string, fp, token []byte) error {
	if err := s.blip(); err != nil {
		return err
	}
	if br, ok := s.Store.(idempotency.BeforeRunReleaser); ok {
		return br.ReleaseBeforeRun(ctx, key, fp, token)
	}
	return s.Store.Release(ctx, key, fp, token)
}

// A late retry of an archived key registers a new live entry, finds the key
// in the archive and releases the entry. A release that failed once used to
// leave the entry in flight for its whole window: every retry was told 409
// in flight, "still being processed", though the archive had the answer.
// The release is tried again, and the next retry is answered from the
// archive, with both stores.
func TestAReleaseThatFailsOnceIsTriedAgain(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind)
			insertArchived(t, b, "idem:v1:release-blip")
			s := &releaseBlip{Store: b.store}
			s.fail.Store(1)
			b.store = s
			h := &charges{}
			srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
			for i := range 2 {
				w := post(srv, "release-blip", `{}`)
				require.Equal(t, http.StatusConflict, w.Code, "retry %d: %s", i, w.Body.String())
				require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"], "retry %d", i)
				require.EqualValues(t, 201, problemOf(t, w)["original_status"], "retry %d", i)
			}
			require.EqualValues(t, 3, s.tries.Load(), "one failed release, tried again, then the second retry's")
			require.EqualValues(t, 0, h.calls.Load())
		})
	}
}

// A release that fails on every attempt leaves the Postgres store's entry
// in flight until its window ends. The archive then still has the key's
// completed outcome, and that is the answer, not "never completed"
// (original_status 0), which a swept store's in-flight entry used to get
// without the archive being asked.
func TestAnEntryLeftInFlightByFailedReleasesIsAnsweredFromTheArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	insertArchived(t, b, "idem:v1:release-stuck")
	s := &releaseBlip{Store: b.store}
	s.fail.Store(1 << 20)
	b.store = s
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
	first := post(srv, "release-stuck", `{}`)
	require.Equal(t, "idempotency_key_expired", problemOf(t, first)["code"], first.Body.String())
	require.EqualValues(t, 4, s.tries.Load(), "every attempt was made")
	inWindow := post(srv, "release-stuck", `{}`)
	require.Equal(t, "idempotency_key_in_flight", problemOf(t, inWindow)["code"], "the entry stays in flight while its window lasts: %s", inWindow.Body)

	time.Sleep(1200 * time.Millisecond)
	after := post(srv, "release-stuck", `{}`)
	require.Equal(t, http.StatusConflict, after.Code, after.Body.String())
	require.Equal(t, "idempotency_key_expired", problemOf(t, after)["code"])
	require.EqualValues(t, 201, problemOf(t, after)["original_status"], "the archive holds the completed outcome: %s", after.Body)
	require.EqualValues(t, 0, h.calls.Load())
}

// lostReplyRelease is a store whose first release lands, then loses its
// reply (a connection reset after the commit), and returns only once the
// test lets it.
type lostReplyRelease struct {
	idempotency.Store
	calls   atomic.Int32
	landed  chan struct{}
	proceed chan struct{}
}

func (s *lostReplyRelease) Release(ctx context.Context, key string, fp, token []byte) error {
	err := s.Store.Release(ctx, key, fp, token)
	if s.calls.Add(1) == 1 {
		close(s.landed)
		<-s.proceed
		return errors.New("release idempotency key: read tcp: connection reset by peer")
	}
	return err
}

// A store that keeps no tokens (a database before migration 008) releases
// any token-less entry of the key and fingerprint. A release whose first
// attempt landed and lost its reply is not tried again: meanwhile the
// client's retry registered anew and runs, and a second attempt freed its
// entry, so that a third request ran the charge beside it.
func TestAReleaseWithoutATokenIsTriedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := b.db.Pool.Exec(context.Background(), "ALTER TABLE idempotency_keys DROP COLUMN registration")
	require.NoError(t, err)
	s := &lostReplyRelease{Store: livestore.NewPostgres(b.db.Pool), landed: make(chan struct{}), proceed: make(chan struct{})}
	b.store = s
	var calls atomic.Int32
	started := make(chan struct{}, 4)
	unblock := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError) // released for a retry
			return
		}
		started <- struct{}{}
		<-unblock
		w.WriteHeader(http.StatusCreated)
	})
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)

	first := make(chan int)
	go func() { first <- post(srv, "untokened", `{}`).Code }()
	<-s.landed // its entry is gone; the reply is "lost"
	second := make(chan int)
	go func() { second <- post(srv, "untokened", `{}`).Code }()
	<-started // the retry's charge runs
	close(s.proceed)
	require.Equal(t, http.StatusInternalServerError, <-first)

	third := make(chan *httptest.ResponseRecorder)
	go func() { third <- post(srv, "untokened", `{}`) }()
	select {
	case <-started:
		close(unblock)
		t.Fatal("a third request ran the handler beside the second")
	case w := <-third:
		close(unblock)
		require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
		require.Equal(t, "idempotency_key_in_flight", problemOf(t, w)["code"])
	}
	require.Equal(t, http.StatusCreated, <-second)
	require.EqualValues(t, 2, calls.Load())
	require.EqualValues(t, 1, s.calls.Load(), "one release, not retried without a token")
}
