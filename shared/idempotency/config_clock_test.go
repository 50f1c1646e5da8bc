package idempotency_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
)

// A TTL lowered and raised again between deploys (3s → 1s → 2s, standing in
// for 24h → 1h → 7d) while keys are live: each deploy is a new process with
// a store of its own. A key registered under the long TTL replays through
// the short one while its row lives, and is answered from the archive by
// every writer once swept.
func TestTTLLoweredAndRaisedWhileKeysLive(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	writer := func(ttl time.Duration) http.Handler {
		mw, err := idempotency.New(idempotency.Config{Store: livestore.NewPostgres(b.db.Pool), Archive: b.reader, SingleTenant: true,
			LiveTTL: ttl, ClockSkew: 5 * time.Minute, ArchiveTimeout: 30 * time.Second})
		require.NoError(t, err)
		return mw.Wrap(h)
	}
	long, short, mid := writer(3*time.Second), writer(time.Second), writer(2*time.Second)
	keys := []string{mintKey(uuidv7Key, time.Now()), mintKey(ulidKey, time.Now().Add(4*time.Minute)), mintKey(plainKey, time.Now())}
	for _, k := range keys {
		require.Equal(t, 201, post(long, k, `{}`).Code)
	}
	time.Sleep(1500 * time.Millisecond)
	sweepAll(t, b)
	for _, k := range keys {
		w := post(short, k, `{}`)
		require.Equal(t, "true", w.Header().Get(idempotency.HeaderReplayed), "%s: %d %s", k, w.Code, w.Body.String())
	}
	time.Sleep(2 * time.Second)
	require.EqualValues(t, len(keys), sweepAll(t, b))
	for _, k := range keys {
		for _, srv := range []http.Handler{short, mid, long} {
			w := post(srv, k, `{}`)
			require.Equal(t, 409, w.Code, "%s: %s", k, w.Body.String())
		}
	}
	require.EqualValues(t, len(keys), h.calls.Load())
}

// CLOCK_SKEW lowered from 1h to 0 after a key was stored 50 minutes ahead of
// the store's clock: once it expired, the narrow writer refuses it as ahead,
// and must answer it from the archive, never with a 400 that invites a new
// key, nor run it.
func TestSkewLoweredAfterAKeyStoredAhead(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		wide := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: time.Hour}).Wrap(h)
		narrow := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: 0}).Wrap(h)
		key := mintKey(ulidKey, time.Now().Add(50*time.Minute))
		require.Equal(t, 201, post(wide, key, `{}`).Code)
		time.Sleep(1200 * time.Millisecond)
		sweepAll(t, b)
		for _, srv := range []http.Handler{narrow, wide} {
			w := post(srv, key, `{}`)
			require.Equal(t, 409, w.Code, w.Body.String())
			require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"])
		}
		require.EqualValues(t, 1, h.calls.Load())
	})
}

// Keys minted long before they are sent (a client that pre-mints keys, a
// clock days behind): their rows expire long after their timestamps, and a
// late retry still finds them, through Readers whose host clocks run hours
// fast or slow.
func TestKeysMintedDaysBeforeSending(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: 5 * time.Minute}).Wrap(h)
		keys := []string{
			mintKey(uuidv7Key, time.Now().Add(-10*24*time.Hour)),
			mintKey(ulidKey, time.Now().Add(-3*24*time.Hour)),
			mintKey(ulidKey, time.Now().Add(-70*24*time.Hour)),
			mintKey(uuidv7Key, time.Now().Add(-400*24*time.Hour)),
		}
		for _, k := range keys {
			require.Equal(t, 201, post(srv, k, `{}`).Code)
		}
		time.Sleep(1200 * time.Millisecond)
		sweepAll(t, b)
		for _, off := range []time.Duration{0, 3 * time.Hour, -3 * time.Hour, 40 * 24 * time.Hour, -40 * 24 * time.Hour} {
			r, err := archive.NewReader(b.db.Pool, archive.Config{Now: func() time.Time { return time.Now().Add(off) }}, nil)
			require.NoError(t, err)
			other := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: 5 * time.Minute, Archive: r,
				Now: func() time.Time { return time.Now().Add(off) }}).Wrap(h)
			for _, k := range keys {
				w := post(other, k, `{}`)
				require.Equal(t, 409, w.Code, "offset %s, %s: %s", off, k, w.Body.String())
			}
		}
		require.EqualValues(t, len(keys), h.calls.Load())
	})
}
