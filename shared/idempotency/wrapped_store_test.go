package idempotency_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// unwrapping is a decorator that says what it wraps.
type unwrapping struct{ idempotency.Store }

func (u unwrapping) Unwrap() idempotency.Store { return u.Store }

// A Redis store wrapped by a decorator that hides its CompletionArchiver
// still has an in-flight entry past its window answered from the archive,
// where its completion wrote the outcome when marking the hash failed: the
// entry carries it. Before, the answer was 409 with original_status 0 ("never
// completed"), which a client may take for "never ran".
func TestAWrappedRedisStoreStillAnswersACompletedOutcome(t *testing.T) {
	t.Parallel()
	for name, wrap := range map[string]func(idempotency.Store) idempotency.Store{
		"hiding":     func(s idempotency.Store) idempotency.Store { return wrapped{s} },
		"unwrapping": func(s idempotency.Store) idempotency.Store { return unwrapping{s} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, rds)
			b.store = wrap(b.store)
			b.redis.AddHook(failCompletion{}) // the hash stays in flight; the archive row is written
			h := &charges{}
			srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
			first := post(srv, "wrapped-outcome", `{}`)
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			time.Sleep(1100 * time.Millisecond)
			w := post(srv, "wrapped-outcome", `{}`)
			require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
			p := problemOf(t, w)
			require.EqualValues(t, 201, p["original_status"], w.Body.String())
			require.NotNil(t, p["resource_id"])
			require.EqualValues(t, 1, h.calls.Load())
		})
	}
}

// New looks through a wrapper that unwraps for the store's limits: a TTL
// the Redis store refuses is refused when the middleware is built, not
// answered 503 on every request.
func TestNewLooksThroughAnUnwrappingStore(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	_, err := idempotency.New(idempotency.Config{Store: unwrapping{b.store}, Archive: b.reader, SingleTenant: true, LiveTTL: 40 * 24 * time.Hour})
	require.ErrorContains(t, err, "is longer than this store allows")
	// AND a store that archives at completion needs an archive to read
	_, err = idempotency.New(idempotency.Config{Store: unwrapping{b.store}, SingleTenant: true})
	require.ErrorContains(t, err, "set Config.Archive to read them")
	_, err = idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true})
	require.ErrorContains(t, err, "set Config.Archive to read them")
}

// A resource id path that names no key of any response is refused, as
// the sweeper refuses it: every recorded id would be null.
func TestABadResourceIDPathIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	for _, path := range []string{"data..id", " id", "id.", "id\n"} {
		_, err := idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true, ResourceIDPath: path})
		require.ErrorContains(t, err, "resource id path", "%q", path)
	}
	_, err := idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true, ResourceIDPath: "data.charge.id"})
	require.NoError(t, err)
}
