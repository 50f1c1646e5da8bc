package livestore

import (
	"context"
	"fmt"
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
	"github.com/idemarchive/idemarchive/shared/keytime"
)

// A Redis store whose host clock runs 3 minutes ahead of the database's
// (ClockSkew left at its zero value) archives a key minted by that clock at
// completion. The same key retried against a Postgres store (default 5m
// skew) sharing the archive must be looked up, not skipped: the Redis
// store registered it by its own clock, so the database's cannot bound when.
func TestAKeyArchivedByARedisStoreWithAClockAheadIsNotSkipped(t *testing.T) {
	t.Parallel()
	rs, db := newRedisStore(t)
	ctx := context.Background()
	rs.now = func() time.Time { return time.Now().Add(3 * time.Minute) } // Redis host 3 min fast
	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)

	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})
	mw := func(s idempotency.Store, ttl, skew time.Duration) http.Handler {
		m, err := idempotency.New(idempotency.Config{Store: s, Archive: reader, LiveTTL: ttl, ClockSkew: skew, SingleTenant: true, ArchiveTimeout: 30 * time.Second})
		require.NoError(t, err)
		return m.Wrap(h)
	}
	viaRedis := mw(rs, time.Hour, 0)
	viaPG := mw(NewPostgres(db.Pool), 24*time.Hour, keytime.DefaultClockSkew)
	post := func(srv http.Handler, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set(idempotency.HeaderKey, key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}

	// The client's clock agrees with the Redis host's.
	key := dbtest.ULID(rs.now(), "")
	first := post(viaRedis, key)
	require.Equal(t, 201, first.Code, first.Body.String())
	rec, err := reader.Lookup(ctx, "idem:v1:"+key, nil)
	require.NoError(t, err, "the outcome is archived")
	require.Equal(t, 201, rec.Status)

	retry := post(viaPG, key)
	require.EqualValues(t, 1, calls.Load(), "the handler ran again for a key the archive holds: %d %s", retry.Code, retry.Body.String())
	require.Equal(t, http.StatusConflict, retry.Code, retry.Body.String())
	// Its window (an hour from the Redis host's clock) has not ended: the
	// live entry is the Redis store's, which the Postgres store never sees.
	require.Contains(t, retry.Body.String(), "idempotency_key_response_unavailable")
}
