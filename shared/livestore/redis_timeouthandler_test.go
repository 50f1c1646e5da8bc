package livestore

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// latencyProxy forwards loopback TCP to target, delivering every
// chunk oneWay later in each direction (a 2*oneWay round trip, as to a
// Redis in another availability zone).
func latencyProxy(t *testing.T, target string, oneWay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	pipe := func(dst, src net.Conn) {
		type chunk struct {
			at time.Time
			b  []byte
		}
		q := make(chan chunk, 1024)
		go func() {
			defer close(q)
			for {
				buf := make([]byte, 64<<10)
				n, err := src.Read(buf)
				if n > 0 {
					q <- chunk{time.Now().Add(oneWay), buf[:n]}
				}
				if err != nil {
					return
				}
			}
		}()
		for c := range q {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
	return ln.Addr().String()
}

// Behind http.TimeoutHandler (a server that lives on past the request's
// deadline), a charge answered a few ms before the timeout, with Redis 1 ms
// away and the archive locked for 300 ms: the store keeps its hash first,
// and a later attempt writes the archive row. Cut at the request's
// deadline, the completion recorded neither, and a retry after the window
// ran the charge a second time.
func TestACompletionNearADeadlineTheServerOutlivesIsRecorded(t *testing.T) {
	for _, margin := range []time.Duration{2 * time.Millisecond, 3 * time.Millisecond} {
		t.Run(margin.String(), func(t *testing.T) {
			base, db := newRedisStore(t)
			opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
			require.NoError(t, err)
			opts.Addr = latencyProxy(t, opts.Addr, 500*time.Microsecond)
			client := redis.NewClient(opts)
			t.Cleanup(func() { _ = client.Close() })
			s := NewRedis(client, db.Pool, base.prefix)
			ctx := context.Background()
			reader, err := archive.NewReader(db.Pool, archive.Config{}, nil)
			require.NoError(t, err)
			mw, err := idempotency.New(idempotency.Config{Store: s, Archive: reader, SingleTenant: true, LiveTTL: time.Hour})
			require.NoError(t, err)
			var calls atomic.Int32
			var slow atomic.Bool
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := calls.Add(1)
				if slow.Load() {
					d, _ := r.Context().Deadline()
					time.Sleep(time.Until(d.Add(-margin)))
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
			}))
			srv := httptest.NewServer(http.TimeoutHandler(h, 500*time.Millisecond, "timeout"))
			defer srv.Close()
			post := func(key string) (int, string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
				req.Header.Set(idempotency.HeaderKey, key)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			post("warm") // lease, scripts, connections
			calls.Store(0)

			key := "near-deadline"
			scoped := "idem:v1:" + key
			t.Cleanup(func() { client.Del(context.Background(), s.both(scoped)...) })

			// The archive is locked for 300 ms, from just before the handler returns.
			go func() {
				time.Sleep(400 * time.Millisecond)
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					return
				}
				_, _ = tx.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE ROW EXCLUSIVE MODE")
				time.Sleep(300 * time.Millisecond)
				_ = tx.Rollback(ctx)
			}()
			slow.Store(true)
			code, body := post(key)
			slow.Store(false)
			time.Sleep(500 * time.Millisecond) // the lock is gone; the handler goroutine done
			st := client.HGet(ctx, s.prefix+scoped, "state").Val()
			pttl := client.PTTL(ctx, s.prefix+scoped).Val()
			var archived int64
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", scoped).Scan(&archived))
			t.Logf("first answer %d %q; then: hash %q PTTL %s, archive rows %d", code, body, st, pttl, archived)

			// Window + 15 min later the in-flight hash expires, as Redis lets it.
			if pttl > 0 {
				require.NoError(t, client.PExpire(ctx, s.prefix+scoped, time.Millisecond).Err())
				time.Sleep(20 * time.Millisecond)
			}
			code, body = post(key)
			t.Logf("late retry: %d %q", code, body)
			require.EqualValues(t, 1, calls.Load(), "the charge ran %d times under one Idempotency-Key (after the first request: hash %q PTTL %s, %d archive rows)", calls.Load(), st, pttl, archived)
		})
	}
}
