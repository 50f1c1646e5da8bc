package lookupapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// pageReader is a Reader whose pages do not come from archive.Reader's
// Investigate: a caching or proxying Reader (one that decodes a Page from
// another lookup function's JSON answer, say), or any test double. Such a
// Page has no queryID, which is unexported, so no implementation outside
// package archive can build a page Cut can continue.
type pageReader struct{ page archive.Page }

func (pageReader) Lookup(context.Context, string, []byte) (archive.Record, error) {
	return archive.Record{}, archive.ErrNotFound
}

func (r pageReader) Investigate(context.Context, archive.Query) (archive.Page, error) {
	return r.page, nil
}

// A page Cut cannot continue, over MaxPageBytes, is never answered whole
// (over 6 MB: a function error, a 5xx through API Gateway, every time the
// query is asked): it is a 500 whose body names nothing internal.
func TestAnOversizedPageOfAnotherReaderIsNeverAnsweredWhole(t *testing.T) {
	t.Parallel()
	// A page as another lookup function answers it, decoded from JSON.
	var page archive.Page
	recs := make([]archive.Record, 1000)
	now := time.Now().UTC()
	for i := range recs {
		recs[i] = archive.Record{ScopedKey: "idem:v2:" + strings.Repeat("<", 1200) + string(rune('a'+i%26)), Status: 201, CreatedAt: now, ExpiredAt: now}
	}
	b, err := json.Marshal(archive.Page{Records: recs})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &page))

	api := lookupapi.New(pageReader{page}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp := api.Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys",
		Query: map[string]string{"scope_prefix": "idem:v2:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2027-01-01T00:00:00Z", "limit": "1000"}})
	t.Logf("status %d, body %d bytes", resp.Status, len(resp.Body))
	require.LessOrEqual(t, len(resp.Body), lookupapi.MaxPageBytes, "an investigation answer over MaxPageBytes (over 6 MB once an API Gateway body)")
	require.Equal(t, http.StatusInternalServerError, resp.Status)
	require.Contains(t, string(resp.Body), `"code":"internal_error"`)

	// A page within the limit is answered as it is.
	api = lookupapi.New(pageReader{archive.Page{Records: recs[:10]}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	resp = api.Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys",
		Query: map[string]string{"scope_prefix": "idem:v2:", "created_from": "2026-01-01T00:00:00Z", "created_to": "2027-01-01T00:00:00Z"}})
	require.Equal(t, http.StatusOK, resp.Status)
}
