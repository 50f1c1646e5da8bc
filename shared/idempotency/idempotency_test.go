package idempotency_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// charges is a handler that counts its executions and creates a charge.
type charges struct {
	calls   atomic.Int32
	status  int           // answer with this status (default 201)
	block   chan struct{} // when set, wait for it before answering
	panics  bool
	started chan struct{}
}

func (c *charges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.calls.Add(1)
	if c.started != nil {
		c.started <- struct{}{}
	}
	if c.block != nil {
		<-c.block
	}
	if c.panics {
		panic("handler bug")
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(max(c.status, 201))
	fmt.Fprintf(w, `{"id":"ch_%d","request":%s}`, n, body)
}

type bundle struct {
	db      *dbtest.DB
	store   idempotency.Store
	reader  *archive.Reader
	metrics *bytes.Buffer
	redis   *redis.Client
	prefix  string // of the Redis store's keys
}

type storeKind string

const (
	pg  storeKind = "postgres"
	rds storeKind = "redis"
)

func setup(t *testing.T, kind storeKind) bundle {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 0)
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	b := bundle{db: db, reader: reader, metrics: &bytes.Buffer{}}
	switch kind {
	case pg:
		b.store = livestore.NewPostgres(db.Pool)
	case rds:
		client, prefix := testenv.Redis(t)
		b.redis, b.prefix = client, prefix
		b.store = livestore.NewRedis(client, db.Pool, prefix)
	}
	return b
}

func (b bundle) middleware(t *testing.T, cfg idempotency.Config) *idempotency.Middleware {
	t.Helper()
	cfg.Store = b.store
	cfg.SingleTenant = cfg.Tenant == nil
	if cfg.Archive == nil {
		cfg.Archive = b.reader
	}
	// A loaded CI machine must not turn a slow lookup into a 503.
	cfg.ArchiveTimeout = cmp.Or(cfg.ArchiveTimeout, 30*time.Second)
	cfg.Metrics = metrics.New(b.metrics, "Test")
	mw, err := idempotency.New(cfg)
	require.NoError(t, err)
	return mw
}

func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.HeaderKey, key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), w.Body.String())
	var p map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	return p
}

func forEachStore(t *testing.T, fn func(t *testing.T, b bundle)) {
	for _, kind := range []storeKind{pg, rds} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t, kind))
		})
	}
}

func TestReplayConflictAndReuse(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)

		first := post(srv, "k-1", `{"amount":4500}`)
		require.Equal(t, 201, first.Code)
		require.Equal(t, "86400", first.Header().Get(idempotency.HeaderTTL), "the live window is published")
		require.Empty(t, first.Header().Get(idempotency.HeaderReplayed))

		again := post(srv, "k-1", `{"amount":4500}`)
		require.Equal(t, 201, again.Code)
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
		require.Equal(t, "application/json", again.Header().Get("Content-Type"))
		require.JSONEq(t, first.Body.String(), again.Body.String())
		require.EqualValues(t, 1, h.calls.Load(), "a replay does not run the handler")

		reused := post(srv, "k-1", `{"amount":9900}`)
		require.Equal(t, 422, reused.Code)
		require.Equal(t, "idempotency_key_reused", problemOf(t, reused)["code"])

		other := post(srv, "k-2", `{"amount":4500}`)
		require.Equal(t, 201, other.Code)
		require.EqualValues(t, 2, h.calls.Load())
	})
}

func TestKeyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	required := b.middleware(t, idempotency.Config{Required: true}).Wrap(h)
	optional := b.middleware(t, idempotency.Config{}).Wrap(h)

	w := post(required, "", `{}`)
	require.Equal(t, 400, w.Code)
	require.Equal(t, "idempotency_key_missing", problemOf(t, w)["code"])
	require.Equal(t, 201, post(optional, "", `{}`).Code, "without Required, no key passes through")

	for name, key := range map[string]string{
		"too long":     strings.Repeat("k", 256),
		"control char": "abc\x01def",
		"NUL":          "abc\x00def",
		"tab":          "abc\tdef",
	} {
		w := post(required, key, `{}`)
		require.Equal(t, 400, w.Code, name)
		require.Equal(t, "idempotency_key_invalid", problemOf(t, w)["code"], name)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, "")
	w = httptest.NewRecorder()
	required.ServeHTTP(w, r)
	require.Equal(t, 400, w.Code, "an empty key")
	require.Equal(t, 201, post(required, strings.Repeat("k", 255), `{}`).Code, "255 bytes is fine")
	require.Equal(t, 201, post(required, "a key: with/odd %chars", `{}`).Code)

	// By default a key is the header value as written, quotes and all, as
	// in releases before UnquoteKeys: "k" and k are two keys, and a value
	// that is not a valid quoted string is a key like any other
	calls := h.calls.Load()
	for _, key := range []string{`"as-written"`, `as-written`, `"unterminated`, `"inner"quote"`} {
		require.Equal(t, 201, post(required, key, `{}`).Code, key)
	}
	require.Equal(t, calls+4, h.calls.Load(), "four keys, each run once")

	// With UnquoteKeys, a quoted key (the draft's Structured Field String)
	// is refused when it is not a valid String, or when its content would
	// be as a bare key
	required = b.middleware(t, idempotency.Config{Required: true, UnquoteKeys: true}).Wrap(h)
	for name, key := range map[string]string{
		"unterminated":      `"abc`,
		"lone quote":        `"`,
		"empty string":      `""`,
		"inner quote":       `"ab"c"`,
		"bad escape":        `"ab\c"`,
		"trailing escape":   `"abc\"`,
		"non-ASCII":         `"clé"`,
		"content too long":  `"` + strings.Repeat("k", 256) + `"`,
		"quote, then more":  `"abc"def`,
		"control in string": "\"ab\x7fc\"",
	} {
		w := post(required, key, `{}`)
		require.Equal(t, 400, w.Code, name)
		require.Equal(t, "idempotency_key_invalid", problemOf(t, w)["code"], name)
	}
	require.Equal(t, 201, post(required, `"`+strings.Repeat("q", 255)+`"`, `{}`).Code, "255 bytes of content is fine")
	calls = h.calls.Load()
	require.Equal(t, 201, post(required, `"with \"escapes\" \\ and spaces"`, `{}`).Code)
	require.Equal(t, 201, post(required, `with "escapes" \ and spaces`, `{}`).Code)
	require.Equal(t, calls+1, h.calls.Load(), "the bare form of an escaped quoted key is a retry of it")
}

// The draft's header is a Structured Field String: with UnquoteKeys, a key
// sent quoted is the same key as its bare form, on either store. A retry in
// the other form is answered as a retry, and a quoted UUIDv7 keeps the
// timestamp that spares a fresh key its archive lookup.
func TestAQuotedKeyIsTheSameKeyAsItsBareForm(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		arch := &countingArchive{inner: b.reader}
		srv := b.middleware(t, idempotency.Config{Archive: arch, ClockSkew: keytime.DefaultClockSkew, UnquoteKeys: true}).Wrap(h)
		k := mintKey(uuidv7Key, time.Now())
		first := post(srv, `"`+k+`"`, `{}`)
		require.Equal(t, 201, first.Code, first.Body.String())
		if _, ok := b.store.(*livestore.Redis); !ok { // the Redis store looks every key up
			require.Zero(t, arch.calls.Load(), "a quoted fresh UUIDv7 key is not looked up in the archive")
		}
		replay := post(srv, k, `{}`)
		require.Equal(t, 201, replay.Code)
		require.JSONEq(t, first.Body.String(), replay.Body.String())
		require.EqualValues(t, 1, h.calls.Load(), "the bare form is a retry of the quoted one")
		require.JSONEq(t, first.Body.String(), post(srv, `"`+k+`"`, `{}`).Body.String())
		require.EqualValues(t, 1, h.calls.Load())
	})
}

func TestInFlightServerErrorsAndPanicsRelease(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		mw := b.middleware(t, idempotency.Config{})

		// In flight: 409 with Retry-After.
		slow := &charges{block: make(chan struct{}), started: make(chan struct{}, 1)}
		srv := mw.Wrap(slow)
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- post(srv, "slow", `{}`) }()
		<-slow.started
		w := post(srv, "slow", `{}`)
		require.Equal(t, 409, w.Code)
		require.Equal(t, "idempotency_key_in_flight", problemOf(t, w)["code"])
		require.Equal(t, "1", w.Header().Get("Retry-After"))
		close(slow.block)
		require.Equal(t, 201, (<-done).Code)

		// A 5xx releases the key: the retry runs the handler again.
		failing := &charges{status: 503}
		require.Equal(t, 503, post(mw.Wrap(failing), "flaky", `{}`).Code)
		require.Equal(t, 201, post(mw.Wrap(&charges{}), "flaky", `{}`).Code)

		// A panic releases the key too, and still panics to the server.
		require.Panics(t, func() { post(mw.Wrap(&charges{panics: true}), "boom", `{}`) })
		require.Equal(t, 201, post(mw.Wrap(&charges{}), "boom", `{}`).Code)
	})
}

func TestConcurrentRequestsRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)
		const n = 24
		codes := make([]int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				codes[i] = post(srv, "same-key", `{"amount":1}`).Code
			}()
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, h.calls.Load(), "exactly one execution")
		for _, c := range codes {
			require.Contains(t, []int{201, 409}, c)
		}
		require.Equal(t, 201, post(srv, "same-key", `{"amount":1}`).Code)
		require.EqualValues(t, 1, h.calls.Load())
	})
}

func TestLateRetryIsAnsweredFromTheArchive(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		// The runbook's probe: archived 6 hours ago, never live here.
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive
			(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
			VALUES ('idem:v1:probe', '\x00', 201, 'ch_probe', now() - interval '30 hours', now() - interval '6 hours')`)
		require.NoError(t, err)
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)

		w := post(srv, "probe", `{"amount":4500,"currency":"gbp"}`)
		require.Equal(t, 409, w.Code)
		p := problemOf(t, w)
		// The probe's archived fingerprint is \x00, not this request's: the
		// runbook expects idempotency_key_expired regardless, so a mismatch
		// against a fingerprint that is not a SHA-256 is not called reuse.
		require.Equal(t, "idempotency_key_expired", p["code"], p)
		require.EqualValues(t, 201, p["original_status"])
		require.Equal(t, "ch_probe", p["resource_id"])
		require.Contains(t, p, "created_at")
		require.Contains(t, p, "expired_at")
		require.Contains(t, p["detail"], "first used at")
		require.Zero(t, h.calls.Load(), "a late retry never runs the handler")
		require.Contains(t, b.metrics.String(), `"idempotency_expired_replay_total":1`)

		// The speculative registration was undone.
		reg, err := b.store.Register(ctx, idempotency.Registering{Key: "idem:v1:probe", Fingerprint: dbtest.Fingerprint("x"), TTL: time.Minute})
		require.NoError(t, err)
		require.True(t, reg.Fresh)
	})
}

func TestArchivedKeyWithADifferentBodyIs422(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	fp := idempotency.Fingerprint(http.MethodPost, "/v1/charges", []byte(`{"amount":4500}`))
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:old', $1, 201, 'ch_old', now() - interval '30 hours', now() - interval '6 hours')`, fp)
	require.NoError(t, err)
	srv := b.middleware(t, idempotency.Config{}).Wrap(&charges{})
	require.Equal(t, 409, post(srv, "old", `{"amount":4500}`).Code)
	w := post(srv, "old", `{"amount":9900}`)
	require.Equal(t, 422, w.Code)
	require.Equal(t, "idempotency_key_reused", problemOf(t, w)["code"])
}

// failingArchive is an archive that cannot be reached.
type failingArchive struct{ calls atomic.Int32 }

func (f *failingArchive) Lookup(context.Context, string, []byte) (archive.Record, error) {
	f.calls.Add(1)
	return archive.Record{}, errors.New("connection refused")
}

func TestArchiveUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	closed := b.middleware(t, idempotency.Config{Archive: &failingArchive{}}).Wrap(h)
	w := post(closed, "k", `{}`)
	require.Equal(t, 503, w.Code)
	require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	require.Zero(t, h.calls.Load(), "fail closed: no charge without knowing")

	open := b.middleware(t, idempotency.Config{Archive: &failingArchive{}, OnArchiveError: idempotency.FailOpen}).Wrap(h)
	require.Equal(t, 201, post(open, "k", `{}`).Code, "the key was released by the closed failure")
	require.EqualValues(t, 1, h.calls.Load())
}

func TestExpiredButUnsweptLiveKeyIs409Expired(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
	require.Equal(t, 201, post(srv, "k", `{}`).Code)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	w := post(srv, "k", `{}`)
	require.Equal(t, 409, w.Code)
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_expired", p["code"])
	require.Equal(t, "ch_1", p["resource_id"])
	require.EqualValues(t, 1, h.calls.Load())
}

// jsonBody answers 201 with its JSON.
type jsonBody string

func (b jsonBody) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(b))
}

// A late retry of an expired row is answered with the resource id the
// sweeper archives for it, before the sweep as after: for this package's
// rows and for other writers' (a response stored as jsonb or byte for byte,
// a resource_id column set or not, over the archive's bound), with paths
// through objects and arrays.
func TestALateRetryGetsTheSameResourceIDBeforeAndAfterTheSweep(t *testing.T) {
	t.Parallel()
	const asJSONB = `response = convert_from(response_raw, 'UTF8')::jsonb, response_raw = NULL, resource_id = NULL`
	for _, tc := range []struct {
		name, path, body, update string
		want                     any
	}{
		{"recorded", "id", `{"id":"ch_1"}`, `resource_id = resource_id`, "ch_1"},
		{"jsonb", "id", `{"id":"ch_1"}`, asJSONB, "ch_1"},
		{"jsonb nested", "data.charge.id", `{"data":{"charge":{"id":"ch_n\u00e9"}}}`, asJSONB, "ch_né"},
		{"jsonb array", "data.0.id", `{"data":[{"id":"ch_0"},{"id":"ch_1"}]}`, asJSONB, "ch_0"},
		{"jsonb array from the end", "data.-1.id", `{"data":[{"id":"ch_0"},{"id":"ch_1"}]}`, asJSONB, "ch_1"},
		{"jsonb number", "id", `{"id":12}`, asJSONB, nil},
		{"jsonb id over the bound", "id", `{"id":"` + strings.Repeat("x", 256) + `"}`, asJSONB, nil},
		{"raw, no id recorded", "id", `{"id":"ch_raw"}`, `response = NULL, resource_id = NULL`, nil},
		{"recorded over the bound", "id", `{"id":"ch_1"}`, `resource_id = repeat('x', 300)`, nil},
		{"recorded at the bound", "id", `{"id":"ch_1"}`, `resource_id = repeat('x', 255)`, strings.Repeat("x", 255)},
		{"recorded empty", "id", `{"id":"ch_1"}`, `resource_id = ''`, ""},
		// Deeper than encoding/json decodes (10,000 levels); jsonb holds it.
		{"jsonb nested deep", "id", `{"id":"ch_deep","x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, asJSONB, "ch_deep"},
		{"jsonb duplicate, the last wins", "id", `{"id":"ch_first","id":"ch_last"}`, asJSONB, "ch_last"},
		// Another writer's row still in flight with a response: the
		// sweeper reads the path in every state.
		{"jsonb in flight", "id", `{"id":"ch_1"}`, `state = 'in_flight', status_code = NULL, ` + asJSONB, "ch_1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pg)
			srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour, ResourceIDPath: tc.path}).Wrap(jsonBody(tc.body))
			require.Equal(t, 201, post(srv, "k", `{}`).Code)
			_, err := b.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET `+tc.update+`,
				created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'`)
			require.NoError(t, err)
			for _, when := range []string{"before the sweep", "after the sweep"} {
				w := post(srv, "k", `{}`)
				require.Equal(t, 409, w.Code, when)
				p := problemOf(t, w)
				require.Equal(t, "idempotency_key_expired", p["code"], when)
				require.Equal(t, tc.want, p["resource_id"], when)
				if when == "before the sweep" {
					s, err := sweep.New(b.db.Pool, sweep.Config{BatchSize: 1000, Pause: 0, ResourceIDPath: tc.path}, nil, nil)
					require.NoError(t, err)
					res, err := s.Run(context.Background())
					require.NoError(t, err)
					require.EqualValues(t, 1, res.Moved)
				}
			}
		})
	}
}

func TestTenantsNeverCollide(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	mw := b.middleware(t, idempotency.Config{Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }})
	srv := mw.Wrap(h)
	send := func(tenant string) int {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, "shared")
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w.Code
	}
	require.Equal(t, 201, send("acme"))
	require.Equal(t, 201, send("acme:shared"))
	require.Equal(t, 201, send("globex"))
	// A tenant PostgreSQL text cannot hold is escaped into the scope, never a 5xx.
	require.Equal(t, 201, send("ac\x00me"))
	require.Equal(t, 201, send("ac\x00me"), "a replay")
	require.EqualValues(t, 4, h.calls.Load())
	require.Equal(t, "idem:v1t:ac%00me:k", idempotency.ScopedKey("ac\x00me", "k"))
	require.Equal(t, "idem:v1t:acme%3Ashared:k", idempotency.ScopedKey("acme:shared", "k"))
	require.Equal(t, "idem:v1:probe", idempotency.ScopedKey("", "probe"))
}

// The Redis store writes the archive row before it marks the key completed:
// a crash between the two must leave an archive row behind, never a
// completed key without one.
func TestRedisArchivesBeforeCompleting(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	ctx := context.Background()
	srv := b.middleware(t, idempotency.Config{}).Wrap(&charges{})
	require.Equal(t, 201, post(srv, "done", `{}`).Code)
	rec, err := b.reader.Lookup(ctx, "idem:v1:done", nil)
	require.NoError(t, err, "archived at completion")
	require.Equal(t, 201, rec.Status)
	require.Equal(t, "ch_1", *rec.ResourceID)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), rec.ExpiredAt, time.Minute, "expired_at is the key's end of window")

	// Crash between the writes: the Redis completion never happens.
	b.redis.AddHook(failCompletion{})
	h := &charges{}
	crashing := b.middleware(t, idempotency.Config{}).Wrap(h)
	require.Equal(t, 201, post(crashing, "crash", `{}`).Code, "the client still gets its answer")
	rec, err = b.reader.Lookup(ctx, "idem:v1:crash", nil)
	require.NoError(t, err, "the archive row exists although the completion was lost")
	require.Equal(t, 201, rec.Status)
	w := post(crashing, "crash", `{}`)
	require.Equal(t, 409, w.Code)
	require.Equal(t, "idempotency_key_in_flight", problemOf(t, w)["code"], "retries wait, they never run again")
	require.EqualValues(t, 1, h.calls.Load())
}

// failCompletion makes the Redis completion script fail, as a crash would.
type failCompletion struct{}

func (failCompletion) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failCompletion) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, "'completed'") {
				return errors.New("connection reset by peer")
			}
		}
		// The completion script: 9 arguments beside the hash's key (the
		// registration's has 6).
		if strings.HasPrefix(strings.ToLower(cmd.Name()), "evalsha") && len(cmd.Args()) >= 13 {
			return errors.New("connection reset by peer")
		}
		return next(ctx, cmd)
	}
}
func (failCompletion) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Completion must work in every statement execution mode (exec and
// simple_protocol are the RDS Proxy modes), and replay any body exactly.
func TestPostgresStoreInEveryExecModeReplaysBodiesExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := database.Open(context.Background(), database.Config{URL: b.db.URL, ExecMode: mode}, nil)
			require.NoError(t, err)
			defer pool.Close()
			mw, err := idempotency.New(idempotency.Config{Store: livestore.NewPostgres(pool), SingleTenant: true})
			require.NoError(t, err)
			for i, tc := range []struct{ ct, body string }{
				{"application/json", `{"id":"ch_1","nested":{"a":[1,2]}}`},
				{"application/octet-stream", "\x00\xff binary \x01"},
				{"text/plain; charset=latin1", "caf\xe9"},
				{"application/json", `not json at all`},
				// Valid JSON with key order and spacing of its own, and JSON
				// that jsonb rejects: all replayed exactly.
				{"application/json", `{"z":1,  "id":"ch_2", "a":2}`},
				{"application/json", `{"id":"ch_3","note":"\u0000"}`},
				{"application/json", `{"id":"ch_4","s":"\ud800"}`},
				{"application/json", `{"id":"ch_5","n":1e1000000}`},
			} {
				calls := 0
				srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					calls++
					w.Header().Set("Content-Type", tc.ct)
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(tc.body))
				}))
				key := fmt.Sprintf("%s-%d", mode, i)
				require.Equal(t, 201, post(srv, key, `{}`).Code)
				again := post(srv, key, `{}`)
				require.Equal(t, 201, again.Code, again.Body.String())
				require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "%s %q", tc.ct, tc.body)
				require.Equal(t, tc.ct, again.Header().Get("Content-Type"))
				require.Equal(t, tc.body, again.Body.String(), "replayed byte for byte")
				if id, ok := strings.CutPrefix(tc.body, `{"id":"`); ok {
					var rid *string
					require.NoError(t, b.db.Pool.QueryRow(context.Background(),
						"SELECT resource_id FROM idempotency_keys WHERE scoped_key = $1", idempotency.ScopedKey("", key)).Scan(&rid))
					require.NotNil(t, rid, "resource id of %s", tc.body)
					require.Equal(t, id[:4], *rid)
				}
				require.Equal(t, 1, calls)
			}
		})
	}
}

// blockingArchive waits until the caller gives up, as a slow archive does
// when the client disconnects; started is signalled when a lookup begins.
type blockingArchive struct{ started chan struct{} }

func (a blockingArchive) Lookup(ctx context.Context, _ string, _ []byte) (archive.Record, error) {
	a.started <- struct{}{}
	<-ctx.Done()
	return archive.Record{}, ctx.Err()
}

func TestAClientThatGoesAwayStillReleasesTheKey(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		arch := blockingArchive{started: make(chan struct{}, 1)}
		srv := b.middleware(t, idempotency.Config{Archive: arch}).Wrap(&charges{})
		ctx, cancel := context.WithCancel(context.Background())
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(ctx)
		r.Header.Set(idempotency.HeaderKey, "gone")
		go func() { <-arch.started; cancel() }() // the key is registered by then
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		require.Equal(t, 503, w.Code)
		// The key is free again: no 24-hour "in flight" left behind.
		reg, err := b.store.Register(context.Background(), idempotency.Registering{Key: "idem:v1:gone", Fingerprint: dbtest.Fingerprint("x"), TTL: time.Minute})
		require.NoError(t, err)
		require.True(t, reg.Fresh)
	})
}

// noArchiveInsertPool is a pool whose role may record itself as a writer
// but not insert into the archive.
func noArchiveInsertPool(t *testing.T, b bundle) *pgxpool.Pool {
	t.Helper()
	role := "no_insert_" + mintKey(plainKey, time.Now())[6:18]
	for _, stmt := range []string{
		"CREATE ROLE " + role + " NOLOGIN",
		"GRANT " + schema.ReaderRole + " TO " + role,
		"GRANT INSERT, UPDATE ON idempotency_writers TO " + role,
	} {
		_, err := b.db.Pool.Exec(context.Background(), stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	return b.db.NewPool(t, dbtest.AsRole(role))
}

// When the archive row cannot be written, the Redis key is kept (completed,
// without expiry) so that it keeps replaying: it must never run twice. The
// store's error reaches the log for the operator to reconcile, though the
// completion's next attempt finds the key completed (ErrNotInFlight).
func TestRedisKeepsAKeyItCouldNotArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	client, prefix := testenv.Redis(t)
	var logs strings.Builder
	mw, err := idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, noArchiveInsertPool(t, b), prefix), SingleTenant: true, Archive: b.reader,
		LiveTTL: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	h := &charges{}
	srv := mw.Wrap(h)
	require.Equal(t, 201, post(srv, "unarchived", `{}`).Code)
	require.Contains(t, logs.String(), "archive idempotency key at completion", "logs: %q", logs.String())
	ttl, err := client.TTL(context.Background(), prefix+"idem:v1:unarchived").Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "no expiry: the key is never forgotten")
	again := post(srv, "unarchived", `{}`)
	require.Equal(t, 201, again.Code)
	require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 1, h.calls.Load())
}

func TestTenantScopePlusKeyIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	srv := b.middleware(t, idempotency.Config{Tenant: func(*http.Request) string { return strings.Repeat("ж", 60) }}).Wrap(&charges{})
	w := post(srv, strings.Repeat("k", 255), `{}`)
	require.Equal(t, 400, w.Code)
	require.Contains(t, problemOf(t, w)["detail"], "exceed")
}

func TestInformationalStatusIsNeverTheRecordedOne(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		calls := 0
		srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"ch_hints"}`))
		}))
		first := post(srv, "early-hints", `{}`)
		require.Equal(t, http.StatusCreated, first.Code)
		again := post(srv, "early-hints", `{}`)
		require.Equal(t, http.StatusCreated, again.Code, "the replay must carry the final status, not 103")
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
		require.Equal(t, 1, calls)
	})
}

func TestTheFingerprintCoversTheQueryString(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b bundle) {
		h := &charges{}
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)
		send := func(target string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{"amount":100}`))
			r.Header.Set(idempotency.HeaderKey, "refund-1")
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)
			return w
		}
		require.Equal(t, 201, send("/v1/refunds?charge=ch_1").Code)
		require.Equal(t, 201, send("/v1/refunds?charge=ch_1").Code, "the same request replays")
		other := send("/v1/refunds?charge=ch_2")
		require.Equal(t, http.StatusUnprocessableEntity, other.Code, other.Body.String())
		require.Equal(t, "idempotency_key_reused", problemOf(t, other)["code"])
		require.EqualValues(t, 1, h.calls.Load())
	})
	// The exact bytes hashed, as documented.
	want := sha256.Sum256([]byte("POST\n/v1/refunds?charge=ch_1\n{\"amount\":100}"))
	u, _ := url.Parse("/v1/refunds?charge=ch_1")
	require.Equal(t, want[:], idempotency.Fingerprint("POST", idempotency.RequestTarget(u), []byte(`{"amount":100}`)))
	u, _ = url.Parse("/v1/charges")
	plain := sha256.Sum256([]byte("POST\n/v1/charges\n{}"))
	require.Equal(t, plain[:], idempotency.Fingerprint("POST", idempotency.RequestTarget(u), []byte(`{}`)), "no query: hashed as before")
}

// loseRedisHash deletes key's Redis hash, as an eviction, a restart or a
// failover to a replica that had not received it would.
func loseRedisHash(t *testing.T, b bundle, key string) {
	t.Helper()
	keys, err := b.redis.Keys(context.Background(), "*"+key).Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.NoError(t, b.redis.Del(context.Background(), keys...).Err())
}

// requireResponseLost asserts that a retry was answered from the archive
// inside its window: the original 201 and its resource id, the response
// itself gone. It returns the problem.
func requireResponseLost(t *testing.T, retry *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	require.Equal(t, http.StatusConflict, retry.Code, retry.Body.String())
	p := problemOf(t, retry)
	require.Equal(t, "idempotency_key_response_unavailable", p["code"], "the key has not expired")
	require.EqualValues(t, 201, p["original_status"])
	require.NotEmpty(t, p["resource_id"])
	return p
}

// A Redis hash lost inside its window (failover, restart, eviction): the
// archive row written at completion is the only record, so the retry is
// looked up whatever the key's timestamp says, never run again, and told the
// truth: the window has not ended, the response is gone.
func TestALostRedisHashIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
	for _, key := range []string{mintKey(ulidKey, time.Now()), "plain-key"} {
		require.Equal(t, 201, post(srv, key, `{}`).Code)
		loseRedisHash(t, b, key)

		p := requireResponseLost(t, post(srv, key, `{}`))
		expires, err := time.Parse(time.RFC3339, p["expires_at"].(string))
		require.NoError(t, err)
		require.True(t, expires.After(time.Now()))
	}
	require.EqualValues(t, 2, h.calls.Load(), "each key ran once")
}

// A Redis hash lost while its request is still running: the request
// completes with no hash to mark, so the store archives its outcome from the
// registration's times, and a retry is answered from the archive, never run
// again.
func TestARedisHashLostInFlightIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	// GIVEN a request whose hash is lost while its handler runs
	b := setup(t, rds)
	srv, h, key, first := runLosingItsHash(t, b, func() {})
	require.Equal(t, http.StatusCreated, first.Code)

	// WHEN its client, which never saw the answer, retries
	retry := post(srv, key, `{}`)

	// THEN the retry is the archived outcome, and the handler ran once
	requireResponseLost(t, retry)
	require.EqualValues(t, 1, h.calls.Load(), "the completed request ran again")
}

// runLosingItsHash runs a request on b's Redis store (LiveTTL 1 h, a fresh
// UUIDv7 key) whose hash is lost while its handler runs, then calls meanwhile
// before the handler answers. It returns the middleware, the handler (its
// later calls do not wait), the key and the request's answer.
func runLosingItsHash(t *testing.T, b bundle, meanwhile func()) (http.Handler, *charges, string, *httptest.ResponseRecorder) {
	t.Helper()
	h := &charges{block: make(chan struct{}), started: make(chan struct{}, 1)}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
	key := mintKey(uuidv7Key, time.Now())
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- post(srv, key, `{}`) }()
	<-h.started
	loseRedisHash(t, b, key)
	meanwhile()
	close(h.block)
	answer := <-done
	h.started = nil
	return srv, h, key, answer
}

// scripted is a handler whose n-th call (from 1) waits for gates[n], when
// set, and answers statuses[n] (201 when unset) with the id ch_<n>; it says
// on started which call began.
type scripted struct {
	calls    atomic.Int32
	started  chan int
	gates    map[int]chan struct{}
	statuses map[int]int
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := int(s.calls.Add(1))
	s.started <- n
	if g := s.gates[n]; g != nil {
		<-g
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(cmp.Or(s.statuses[n], http.StatusCreated))
	fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
}

// A request whose Redis hash was lost, and whose key another request
// registered again meanwhile, still archives its outcome when it completes:
// once that other request gives up (a 503 releases it), the next retry is
// answered from the archive instead of charging a third time. (The other
// request itself runs: while the first is in flight nothing records it.)
func TestALostRedisHashReRegisteredMeanwhileStillArchivesTheOutcome(t *testing.T) {
	t.Parallel()
	// GIVEN request A in flight, its hash lost, and its retry B running
	b := setup(t, rds)
	h := &scripted{started: make(chan int, 10), gates: map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}, statuses: map[int]int{2: http.StatusServiceUnavailable}}
	srv := b.middleware(t, idempotency.Config{LiveTTL: time.Hour}).Wrap(h)
	key := mintKey(uuidv7Key, time.Now())
	aDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aDone <- post(srv, key, `{}`) }()
	require.Equal(t, 1, <-h.started)
	loseRedisHash(t, b, key)
	bDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { bDone <- post(srv, key, `{}`) }()
	require.Equal(t, 2, <-h.started)

	// WHEN A completes with 201, B fails with 503 (releasing its entry),
	// and the client retries once more
	close(h.gates[1])
	require.Equal(t, http.StatusCreated, (<-aDone).Code)
	close(h.gates[2])
	require.Equal(t, http.StatusServiceUnavailable, (<-bDone).Code)
	retry := post(srv, key, `{}`)

	// THEN that retry is A's archived outcome, not a third run
	requireResponseLost(t, retry)
	require.EqualValues(t, 2, h.calls.Load(), "A's charge was not recorded: the retry ran again")
}

func TestTheTenantChoiceIsExplicit(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := idempotency.New(idempotency.Config{Store: b.store})
	require.ErrorContains(t, err, "SingleTenant", "no tenant function and no single-tenant choice must be refused")
	_, err = idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true, Tenant: func(*http.Request) string { return "a" }})
	require.Error(t, err, "both at once is ambiguous")

	h := &charges{}
	srv := b.middleware(t, idempotency.Config{Tenant: func(r *http.Request) string { return r.Header.Get("X-Account") }}).Wrap(h)
	send := func(account, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":1}`))
		r.Header.Set(idempotency.HeaderKey, key)
		if account != "" {
			r.Header.Set("X-Account", account)
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}
	first := send("acct_1", "k1")
	require.Equal(t, 201, first.Code)
	// Another caller with the same key and body never sees the first response.
	other := send("acct_2", "k1")
	require.Equal(t, 201, other.Code)
	require.Empty(t, other.Header().Get(idempotency.HeaderReplayed))
	require.NotEqual(t, first.Body.String(), other.Body.String())
	noCaller := send("", "k1")
	require.Equal(t, http.StatusUnauthorized, noCaller.Code)
	require.Equal(t, "idempotency_tenant_missing", problemOf(t, noCaller)["code"])
	require.EqualValues(t, 2, h.calls.Load())
}

// A role, database or parameter group may set another DateStyle, or
// bytea_output = escape. In the exec and simple_protocol modes (RDS Proxy's)
// results come back as text, which pgx reads only in ISO dates and hex
// bytea: the Postgres store and the Reader pin their own, so that
// registrations, replays and late retries work in every mode.
func TestThePostgresStoreWorksUnderAnyDateStyleOrByteaOutput(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:late', '\x00', 201, 'ch_late', now() - interval '30 hours', now() - interval '6 hours')`)
	require.NoError(t, err)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := b.db.NewPool(t, dbtest.WithParam("DateStyle", "SQL, DMY"), dbtest.WithParam("TimeZone", "America/St_Johns"),
				dbtest.WithParam("bytea_output", "escape"), func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			store := livestore.NewPostgres(pool)
			key := "idem:v1:datestyle-" + mode.String()
			first, err := store.Register(ctx, idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint("a"), TTL: time.Hour})
			require.NoError(t, err)
			require.True(t, first.Fresh)
			require.WithinDuration(t, time.Now(), first.Entry.CreatedAt, time.Minute)
			again, err := store.Register(ctx, idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint("a"), TTL: time.Hour})
			require.NoError(t, err)
			require.False(t, again.Fresh)
			require.True(t, first.Entry.CreatedAt.Equal(again.Entry.CreatedAt), "%v and %v", first.Entry.CreatedAt, again.Entry.CreatedAt)
			require.True(t, first.Entry.ExpiresAt.Equal(again.Entry.ExpiresAt))

			reader, err := archive.NewReader(pool, archive.Config{}, nil)
			require.NoError(t, err)
			mw, err := idempotency.New(idempotency.Config{Store: store, Archive: reader, SingleTenant: true, ArchiveTimeout: 30 * time.Second})
			require.NoError(t, err)
			h := &charges{}
			w := post(mw.Wrap(h), "late", `{}`)
			require.Equal(t, 409, w.Code, w.Body.String())
			require.Equal(t, "ch_late", problemOf(t, w)["resource_id"])
			require.Zero(t, h.calls.Load())

			// A retry of a completed request is replayed: the store reads
			// the stored fingerprint and response back as text.
			fresh := "replay-" + mode.String()
			original := post(mw.Wrap(h), fresh, `{"amount":1}`)
			require.Equal(t, http.StatusCreated, original.Code, original.Body.String())
			replay := post(mw.Wrap(h), fresh, `{"amount":1}`)
			require.Equal(t, http.StatusCreated, replay.Code, replay.Body.String())
			require.Equal(t, original.Body.String(), replay.Body.String())
			require.EqualValues(t, 1, h.calls.Load())
		})
	}
}

// Negative durations and sizes are refused when the middleware is built,
// not discovered as a 503 on every lookup or a 413 on every body.
func TestNegativeSettingsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	for name, cfg := range map[string]idempotency.Config{
		"retry after":    {RetryAfter: -time.Second},
		"max body bytes": {MaxBodyBytes: -1},
	} {
		cfg.Store, cfg.SingleTenant = b.store, true
		_, err := idempotency.New(cfg)
		require.ErrorContains(t, err, "must not be negative", name)
	}
	// No lookup fits in an ArchiveTimeout this short (the Reader keeps a
	// margin before its deadline): every lookup would fail, and FailOpen
	// would run every key unchecked.
	for _, d := range []time.Duration{-time.Second, time.Nanosecond, time.Millisecond, idempotency.MinArchiveTimeout - 1} {
		_, err := idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true, ArchiveTimeout: d, OnArchiveError: idempotency.FailOpen})
		require.ErrorContains(t, err, "archive timeout must be at least 10ms", d.String())
	}
	_, err := idempotency.New(idempotency.Config{Store: b.store, SingleTenant: true, ArchiveTimeout: idempotency.MinArchiveTimeout})
	require.NoError(t, err)
	// A nil store pointer would panic on the first request.
	var store *livestore.Postgres
	_, err = idempotency.New(idempotency.Config{Store: store, SingleTenant: true})
	require.ErrorContains(t, err, "idempotency: Store is a nil *livestore.Postgres")
}

// A completed Redis hash whose status no writer of this package leaves
// (written by hand, or damaged) is answered with a 500 problem, neither
// replayed (net/http panics on a status below 100) nor run again.
func TestACompletedEntryWithoutAValidStatusIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	key := mintKey(plainKey, time.Now())
	require.Equal(t, http.StatusCreated, post(srv, key, `{}`).Code)
	keys, err := b.redis.Keys(context.Background(), "*"+key).Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	for _, status := range []string{"0", "", "99", "600", "1000", "-201"} {
		require.NoError(t, b.redis.HSet(context.Background(), keys[0], "status", status).Err())
		w := post(srv, key, `{}`)
		require.Equal(t, http.StatusInternalServerError, w.Code, "status %q", status)
		require.Equal(t, "idempotency_record_invalid", problemOf(t, w)["code"], "status %q", status)
	}
	require.EqualValues(t, 1, h.calls.Load())
}
