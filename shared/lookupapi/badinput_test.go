package lookupapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// Bad input is a 4xx whatever the state of the database: the query is
// checked before anything is read, so a retry of input that can never
// succeed is never invited by a 503. The database here cannot be reached.
func TestBadInvestigationInputIsA4xxWhateverTheDatabase(t *testing.T) {
	t.Parallel()
	pool, err := database.Open(context.Background(), database.Config{URL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"}, nil)
	require.NoError(t, err)
	defer pool.Close()
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	api := lookupapi.New(r, slog.New(slog.NewTextHandler(io.Discard, nil)))

	from, to := "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"
	for name, q := range map[string]map[string]string{
		"bad cursor":          {"scope_prefix": "idem:", "created_from": from, "created_to": to, "cursor": "!!not-a-cursor!!"},
		"window reversed":     {"scope_prefix": "idem:", "created_from": to, "created_to": from},
		"limit over maximum":  {"scope_prefix": "idem:", "created_from": from, "created_to": to, "limit": "5000"},
		"empty scope prefix":  {"created_from": from, "created_to": to},
		"lookup key too long": nil,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var resp lookupapi.Response
		if q == nil {
			long := make([]byte, archive.MaxScopedKeyBytes+1)
			for i := range long {
				long[i] = 'k'
			}
			resp = api.Serve(ctx, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/" + string(long)})
		} else {
			resp = api.Serve(ctx, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys", Query: q})
		}
		cancel()
		t.Logf("%s: %d %s", name, resp.Status, resp.Body)
		if resp.Status >= 500 {
			t.Errorf("%s: bad input answered %d while the database is down", name, resp.Status)
		}
	}
}

// Times time.Parse reads other than as written are refused, not answered:
// offsets of 24 hours or 60 minutes, a ',' before the fraction, and more
// than nine fractional digits (cut to nanoseconds, a window's end written
// just after a key's creation would leave the key out). Times as RFC 3339
// writes them, any offset within a day, are answered.
func TestTimesNotAsRFC3339WritesThemAreRefused(t *testing.T) {
	t.Parallel()
	pool, err := database.Open(context.Background(), database.Config{URL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"}, nil)
	require.NoError(t, err)
	defer pool.Close()
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	api := lookupapi.New(r, slog.New(slog.NewTextHandler(io.Discard, nil)))
	serve := func(from string) lookupapi.Response {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return api.Serve(ctx, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys",
			Query: map[string]string{"scope_prefix": "idem:", "created_from": from, "created_to": "2027-12-01T00:00:00Z"}})
	}
	for _, from := range []string{
		"2026-01-01T00:00:00+24:00", "2026-01-01T00:00:00+23:60", "2026-01-01T00:00:00-24:00",
		"2026-01-01T00:00:00,5Z", "2026-01-01T00:00:00.0000000001Z", "2026-01-01T00:00:00.Z",
		"2026-01-01T00:00:00.5", "2026-01-01T00:00:00+0100", "2026-01-01T00:00:00",
	} {
		resp := serve(from)
		require.Equal(t, http.StatusBadRequest, resp.Status, "%s: %s", from, resp.Body)
		require.Contains(t, string(resp.Body), "is not an RFC 3339 time", from)
	}
	for _, from := range []string{"2026-01-01T00:00:00Z", "2026-01-01T00:00:00.123456789Z", "2026-01-01T00:00:00.5+23:59", "2026-01-01T00:00:00-00:00"} {
		// The database cannot be reached: a time that is read gets as far
		// as the query, answered 503.
		resp := serve(from)
		require.Equal(t, http.StatusServiceUnavailable, resp.Status, "%s: %s", from, resp.Body)
	}
}
