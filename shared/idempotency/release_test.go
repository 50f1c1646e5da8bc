package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
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
