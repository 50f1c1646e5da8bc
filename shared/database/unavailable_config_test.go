package database_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A server that refuses TLS altogether (sslmode=require or verify-full
// against a server or pooler with TLS off) is a configuration mistake, not
// an outage: pgconn reports it as a ConnectError wrapping a plain error,
// which a retry will never fix, and the lookup answers it 500, not 503 "a
// retry may succeed".
func TestAServerRefusingTLSIsNotAnOutage(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				buf := make([]byte, 8) // SSLRequest: length 8, code 80877103
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				_, _ = c.Write([]byte{'N'}) // TLS not supported
				_, _ = io.Copy(io.Discard, c)
			}(c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = pgx.Connect(ctx, fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=require", port))
	require.ErrorContains(t, err, "server refused TLS connection")
	require.False(t, database.Unavailable(err), "a server that will never speak TLS is not an outage: %v", err)
}

// PostgreSQL raises 08P01 (protocol_violation, of the connection exception
// class) as a plain ERROR for a malformed message on a healthy connection
// (here a Bind with too few parameters): a query error, not an outage.
func TestAProtocolViolationQueryErrorIsNotAnOutage(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	res := conn.PgConn().ExecParams(ctx, "SELECT $1::int", nil, nil, nil, nil).Read()
	require.Error(t, res.Err)
	require.Equal(t, "08P01", database.SQLState(res.Err), "%v", res.Err)
	// the connection is fine afterwards: a query error, not an outage
	_, err = conn.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	require.False(t, database.Unavailable(res.Err), "a query error on a live connection: %v", res.Err)
}
