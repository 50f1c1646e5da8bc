package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// HTTP/1.1 strips the whitespace around a header value (net/textproto) and
// HTTP/2 hands it on as sent: "k " over HTTP/2 and "k " over HTTP/1.1 were
// two keys, "k " and "k", and a retry that reached the server over the
// other protocol (a client falling back to HTTP/1.1, a proxy in between on
// one path only) ran the operation a second time. A key with whitespace
// around it is refused, so a key reads the same over every protocol.
func TestAKeyIsTheSameKeyOverEveryHTTPVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	srv := httptest.NewUnstartedServer(b.middleware(t, idempotency.Config{Required: true}).Wrap(h))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	h2 := srv.Client()
	onlyH1 := srv.Client().Transport.(*http.Transport).Clone()
	onlyH1.Protocols = &http.Protocols{}
	onlyH1.Protocols.SetHTTP1(true)
	onlyH1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	h1 := &http.Client{Transport: onlyH1}

	send := func(c *http.Client, key string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
		require.NoError(t, err)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		return resp.StatusCode, resp.Proto
	}
	for _, key := range []string{"order-42 ", " order-43", "  order-44  "} {
		before := h.calls.Load()
		first, proto := send(h2, key)
		require.Equal(t, "HTTP/2.0", proto)
		retry, proto := send(h1, key)
		require.Equal(t, "HTTP/1.1", proto)
		require.LessOrEqual(t, h.calls.Load()-before, int32(1),
			"key %q ran once over HTTP/2 (%d) and again over HTTP/1.1 (%d)", key, first, retry)
	}
}

func TestAKeyWithWhitespaceAroundItIsRefused(t *testing.T) {
	t.Parallel()
	for _, key := range []string{" k", "k ", "  ", "\"k\" "} {
		require.Error(t, idempotency.ValidateKey(key), "%q", key)
	}
	for _, key := range []string{"k k", "a key: with/odd %chars"} {
		require.NoError(t, idempotency.ValidateKey(key), "%q", key)
	}
}
