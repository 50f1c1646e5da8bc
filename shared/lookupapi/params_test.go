package lookupapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/lookupapi"
)

// askedReader records whether the archive was asked anything.
type askedReader struct{ asked int }

func (r *askedReader) Lookup(_ context.Context, k string, _ []byte) (archive.Record, error) {
	r.asked++
	return archive.Record{ScopedKey: k, Status: 201}, nil
}

func (r *askedReader) Investigate(context.Context, archive.Query) (archive.Page, error) {
	r.asked++
	return archive.Page{Records: []archive.Record{}}, nil
}

func newAPI(r lookupapi.Reader) *lookupapi.API {
	return lookupapi.New(r, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// A query parameter a route does not take, misspelt or in another letter
// case, is refused, never dropped: a client paging with "Cursor" would be
// answered page one again, for ever, one asking "Limit=5" a page of 100, and
// one asking about a fingerprint ("Fingerprint") an answer that says nothing
// of it, each with a 200.
func TestAQueryParameterARouteDoesNotTakeIsRefused(t *testing.T) {
	t.Parallel()
	window := map[string]string{"scope_prefix": "idem:", "created_from": "2026-11-01T00:00:00Z", "created_to": "2026-12-01T00:00:00Z"}
	with := func(base map[string]string, name, value string) map[string]string {
		q := maps.Clone(base)
		if q == nil {
			q = map[string]string{}
		}
		q[name] = value
		return q
	}
	for _, tc := range []struct {
		path, param string
		query       map[string]string
	}{
		{"/v1/archive/keys", "Cursor", with(window, "Cursor", "AgAAAAAAAAAAEDAxMjM0NTY3ODlhYmNkZWZpZGVtOng")},
		{"/v1/archive/keys", "Limit", with(window, "Limit", "5")},
		{"/v1/archive/keys", "LIMIT", with(window, "LIMIT", "5")},
		{"/v1/archive/keys", "limt", with(window, "limt", "5")},
		{"/v1/archive/keys", "fingerprint", with(window, "fingerprint", "00")},
		{"/v1/archive/lookup", "Fingerprint", map[string]string{"scoped_key": "idem:v1:k", "Fingerprint": "00"}},
		{"/v1/archive/lookup", "fingerprnt", map[string]string{"scoped_key": "idem:v1:k", "fingerprnt": "00"}},
		{"/v1/archive/lookup", "cursor", map[string]string{"scoped_key": "idem:v1:k", "cursor": "x"}},
		{"/v1/archive/keys/idem:v1:k", "scoped_key", map[string]string{"scoped_key": "idem:v1:other"}},
		{"/v1/archive/keys/idem:v1:k", "_", map[string]string{"_": "1700000000"}},
	} {
		r := &askedReader{}
		resp := newAPI(r).Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: tc.path, Query: tc.query})
		require.Equal(t, http.StatusBadRequest, resp.Status, "%s with %v: %s", tc.path, tc.query, resp.Body)
		var p lookupapi.Problem
		require.NoError(t, json.Unmarshal(resp.Body, &p))
		require.Contains(t, p.Detail, `"`+tc.param+`"`, "the problem names the parameter")
		require.Zero(t, r.asked, "%s with %v: the archive was asked", tc.path, tc.query)
	}

	// The parameters each route takes are still read.
	r := &askedReader{}
	resp := newAPI(r).Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys", Query: with(window, "limit", "5")})
	require.Equal(t, http.StatusOK, resp.Status, string(resp.Body))
	resp = newAPI(r).Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/lookup", Query: map[string]string{"scoped_key": "idem:v1:k", "fingerprint": "00"}})
	require.Equal(t, http.StatusOK, resp.Status, string(resp.Body))
	resp = newAPI(r).Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/idem:v1:k", Query: map[string]string{"fingerprint": "00"}})
	require.Equal(t, http.StatusOK, resp.Status, string(resp.Body))
	require.Equal(t, 3, r.asked)

	// "keys/" with the investigation's parameters (a slash too many) is
	// told its key is missing, not that the parameters are unknown.
	resp = newAPI(r).Serve(context.Background(), lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/", Query: window})
	require.Equal(t, http.StatusBadRequest, resp.Status, string(resp.Body))
	var p lookupapi.Problem
	require.NoError(t, json.Unmarshal(resp.Body, &p))
	require.Equal(t, "invalid_key", p.Code, p.Detail)
	require.NotContains(t, p.Detail, "parameter")
}

// A direct payload carrying a member of the other action is refused: a
// query whose "action" was forgotten would otherwise be answered as a lookup
// of its scoped_key, a lookup's limit or a query's fingerprint ignored.
func TestADirectMemberOfTheOtherActionIsRefused(t *testing.T) {
	t.Parallel()
	limit := 5
	window := lookupapi.DirectRequest{ScopePrefix: "idem:", CreatedFrom: "2026-11-01T00:00:00Z", CreatedTo: "2026-12-01T00:00:00Z"}
	for name, tc := range map[string]struct {
		req    lookupapi.DirectRequest
		member string
	}{
		"a query without its action": {lookupapi.DirectRequest{ScopedKey: "idem:v1:k", ScopePrefix: "idem:", CreatedFrom: "2026-11-01T00:00:00Z", CreatedTo: "2026-12-01T00:00:00Z"}, "scope_prefix"},
		"a lookup with a limit":      {lookupapi.DirectRequest{Action: "lookup", ScopedKey: "idem:v1:k", Limit: &limit}, "limit"},
		"a lookup with a cursor":     {lookupapi.DirectRequest{ScopedKey: "idem:v1:k", Cursor: "x"}, "cursor"},
		"a query with a fingerprint": {func() lookupapi.DirectRequest { q := window; q.Action, q.Fingerprint = "query", "00"; return q }(), "fingerprint"},
		"a query with a scoped key":  {func() lookupapi.DirectRequest { q := window; q.Action, q.ScopedKey = "query", "idem:v1:k"; return q }(), "scoped_key"},
	} {
		r := &askedReader{}
		resp := newAPI(r).Direct(context.Background(), tc.req, "req-1")
		require.Equal(t, http.StatusBadRequest, resp.Status, name)
		require.NotNil(t, resp.Problem, name)
		require.Contains(t, resp.Problem.Detail, tc.member, name)
		require.Zero(t, r.asked, "%s: the archive was asked", name)
	}
	q := window
	q.Action = "query"
	r := &askedReader{}
	require.Equal(t, http.StatusOK, newAPI(r).Direct(context.Background(), q, "req-2").Status)
	require.Equal(t, http.StatusOK, newAPI(r).Direct(context.Background(), lookupapi.DirectRequest{ScopedKey: "idem:v1:k", Fingerprint: "00"}, "req-3").Status)
}

// A 405 names every method the route serves.
func TestMethodNotAllowedNamesGETAndHEAD(t *testing.T) {
	t.Parallel()
	api := newAPI(&askedReader{})
	require.Equal(t, http.StatusOK, api.Serve(context.Background(), lookupapi.Request{Method: http.MethodHead, Path: "/v1/archive/keys/idem:v1:k"}).Status)
	resp := api.Serve(context.Background(), lookupapi.Request{Method: http.MethodPost, Path: "/v1/archive/keys/idem:v1:k"})
	require.Equal(t, http.StatusMethodNotAllowed, resp.Status)
	require.Equal(t, "GET, HEAD", resp.Headers["Allow"])
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Lookup(context.Context, string, []byte) (archive.Record, error) {
	return archive.Record{}, r.err
}

func (r errReader) Investigate(context.Context, archive.Query) (archive.Page, error) {
	return archive.Page{}, r.err
}

// No answer may be kept by a cache, found or not, error or not: a "not
// found" a cache replayed after the key was archived would let its late
// retry run again.
func TestNoAnswerMayBeCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		reader lookupapi.Reader
		req    lookupapi.Request
		status int
	}{
		"found":       {&askedReader{}, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/idem:v1:k"}, http.StatusOK},
		"not found":   {errReader{archive.ErrNotFound}, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/idem:v1:k"}, http.StatusNotFound},
		"unavailable": {errReader{context.DeadlineExceeded}, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/idem:v1:k"}, http.StatusServiceUnavailable},
		"bad request": {&askedReader{}, lookupapi.Request{Method: http.MethodGet, Path: "/v1/archive/keys/idem:v1:k", Query: map[string]string{"Limit": "5"}}, http.StatusBadRequest},
		"method":      {&askedReader{}, lookupapi.Request{Method: http.MethodPost, Path: "/v1/archive/keys/idem:v1:k"}, http.StatusMethodNotAllowed},
		"no route":    {&askedReader{}, lookupapi.Request{Method: http.MethodGet, Path: "/elsewhere"}, http.StatusNotFound},
	} {
		resp := newAPI(tc.reader).Serve(ctx, tc.req)
		require.Equal(t, tc.status, resp.Status, name)
		require.Equal(t, "no-store", resp.Headers["Cache-Control"], name)
	}
}
