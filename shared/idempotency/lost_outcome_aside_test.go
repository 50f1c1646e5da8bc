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

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// gatedArchive is an archive that, while down is set, says so on entered
// and fails each lookup once gate is closed (an archive outage seen by a
// lookup that waits for it: a stalled connection, ArchiveTimeout).
type gatedArchive struct {
	inner   idempotency.Archive
	down    atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (a *gatedArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	if a.down.Load() {
		a.entered <- struct{}{}
		<-a.gate
		return archive.Record{}, errors.New("archive unreachable (simulated outage)")
	}
	return a.inner.Lookup(ctx, key, fp)
}

// Request A's hash is lost (a failover) while A runs, and the archive goes
// down. The client's retry B registers the key again, and its archive
// lookup fails in the same outage (FailClosed: 503, and B releases the
// key). A completes while B holds the key: its archive row fails, and its
// outcome, once dropped ("that registration runs the operation"), is kept
// aside in Redis. After the outage the next retry is answered A's outcome,
// and the charge never runs twice.
func TestALostOutcomeIsKeptForTheRetryAfterOneThatFailedClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	ctx := context.Background()
	arch := &gatedArchive{inner: b.reader, entered: make(chan struct{}, 4), gate: make(chan struct{})}
	h := &scripted{started: make(chan int, 10), gates: map[int]chan struct{}{1: make(chan struct{})}}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour, Archive: arch}).Wrap(h)
	key := mintKey(uuidv7Key, time.Now())

	// A runs; its hash is lost; the archive goes down.
	aDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aDone <- post(srv, key, `{}`) }()
	require.Equal(t, 1, <-h.started)
	loseRedisHash(t, b, key)
	_, err := b.db.Pool.Exec(ctx, `
CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'archive unavailable (simulated)'; END $$;
CREATE TRIGGER test_outage BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION test_refuse();`)
	require.NoError(t, err)
	arch.down.Store(true)

	// B, the client's retry, registers the key again; its lookup waits on
	// the outage.
	bDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { bDone <- post(srv, key, `{}`) }()
	<-arch.entered

	// A completes (every completion attempt) while B holds the key.
	close(h.gates[1])
	require.Equal(t, http.StatusCreated, (<-aDone).Code, "A charged")

	// B's lookup fails: 503, B's registration released.
	close(arch.gate)
	require.Equal(t, http.StatusServiceUnavailable, (<-bDone).Code)

	// The outage ends.
	arch.down.Store(false)
	_, err = b.db.Pool.Exec(ctx, "DROP TRIGGER test_outage ON idempotency_key_archive")
	require.NoError(t, err)

	// The next retry must not charge again.
	retry := post(srv, key, `{}`)
	t.Logf("retry: %d %s", retry.Code, retry.Body.String())
	require.EqualValues(t, 1, h.calls.Load(), "the retry ran the charge a second time (answer %d)", retry.Code)
	require.Equal(t, http.StatusCreated, retry.Code, "A's answer is replayed")
}
