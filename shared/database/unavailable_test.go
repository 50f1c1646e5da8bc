package database_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// Unavailable tells a database that could not be reached, or is not taking
// connections for now, from errors a retry cannot fix. The lookup answers
// the first 503 "unavailable" and the second 500.
func TestUnavailableTellsOutagesFromMistakes(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("query: %w", &pgconn.PgError{Severity: "FATAL", Code: code})
	}
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"nil":                              {nil, false},
		"terminated (admin_shutdown)":      {pg("57P01"), true},
		"crash shutdown":                   {pg("57P02"), true},
		"starting up (cannot_connect_now)": {pg("57P03"), true},
		"too many connections":             {pg("53300"), true},
		"connection failure (class 08)":    {pg("08006"), true},
		"protocol violation (class 08)":    {pg("08P01"), false},
		"password rejected":                {pg("28P01"), false},
		"no such role":                     {pg("28000"), false},
		"no such database":                 {pg("3D000"), false},
		"statement timeout":                {pg("57014"), false},
		"permission denied":                {pg("42501"), false},
		"query error":                      {pg("42P01"), false},
		"connection refused":               {&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		"DNS resolver timed out":           {fmt.Errorf("dial: %w", &net.DNSError{Err: "i/o timeout", Name: "db", IsTimeout: true}), true},
		"DNS name that does not exist":     {fmt.Errorf("dial: %w", &net.DNSError{Err: "no such host", Name: "db.invalid", IsNotFound: true}), false},
		"TLS refused, no network error":    {fmt.Errorf("connect: %w", errors.New("server refused TLS connection")), false},
		"socket closed mid-answer":         {fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		"EOF":                              {io.EOF, true},
		"closed connection":                {fmt.Errorf("exec: %w", pgconn.ErrConnClosed), true},
		"unknown CA":                       {fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), false},
		"wrong host name":                  {fmt.Errorf("tls: %w", x509.HostnameError{Host: "db"}), false},
		"expired certificate":              {fmt.Errorf("tls: %w", x509.CertificateInvalidError{Reason: x509.Expired}), false},
		"certificate verification":         {fmt.Errorf("tls: %w", &tls.CertificateVerificationError{Err: errors.New("bad")}), false},
		"anything else":                    {errors.New("scan: cannot decode"), false},
		"canceled":                         {context.Canceled, false},
	} {
		require.Equal(t, c.want, database.Unavailable(c.err), name)
	}
}

// The same, from a real server: a port nobody listens on and a backend
// terminated under a query are outages; a database that does not exist is
// a mistake.
func TestUnavailableOnARealServer(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// GIVEN a port nobody listens on
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	_, err = pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?connect_timeout=2", port))
	require.Error(t, err)
	require.True(t, database.Unavailable(err), "refused: %v", err)

	// GIVEN a database that does not exist on a running server
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Path = "/no_such_database_here"
	_, err = pgx.Connect(ctx, u.String())
	require.Error(t, err)
	require.False(t, database.Unavailable(err), "no such database: %v", err)

	// GIVEN a backend terminated while it runs a query, and the same
	// connection used again
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	pid := conn.PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "SELECT pg_sleep(20)")
		done <- err
	}()
	require.Eventually(t, func() bool {
		var running bool
		_ = db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%')", pid).Scan(&running)
		return running
	}, 10*time.Second, 20*time.Millisecond)
	_, err = db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	err = <-done
	require.Error(t, err)
	require.True(t, database.Unavailable(err), "terminated: %v", err)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.True(t, database.Unavailable(err), "closed connection used again: %v", err)
}
