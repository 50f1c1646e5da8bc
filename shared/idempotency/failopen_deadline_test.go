package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

type loggingArchive struct {
	t    *testing.T
	next idempotency.Archive
}

func (a loggingArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	start := time.Now()
	rec, err := a.next.Lookup(ctx, key, fp)
	dl, _ := ctx.Deadline()
	a.t.Logf("lookup %q after %s (deadline in %s): %v", key, time.Since(start), time.Until(dl), err)
	return rec, err
}

// With the archive's pool in exec mode (the RDS Proxy mode the README
// recommends) a lookup that waits on a lock is ended by the server's
// statement_timeout, which the Reader set to end 100 ms before the
// request's deadline: archive.ErrTimeout while the request's context is
// still live. The request's deadline, not the archive, cut the lookup
// short, so even FailOpen answers 503 and never runs the archived key.
func TestFailOpenNeverRunsAKeyWhoseLookupTheRequestDeadlineCut(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	insertArchived(t, b, "idem:v1:deadline-key2")
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.MaxConns = 2
	})
	reader, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, Archive: loggingArchive{t, reader}}).Wrap(h)
	require.Equal(t, http.StatusCreated, post(srv, "warm-up", `{}`).Code)
	require.Equal(t, 409, post(srv, "deadline-key2", `{}`).Code, "the archived key is answered from the archive")
	require.EqualValues(t, 1, h.calls.Load())

	// The archive waits on a lock (partition DDL, an operator's LOCK).
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_archive_plain_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	// A retry that has 800 ms left (a client or server timeout), far more
	// than the Reader's 100 ms margin.
	rctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(rctx)
	r.Header.Set(idempotency.HeaderKey, "deadline-key2")
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	require.EqualValues(t, 1, h.calls.Load(), "an archived key ran again under FailOpen after the request's deadline cut its lookup short")
	require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
	require.NotEmpty(t, w.Header().Get("Retry-After"))

	// The same lock under a deadline longer than ArchiveTimeout: the
	// archive's own timeout ended the lookup, and FailOpen runs the key as
	// configured (the store still holds it in flight for this attempt).
	srv = b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, Archive: loggingArchive{t, reader}, ArchiveTimeout: 300 * time.Millisecond}).Wrap(h)
	rctx2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	r = httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(rctx2)
	r.Header.Set(idempotency.HeaderKey, "deadline-key2")
	w = httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	require.EqualValues(t, 2, h.calls.Load(), "FailOpen fails open on the archive's own timeout: %d %s", w.Code, w.Body.String())
}
