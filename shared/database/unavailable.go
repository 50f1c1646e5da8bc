package database

import (
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err says the database could not be reached or
// is not taking connections for now, so that the same request may succeed
// later: a refused, timed-out or dropped connection, a server shutting down
// or starting up, too many connections. Only those, listed: anything else
// is taken for an error a retry cannot fix — a rejected password or IAM
// token, a missing database, a host name that does not resolve, a server
// that refuses TLS or every authentication method offered, a certificate
// that does not verify, a protocol violation, and every error a query
// itself raises.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", // admin_shutdown: terminated, or the server stops
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: starting up, recovering
			"53300", // too_many_connections
			"08000", // connection_exception
			"08001", // sqlclient_unable_to_establish_sqlconnection
			"08003", // connection_does_not_exist
			"08004", // sqlserver_rejected_establishment_of_sqlconnection
			"08006": // connection_failure
			return true
		}
		// 08P01 (protocol_violation) among them: PostgreSQL raises it on
		// a healthy connection for a malformed message, and poolers for
		// a startup parameter they do not support.
		return false
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		// A name that does not exist is a mistake; a resolver that did
		// not answer is an outage.
		return !dnsErr.IsNotFound
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
