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
