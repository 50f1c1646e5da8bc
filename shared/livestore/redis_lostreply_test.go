package livestore

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// replyDropper is a connection that, once armed, lets through the first
// script call (EVALSHA or EVAL) whose command holds marker, then loses its
// reply: the script has run on the server, and the client sees its
// connection break (io.EOF), as after a network blip or a proxy restart.
type replyDropper struct {
	net.Conn
	marker  []byte
	dropped *atomic.Bool
	mu      sync.Mutex
	armed   bool
}

func (c *replyDropper) Write(p []byte) (int, error) {
	upper := bytes.ToUpper(p)
	if bytes.Contains(p, c.marker) && (bytes.Contains(upper, []byte("EVALSHA")) || bytes.Contains(upper, []byte("EVAL"))) && c.dropped.CompareAndSwap(false, true) {
		c.mu.Lock()
		c.armed = true
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *replyDropper) Read(p []byte) (int, error) {
	c.mu.Lock()
	armed := c.armed
	c.mu.Unlock()
	if !armed {
		return c.Conn.Read(p)
	}
	// The reply arrives once the script has run: read it, then lose it.
	_, _ = c.Conn.Read(make([]byte, 64<<10))
	_ = c.Conn.Close()
	return 0, io.EOF
}

// go-redis sends a command again, on a new connection, when the reply to
// it was lost (io.EOF, a read timeout): MaxRetries, 3 by default. A
// registration script whose reply was lost so runs twice, and its second
// run finds the hash its first run wrote, with this request's token. The
// store took that for another request's entry: the request was answered
// 409 in flight, its hash was neither completed nor released, and every
// retry met 409 in flight for the whole window, then 409 expired "never
// completed", for an operation that never ran; the Postgres store releases
// such a registration by its token. The store recognizes its own
// registration by its token, and the request runs once.
func TestARedisRegistrationWhoseReplyWasLostRunsOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, prefix := testenv.Redis(t)
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	require.NoError(t, err)
	key := "lost-reply-" + strings.TrimSuffix(strings.TrimPrefix(prefix, "test:"), ":")
	var dropped atomic.Bool
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &replyDropper{Conn: conn, marker: []byte(key), dropped: &dropped}, nil
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })

	reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	var calls atomic.Int32
	mw, err := idempotency.New(idempotency.Config{
		Store: NewRedis(client, db.Pool, prefix), Archive: reader, SingleTenant: true, ArchiveTimeout: 30 * time.Second,
	})
	require.NoError(t, err)
	srv := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set(idempotency.HeaderKey, key)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}

	// A first registration loads the scripts (EVALSHA then runs them
	// without an EVAL), as in a server that has been up a while.
	warm := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	warm.Header.Set(idempotency.HeaderKey, "warm-up")
	srv.ServeHTTP(httptest.NewRecorder(), warm)
	calls.Store(0)

	first := post()
	require.True(t, dropped.Load(), "the registration's reply was lost")
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	require.EqualValues(t, 1, calls.Load())
	retry := post()
	require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
	require.Equal(t, "true", retry.Header().Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 1, calls.Load(), "the retry replays; the operation ran once")
}
