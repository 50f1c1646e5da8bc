package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A handler that gzips its answer: the first answer goes out as written,
// the outcome is stored decoded (its resource id read from it), and a
// replay, which carries no Content-Encoding, is the plain body. Stored as
// written, a replay was gzip bytes labelled application/json, and a late
// retry's 409 had no resource id.
func TestAGzippedAnswerIsStoredAndReplayedPlain(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	var sawAcceptEncoding []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawAcceptEncoding = append(sawAcceptEncoding, r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		gz := gzip.NewWriter(w)
		_, _ = gz.Write([]byte(`{"id":"ch_gz"}`))
		_ = gz.Close()
	})
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		r.Header.Set(idempotency.HeaderKey, "gz")
		r.Header.Set("Accept-Encoding", "gzip")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		require.Equal(t, "gzip", r.Header.Get("Accept-Encoding"), "the caller's request is left as it was")
		return w
	}
	first := send()
	require.Equal(t, http.StatusCreated, first.Code)
	require.Equal(t, "gzip", first.Header().Get("Content-Encoding"), "the first answer goes out as the handler wrote it")
	zr, err := gzip.NewReader(bytes.NewReader(first.Body.Bytes()))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Equal(t, `{"id":"ch_gz"}`, string(plain))

	again := send()
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed))
	require.Empty(t, again.Header().Get("Content-Encoding"))
	require.Equal(t, `{"id":"ch_gz"}`, again.Body.String())
	require.Equal(t, []string{""}, sawAcceptEncoding, "the handler ran once, without the client's Accept-Encoding")

	var rid *string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT resource_id FROM idempotency_keys WHERE scoped_key = 'idem:v1:gz'`).Scan(&rid))
	require.NotNil(t, rid)
	require.Equal(t, "ch_gz", *rid)
}

// A Tenant that reads the body (to check a signature over it) reads a copy:
// the handler gets the whole body after it. Before, it got what the Tenant
// left (nothing), and that outcome was stored for the key.
func TestATenantThatReadsTheBodyLeavesItToTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	var got []byte
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
	})
	srv := b.middleware(t, idempotency.Config{Tenant: func(r *http.Request) string {
		body, _ := io.ReadAll(r.Body)
		if len(body) == 0 {
			return ""
		}
		return "acct_1"
	}}).Wrap(h)
	w := post(srv, "signed", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	require.Equal(t, `{"amount":100}`, string(got))
}

// A body refused by a limit outside the middleware (an http.MaxBytesReader
// of the server's) is a 413 that names that limit, not the middleware's.
func TestABodyOverAnOuterLimitNamesThatLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	srv := b.middleware(t, idempotency.Config{}).Wrap(&charges{})
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 10)
		srv.ServeHTTP(w, r)
	})
	w := post(outer, "outer-limit", `{"amount":100}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	require.Contains(t, problemOf(t, w)["detail"], "larger than 10 bytes")
}

// A handler that panics after writing its gzip answer, before closing the
// stream (no gzip trailer): the outcome kept (idempotency_response_incomplete)
// still carries the resource id, read from what of the body decoded.
func TestAGzipAnswerCutShortKeepsItsResourceID(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		gz := gzip.NewWriter(w)
		_, _ = gz.Write([]byte(`{"id":"ch_cut"}`))
		_ = gz.Flush()
		panic("after the body")
	})
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	require.Panics(t, func() { post(srv, "cut", `{}`) })
	again := post(srv, "cut", `{}`)
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "ch_cut", problemOf(t, again)["resource_id"], again.Body.String())
}

// Content-Encoding as handlers may write it: in any case, as a list, on
// two header lines, with identity beside gzip; and a gzip header on an
// empty body (a 204), which is a plain empty body, not an error.
func TestContentEncodingsAsHandlersWriteThem(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	for i, enc := range [][]string{{"GZIP"}, {" gzip "}, {"identity", "gzip"}, {"gzip, identity"}, {"x-gzip"}} {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Encoding"] = enc
			w.WriteHeader(http.StatusCreated)
			gz := gzip.NewWriter(w)
			_, _ = gz.Write([]byte(`{"id":"ch_enc"}`))
			_ = gz.Close()
		})
		srv := b.middleware(t, idempotency.Config{}).Wrap(h)
		key := fmt.Sprintf("enc-%d", i)
		post(srv, key, `{}`)
		again := post(srv, key, `{}`)
		require.Equal(t, `{"id":"ch_enc"}`, again.Body.String(), "%q", enc)
	}

	var logs bytes.Buffer
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusNoContent)
	})
	srv := b.middleware(t, idempotency.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Wrap(h)
	require.Equal(t, http.StatusNoContent, post(srv, "empty", `{}`).Code)
	require.Equal(t, http.StatusNoContent, post(srv, "empty", `{}`).Code)
	require.NotContains(t, logs.String(), "kept encoded")
}
