package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A request built by hand without a body (http.Request{} in an adapter or a
// test; a server's requests always have one) is a request with an empty
// body: it runs once, and its retry replays it.
func TestARequestWithoutABodyIsOneWithAnEmptyBody(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
		r.Body = nil
		r.Header.Set(idempotency.HeaderKey, "no-body")
		w := httptest.NewRecorder()
		require.NotPanics(t, func() { srv.ServeHTTP(w, r) })
		return w
	}
	first := send()
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	again := send()
	require.Equal(t, http.StatusCreated, again.Code, again.Body.String())
	require.Equal(t, first.Body.String(), again.Body.String(), "replayed")
	require.EqualValues(t, 1, h.calls.Load())
	// The same key with a body is another request.
	require.Equal(t, http.StatusUnprocessableEntity, post(srv, "no-body", `{"amount":1}`).Code)
}

// An archived key whose creation time the archive does not know (a row
// written by hand with '-infinity', answered created_at null) is a 409 whose
// detail says the time is unknown, not that it was year 1.
func TestAnUnknownCreationTimeIsSaidToBeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:inf', '\x00', 201, 'ch_inf', '-infinity', now() - interval '6 hours')`)
	require.NoError(t, err)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{Archive: b.reader}).Wrap(h)
	w := post(srv, "inf", `{}`)
	require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_expired", p["code"])
	require.Nil(t, p["created_at"])
	require.NotNil(t, p["expired_at"])
	require.Contains(t, p["detail"], "first used at an unknown time and expired at 20")
	require.NotContains(t, p["detail"], "0001-01-01")
	require.Zero(t, h.calls.Load())
}
