package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mrand "math/rand/v2"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// keyKind is how a client mints its keys.
type keyKind int

const (
	ulidKey keyKind = iota
	uuidv7Key
	plainKey // no timestamp (a UUIDv4, an order number)
)

// mintKey returns a key of kind whose timestamp (if it carries one) is at.
func mintKey(kind keyKind, at time.Time) string {
	var random [10]byte
	_, _ = rand.Read(random[:])
	ms := uint64(at.UnixMilli())
	switch kind {
	case ulidKey:
		const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
		var b strings.Builder
		for i := 9; i >= 0; i-- {
			b.WriteByte(crockford[(ms>>(5*uint(i)))&31])
		}
		for _, c := range random[:16*5/8] {
			b.WriteByte(crockford[c&31])
		}
		for b.Len() < 26 {
			b.WriteByte('0')
		}
		return b.String()
	case uuidv7Key:
		h := fmt.Sprintf("%012x", ms&(1<<48-1)) + "7" + hex.EncodeToString(random[:2])[:3] + "8" + hex.EncodeToString(random[2:])[:15]
		return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return "order-" + hex.EncodeToString(random[:])
}

func TestMintKeyCarriesItsTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 7, 8, 9, 123e6, time.UTC)
	for _, kind := range []keyKind{ulidKey, uuidv7Key} {
		ts, ok := keytime.FromKey("idem:v1:" + mintKey(kind, at))
		require.True(t, ok, kind)
		require.True(t, at.Equal(ts), "%v: %v", kind, ts)
	}
	_, ok := keytime.FromKey("idem:v1:" + mintKey(plainKey, at))
	require.False(t, ok)
}

// countingArchive counts the lookups that reach the archive.
type countingArchive struct {
	inner idempotency.Archive
	calls atomic.Int64
}

func (c *countingArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	c.calls.Add(1)
	return c.inner.Lookup(ctx, key, fp)
}

// The runbook's benefit where it is sound: with the Postgres store, fresh
// ULID and UUIDv7 keys from a sane clock need no archive query. Keys without
// a timestamp always do, and with the Redis store (which archives at
// completion, so a lost hash leaves the archive as the only record) every
// fresh key does.
func TestFreshTimestampedKeysNeedNoArchiveQuery(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		arch := &countingArchive{inner: b.reader}
		srv := b.middleware(t, idempotency.Config{Archive: arch, ClockSkew: keytime.DefaultClockSkew}).Wrap(&charges{})
		for i := range 20 {
			kind := []keyKind{ulidKey, uuidv7Key}[i%2]
			// Slightly slow and slightly fast clocks alike.
			offset := time.Duration(mrand.Int64N(int64(8*time.Minute))) - 4*time.Minute
			require.Equal(t, 201, post(srv, mintKey(kind, time.Now().Add(offset)), `{}`).Code)
		}
		want := int64(0)
		if b.redis != nil {
			want = 20
		}
		require.Equal(t, want, arch.calls.Load(), "archive queries for 20 fresh timestamped keys")

		before := arch.calls.Load()
		require.Equal(t, 201, post(srv, mintKey(plainKey, time.Now()), `{}`).Code)
		require.Equal(t, before+1, arch.calls.Load(), "a key without a timestamp is looked up")
	})
}

// A key whose timestamp lies further ahead than the skew is never stored
// (that would break the bound the skip and the pruning rest on): it is
// answered from the archive when the archive holds it, else refused with a
// 400 that says why, and never refused or run unchecked.
func TestAKeyAheadOfTheClock(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		// A writer that bounded nothing is on record (as after an upgrade):
		// an older writer may have stored keys far ahead of its clock. It is
		// recorded before any lookup, as the migration does.
		_, err := b.db.Pool.Exec(ctx, "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, false, '-infinity', 'infinity')")
		require.NoError(t, err)
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{ClockSkew: 5 * time.Minute}).Wrap(h)

		// Local time in UTC+2 read as UTC: two hours fast.
		key := mintKey(uuidv7Key, time.Now().Add(2*time.Hour))
		w := post(srv, key, `{}`)
		require.Equal(t, 400, w.Code, w.Body.String())
		p := problemOf(t, w)
		require.Equal(t, "idempotency_key_timestamp_ahead", p["code"])
		require.Contains(t, p["detail"], "more than 5m0s ahead")
		require.Zero(t, h.calls.Load())
		require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "nothing was registered")

		// The same key archived (stored by an earlier writer, two days
		// ahead of its clock): answered from the archive, not refused.
		far := mintKey(ulidKey, time.Now().Add(48*time.Hour))
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:" + far, Status: 201, ResourceID: ptr("ch_far"),
			CreatedAt: time.Now().Add(-30 * time.Hour), ExpiredAt: time.Now().Add(-6 * time.Hour), Fingerprint: emptyBodyFP})
		w = post(srv, far, `{}`)
		require.Equal(t, 409, w.Code, w.Body.String())
		require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"])
		require.Equal(t, "ch_far", problemOf(t, w)["resource_id"])

		// An archive that cannot answer: 503 even when failing open, because
		// the key can be neither run nor refused unchecked.
		open := b.middleware(t, idempotency.Config{Archive: &failingArchive{}, OnArchiveError: idempotency.FailOpen, ClockSkew: 5 * time.Minute}).Wrap(h)
		w = post(open, key, `{}`)
		require.Equal(t, 503, w.Code)
		require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
		require.Zero(t, h.calls.Load())

		// Zero skew is zero: a key a second ahead is refused.
		strict := b.middleware(t, idempotency.Config{ClockSkew: 0}).Wrap(h)
		require.Equal(t, 400, post(strict, mintKey(ulidKey, time.Now().Add(time.Second)), `{}`).Code)
		require.Equal(t, 201, post(strict, mintKey(ulidKey, time.Now().Add(-time.Second)), `{}`).Code)
	})
}

func ptr[T any](v T) *T { return &v }

// emptyBodyFP is the fingerprint of post(srv, key, `{}`).
var emptyBodyFP = idempotency.Fingerprint(http.MethodPost, "/v1/charges", []byte(`{}`))

// sweepAll moves every expired live row into the archive.
func sweepAll(t *testing.T, b bundle) int64 {
	t.Helper()
	s, err := sweep.New(b.db.Pool, sweep.Config{BatchSize: 1000, Pause: 0}, nil, nil)
	require.NoError(t, err)
	res, err := s.Run(context.Background())
	require.NoError(t, err)
	return res.Moved
}

// The cases the old skip rule got wrong, each end to end through a real
// sweep: a TTL raised after a key expired under the old one, and a client
// clock running fast within the skew. Each retry is answered from the
// archive, never run again.
func TestRaisedTTLAndFastClocksNeverRunARetry(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	short := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: time.Minute}).Wrap(h)
	// The operator raises LIVE_TTL to 72h: a new process, a new store.
	long, err := idempotency.New(idempotency.Config{Store: livestore.NewPostgres(b.db.Pool), Archive: b.reader, SingleTenant: true,
		LiveTTL: 72 * time.Hour, ClockSkew: time.Minute})
	require.NoError(t, err)
	raised := long.Wrap(h)

	keys := []string{
		mintKey(uuidv7Key, time.Now()),                     // a sane clock
		mintKey(ulidKey, time.Now().Add(50*time.Second)),   // fast, within the skew
		mintKey(uuidv7Key, time.Now().Add(-3*time.Second)), // slow
	}
	for _, k := range keys {
		require.Equal(t, 201, post(short, k, `{}`).Code)
	}
	time.Sleep(1100 * time.Millisecond)
	require.EqualValues(t, len(keys), sweepAll(t, b))
	for _, k := range keys {
		for _, srv := range []http.Handler{raised, short} {
			w := post(srv, k, `{}`)
			require.Equal(t, 409, w.Code, "%s: %s", k, w.Body.String())
			require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"])
		}
	}
	require.EqualValues(t, len(keys), h.calls.Load(), "each key ran once")
}

// While idempotency_writers records writers that bounded nothing (keys
// stored before the bound existed), no fresh key skips the archive and every
// lookup reads every partition.
func TestWritersThatBoundedNothingForceLookups(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := b.db.Pool.Exec(context.Background(), "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, false, '-infinity', 'infinity')")
	require.NoError(t, err)
	// An old writer stored this key with its clock two days fast; it expired
	// long ago. Its timestamp is now in the past, and within the skew of no one.
	key := mintKey(uuidv7Key, time.Now().Add(-time.Hour))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:" + key, Status: 201, ResourceID: ptr("ch_old"),
		CreatedAt: time.Now().Add(-50 * time.Hour), ExpiredAt: time.Now().Add(-26 * time.Hour), Fingerprint: emptyBodyFP})
	arch := &countingArchive{inner: b.reader}
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{Archive: arch, ClockSkew: time.Minute}).Wrap(h)
	require.Equal(t, 201, post(srv, mintKey(uuidv7Key, time.Now()), `{}`).Code)
	require.EqualValues(t, 1, arch.calls.Load(), "a fresh key is looked up")
	w := post(srv, key, `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	require.Equal(t, "ch_old", problemOf(t, w)["resource_id"])
	require.EqualValues(t, 1, h.calls.Load())
}

// A randomized soak through the middleware against real PostgreSQL, real
// Redis and a real sweep: clients with clocks from 48 hours slow to 48 hours
// fast (and many within a few TTLs of the server), keys with and without
// timestamps, writers with different TTLs and skews at once (a rolling deploy
// and TTL changes), retries across several TTLs, and, for Redis, completed
// hashes lost at random. It fails if any key runs twice, and checks that
// every path it means to exercise was taken.
func TestSoakNoKeyEverRunsTwice(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		soak(t, b, 8*time.Second)
	})
}

func soak(t *testing.T, b bundle, runFor time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	runs := map[string]int{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		mu.Lock()
		runs[key]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"id":"ch_%s"}`, key)
	})

	// Writers: several TTLs and skews live at once.
	arch := &countingArchive{inner: b.reader}
	var writers []http.Handler
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		for _, skew := range []time.Duration{0, 700 * time.Millisecond, 5 * time.Second} {
			store := b.store
			if b.redis == nil {
				store = livestore.NewPostgres(b.db.Pool) // each process has its own store
			}
			mw, err := idempotency.New(idempotency.Config{Store: store, Archive: arch, SingleTenant: true, LiveTTL: ttl, ClockSkew: skew, ArchiveTimeout: 30 * time.Second})
			require.NoError(t, err)
			writers = append(writers, mw.Wrap(handler))
		}
	}

	// Clients: each key is minted once by a client with its own clock.
	const nKeys = 240
	keys := make([]string, nKeys)
	for i := range keys {
		var offset time.Duration
		switch i % 4 {
		case 0: // anywhere from 48h slow to 48h fast
			offset = time.Duration(mrand.Int64N(int64(96*time.Hour))) - 48*time.Hour
		default: // within a few TTLs of the server, where the edges are
			offset = time.Duration(mrand.Int64N(int64(14*time.Second))) - 7*time.Second
		}
		keys[i] = mintKey(keyKind(i%3), time.Now().Add(offset))
	}

	// The sweeper runs throughout.
	var sweeps sync.WaitGroup
	sweeps.Add(1)
	go func() {
		defer sweeps.Done()
		s, err := sweep.New(b.db.Pool, sweep.Config{BatchSize: 100, Pause: 0}, nil, nil)
		if err != nil {
			t.Error(err)
			return
		}
		for ctx.Err() == nil {
			if _, err := s.Run(ctx); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
			time.Sleep(time.Duration(100+mrand.IntN(300)) * time.Millisecond)
		}
	}()

	var codes sync.Map // code -> *atomic.Int64
	count := func(code string) {
		v, _ := codes.LoadOrStore(code, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	deadline := time.Now().Add(runFor)
	var clients sync.WaitGroup
	for range 6 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			for time.Now().Before(deadline) {
				key := keys[mrand.IntN(len(keys))]
				srv := writers[mrand.IntN(len(writers))]
				if b.redis != nil && mrand.IntN(10) == 0 {
					// A lost hash: completed ones only (a hash lost while in
					// flight cannot be protected; see livestore.Redis).
					full := "*idem:v1:" + key
					if ks, _ := b.redis.Keys(ctx, full).Result(); len(ks) == 1 {
						if st, _ := b.redis.HGet(ctx, ks[0], "state").Result(); st == "completed" {
							b.redis.Del(ctx, ks[0])
							count("lost")
						}
					}
				}
				r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
				r.Header.Set(idempotency.HeaderKey, key)
				w := httptest.NewRecorder()
				srv.ServeHTTP(w, r)
				code := fmt.Sprint(w.Code)
				if w.Code != 201 && w.Header().Get("Content-Type") == "application/problem+json" {
					code = string(mustProblemCode(w.Body.Bytes()))
				} else if w.Header().Get(idempotency.HeaderReplayed) == "true" {
					code = "replayed"
				}
				count(code)
				time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond)
			}
		}()
	}
	clients.Wait()
	cancel()
	sweeps.Wait()

	mu.Lock()
	defer mu.Unlock()
	for key, n := range runs {
		require.LessOrEqual(t, n, 1, "key %s ran %d times", key, n)
	}
	got := map[string]int64{}
	codes.Range(func(k, v any) bool { got[k.(string)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("outcomes: %v; runs %d of %d keys; archive lookups %d", got, len(runs), nKeys, arch.calls.Load())
	for _, code := range []string{"201", "replayed", "idempotency_key_expired", "idempotency_key_timestamp_ahead"} {
		require.Positive(t, got[code], "the soak never produced %s: %v", code, got)
	}
	if b.redis != nil {
		require.Positive(t, got["lost"], "no hash was lost")
		require.Positive(t, got["idempotency_key_response_unavailable"]+got["idempotency_key_expired"])
	}
}

func mustProblemCode(body []byte) string {
	const marker = `"code":"`
	s := string(body)
	i := strings.Index(s, marker)
	if i < 0 {
		return "unparsed"
	}
	s = s[i+len(marker):]
	return s[:strings.IndexByte(s, '"')]
}

// Writers with different skews share one store (a rolling deploy that lowers
// CLOCK_SKEW, several services on one table). A key one of them stored is
// answered from its entry by all of them, never refused as "ahead".
func TestAKeyStoredByAWiderSkewIsAnsweredByEveryWriter(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		wide := b.middleware(t, idempotency.Config{ClockSkew: time.Hour}).Wrap(h)
		narrow := b.middleware(t, idempotency.Config{ClockSkew: 5 * time.Minute}).Wrap(h)
		key := mintKey(ulidKey, time.Now().Add(30*time.Minute))
		require.Equal(t, 201, post(wide, key, `{}`).Code)
		w := post(narrow, key, `{}`)
		require.Equal(t, 201, w.Code, w.Body.String())
		require.Equal(t, "true", w.Header().Get(idempotency.HeaderReplayed))
		require.EqualValues(t, 1, h.calls.Load())
	})
}

// The Redis store archives at completion; a Postgres store sharing the
// archive must never skip the lookup for a key the Redis store ran.
func TestRedisRowsAreNeverSkippedByAPostgresStore(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	client, prefix := testenv.Redis(t)
	h := &charges{}
	mr, err := idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, b.db.Pool, prefix), Archive: b.reader, SingleTenant: true, ClockSkew: 5 * time.Minute})
	require.NoError(t, err)
	key := mintKey(uuidv7Key, time.Now())
	require.Equal(t, 201, post(mr.Wrap(h), key, `{}`).Code)
	w := post(b.middleware(t, idempotency.Config{ClockSkew: 5 * time.Minute}).Wrap(h), key, `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	require.EqualValues(t, 1, h.calls.Load())

	// And its TTL is bounded by the partitions that exist ahead.
	_, err = idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, b.db.Pool, prefix), SingleTenant: true, LiveTTL: 100000 * time.Hour})
	require.ErrorContains(t, err, "longer than this store allows")
}

// A request that outlives the TTL with the Redis store: retries meanwhile get
// 409 expired (in flight), and its outcome is archived when it completes.
func TestARedisRequestThatOutlivesItsTTLNeverRunsTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	slow := &charges{block: make(chan struct{}), started: make(chan struct{}, 1)}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(slow)
	key := mintKey(plainKey, time.Now())
	done := make(chan int)
	go func() { done <- post(srv, key, `{}`).Code }()
	<-slow.started
	time.Sleep(1200 * time.Millisecond)
	w := post(srv, key, `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"])
	close(slow.block)
	require.Equal(t, 201, <-done)
	w = post(srv, key, `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	require.EqualValues(t, 1, slow.calls.Load())
}

// A lease first taken while the database clock ran fast records a first use
// in the future; the next renewal moves it back, so registrations made
// before it still count.
func TestALeaseFromAFastClockIsCorrected(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until)
		VALUES (1000, 0, true, now() + interval '1 hour', now() + interval '70 minutes')`)
	require.NoError(t, err)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Second, ClockSkew: 0}).Wrap(h)
	key := mintKey(uuidv7Key, time.Now().Add(-time.Second))
	require.Equal(t, 201, post(srv, key, `{}`).Code)
	time.Sleep(1100 * time.Millisecond)
	require.EqualValues(t, 1, sweepAll(t, b))
	w := post(srv, key, `{}`)
	require.Equal(t, 409, w.Code, w.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
}

// A live row inserted by a writer that enforced no skew (an older release of
// the middleware during a rolling deploy, a hand-written insert) records an
// unbounded writer: from then on no fresh key skips the archive.
func TestALeaselessInsertRecordsAnUnboundedWriter(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	arch := &countingArchive{inner: b.reader}
	srv := b.middleware(t, idempotency.Config{Archive: arch, ClockSkew: time.Minute}).Wrap(&charges{})
	require.Equal(t, 201, post(srv, mintKey(uuidv7Key, time.Now()), `{}`).Code)
	require.Zero(t, arch.calls.Load())

	writer := b.db.NewPool(t, dbtest.AsRole(schema.WriterRole))
	_, err := writer.Exec(context.Background(), `INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at)
		VALUES ('idem:v1:old-release', sha256('x'), now() + interval '1 day')`)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_writers WHERE NOT bounded"))
	require.Equal(t, 201, post(srv, mintKey(uuidv7Key, time.Now()), `{}`).Code)
	require.EqualValues(t, 1, arch.calls.Load(), "a fresh key is looked up")
}

// A reader role that may not read idempotency_writers still answers every
// lookup: it reads every partition instead.
func TestAReaderWithoutTheWritersGrantStillFindsKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	ctx := context.Background()
	role := "no_writers_" + strings.ToLower(mintKey(plainKey, time.Now())[6:14])
	_, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	_, err = b.db.Pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+b.db.Schema+" TO "+role+"; GRANT SELECT ON idempotency_key_archive TO "+role)
	require.NoError(t, err)
	key := "idem:v1:" + mintKey(ulidKey, time.Now().Add(-30*time.Hour))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: time.Now().Add(-6 * time.Hour)})
	r, err := archive.NewReader(b.db.NewPool(t, dbtest.AsRole(role)), archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
}

// Whether a Postgres live entry's window has ended is the database's to say,
// by the clock that set expires_at: a process clock hours ahead never answers
// a request still in flight "expired, never completed" (a client might then
// charge again under a new key), and one hours behind answers an expired
// entry as the archive will, not with a replay.
func TestALiveEntryExpiresByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)

	// GIVEN a middleware whose clock runs 2 hours ahead, and a request in
	// flight under a 1-hour TTL
	h := &scripted{started: make(chan int, 4), gates: map[int]chan struct{}{1: make(chan struct{})}}
	fast := b.middleware(t, idempotency.Config{LiveTTL: time.Hour, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }}).Wrap(h)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- post(fast, "slow-charge", `{}`) }()
	require.Equal(t, 1, <-h.started)

	// WHEN it is retried THEN the retry waits for it: in flight, not expired
	retry := post(fast, "slow-charge", `{}`)
	require.Equal(t, http.StatusConflict, retry.Code)
	require.Equal(t, "idempotency_key_in_flight", problemOf(t, retry)["code"])
	close(h.gates[1])
	require.Equal(t, http.StatusCreated, (<-done).Code)
	replay := post(fast, "slow-charge", `{}`)
	require.Equal(t, http.StatusCreated, replay.Code)
	require.Equal(t, "true", replay.Header().Get(idempotency.HeaderReplayed))

	// GIVEN a completed entry whose 1-second window has ended, and a
	// middleware whose clock runs 2 hours behind
	brief := b.middleware(t, idempotency.Config{LiveTTL: time.Second}).Wrap(h)
	require.Equal(t, http.StatusCreated, post(brief, "ended", `{}`).Code)
	time.Sleep(1100 * time.Millisecond)
	slow := b.middleware(t, idempotency.Config{LiveTTL: time.Hour, Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }}).Wrap(h)

	// WHEN it is retried THEN it is answered as expired, as the archive
	// will answer it once swept
	late := post(slow, "ended", `{}`)
	require.Equal(t, http.StatusConflict, late.Code)
	require.Equal(t, "idempotency_key_expired", problemOf(t, late)["code"])
	require.EqualValues(t, 2, h.calls.Load(), "each request ran once")
}

// Hosts sharing a Redis store answer a key in flight by the Redis server's
// clock, not their own: a host whose clock runs 2 h ahead answers a request
// one second into its hour, still running on another host, 409 in flight,
// not "expired, never completed" (which a client may take for "never ran"
// and charge again under a new key); once the server has ended the window,
// a host whose clock runs 2 h behind answers it expired.
func TestHostsSharingARedisStoreAgreeOnWhetherAWindowEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	slow := &charges{block: make(chan struct{}), started: make(chan struct{}, 1)}
	host := func(offset time.Duration) http.Handler {
		return b.middleware(t, idempotency.Config{LiveTTL: time.Hour, Now: func() time.Time { return time.Now().Add(offset) }}).Wrap(slow)
	}
	hostA, ahead, behind := host(0), host(2*time.Hour), host(-2*time.Hour)
	key := mintKey(plainKey, time.Now())
	done := make(chan int)
	go func() { done <- post(hostA, key, `{}`).Code }()
	<-slow.started
	defer func() {
		close(slow.block)
		require.Equal(t, http.StatusCreated, <-done)
	}()

	w := post(ahead, key, `{}`)
	require.Equal(t, http.StatusConflict, w.Code)
	require.Equal(t, "idempotency_key_in_flight", problemOf(t, w)["code"], "a host 2 h ahead, 1 s into a 1 h window")

	keys, err := b.redis.Keys(context.Background(), "*"+key).Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.NoError(t, b.redis.PExpire(context.Background(), keys[0], 10*time.Minute).Err()) // the window ended 5 min ago, on the server
	w = post(behind, key, `{}`)
	require.Equal(t, http.StatusConflict, w.Code)
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_expired", p["code"], "a host 2 h behind, after the server ended the window")
	require.EqualValues(t, 0, p["original_status"])
	require.EqualValues(t, 1, slow.calls.Load())
}
