package main

import (
	"bytes"
	"cmp"
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// freezingProxy forwards TCP to the database until a client sends bytes
// holding match; from then on it forwards nothing and closes nothing: a
// database that stops answering (a network partition, a frozen host).
type freezingProxy struct {
	addr   string
	match  []byte
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezingProxy(t *testing.T, network, target, match string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezingProxy{addr: ln.Addr().String(), match: []byte(match)}
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial(network, target)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go p.pipe(server, client, true)
			go p.pipe(client, server, false)
		}
	}()
	return p
}

// cut closes every connection through the proxy.
func (p *freezingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *freezingProxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if fromClient && bytes.Contains(buf[:n], p.match) {
			p.frozen.Store(true)
		}
		if p.frozen.Load() {
			return // the bytes go nowhere; the sockets stay open
		}
		if _, werr := dst.Write(buf[:n]); werr != nil || err != nil {
			return
		}
	}
}

// A database that stops answering during the partition run (after the
// migrations, on the owner user's own pool) still gets CloudFormation its
// answer before the invocation's deadline: the run's cleanup (releasing its
// locks, closing the owner's pool) is bounded once the handler's context
// has ended, where pgx alone would wait 15 s to close each connection and
// the lock's release 10 s more, past the margin kept for the answer.
func TestAFrozenDatabaseStillGetsCloudFormationItsAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(b.db.URL)
	require.NoError(t, err)
	// The database's own address: a TCP one, or the test cluster's Unix
	// socket (host and port in the query).
	network, target := "tcp", u.Host
	q := u.Query()
	if h := q.Get("host"); strings.HasPrefix(h, "/") {
		network, target = "unix", h+"/.s.PGSQL."+cmp.Or(q.Get("port"), "5432")
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
	}
	proxy := newFreezingProxy(t, network, target, "pg_try_advisory_lock")
	u.Host = proxy.addr
	db := *b.db
	db.URL = u.String()
	env, _, stderr := testenv.FunctionEnv(t, &db, nil)
	t.Cleanup(proxy.cut) // before the function's pool closes, which would wait on frozen connections
	h := lambda.NewHandler(lambdaHandler(env))

	const deadline = answerMargin + 3*time.Second
	ctx, cancel := context.WithTimeout(testenv.Invocation("req-frozen"), deadline)
	defer cancel()
	until, _ := ctx.Deadline()
	start := time.Now()
	_, err = h.Invoke(ctx, b.event(t, "migrate-cfn-create.json", nil))
	t.Logf("answered after %s of a %s deadline", time.Since(start), deadline)
	require.NoError(t, err, "the handler itself never fails: failures are answers")
	require.True(t, proxy.frozen.Load(), "the database froze during the partition run")
	require.True(t, time.Now().Before(until), "answered before the deadline; log: %s", stderr.String())
	resp := b.cfn.last(t)
	require.Equal(t, cfn.StatusFailed, resp.Status)
	require.Contains(t, resp.Reason, "partition")
}
