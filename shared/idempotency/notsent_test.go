package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
)

// releaseCounter is a store that counts the releases asked of it.
type releaseCounter struct {
	idempotency.Store
	releases atomic.Int32
}

func (s *releaseCounter) Release(ctx context.Context, key string, fp, token []byte) error {
	s.releases.Add(1)
	return s.Store.Release(ctx, key, fp, token)
}

// A request whose context ends while its registration waits for a pool
// connection sent nothing: it is answered 503 at once, without a release
// that would wait for a connection of the same exhausted pool to delete
// nothing.
func TestAnUnsentRegistrationIsAnsweredWithoutARelease(t *testing.T) {
	t.Parallel()
	// GIVEN a Postgres store whose only connection is busy
	b := setup(t, pg)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	store := &releaseCounter{Store: livestore.NewPostgres(pool)}
	b.store = store
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	require.Equal(t, http.StatusCreated, post(srv, "warm", `{}`).Code)
	busy, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer busy.Release()

	// WHEN a request with 200 ms left comes
	rctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(rctx)
	r.Header.Set(idempotency.HeaderKey, "pool-exhausted")
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)

	// THEN it is a 503 that asked for no release, and its handler never ran
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "idempotency_store_unavailable", problemOf(t, w)["code"])
	require.NotEmpty(t, w.Header().Get("Retry-After"))
	require.Zero(t, store.releases.Load(), "a registration never sent was released")
	require.EqualValues(t, 1, h.calls.Load())
}

// A store error that does not say "not sent" is still released: its
// registration may have landed with its reply lost.
func TestARegisterErrorThatMayHaveLandedIsReleased(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	store := &releaseCounter{Store: failingRegister{b.store, errors.New("connection reset")}}
	b.store = store
	srv := b.middleware(t, idempotency.Config{}).Wrap(&charges{})
	w := post(srv, "maybe-landed", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.EqualValues(t, 1, store.releases.Load())

	store.Store = failingRegister{b.store, errors.Join(idempotency.ErrNotSent, context.DeadlineExceeded)}
	require.Equal(t, http.StatusServiceUnavailable, post(srv, "never-sent", `{}`).Code)
	require.EqualValues(t, 1, store.releases.Load(), "no release for what was never sent")
}

// failingRegister fails every registration with err.
type failingRegister struct {
	idempotency.Store
	err error
}

func (s failingRegister) Register(context.Context, idempotency.Registering) (idempotency.Registration, error) {
	return idempotency.Registration{}, s.err
}
