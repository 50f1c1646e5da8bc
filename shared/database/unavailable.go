package database

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err says the database could not be reached or
// is not taking connections for now, so that the same request may succeed
// later: a refused or dropped connection, a server shutting down or starting
// up, too many connections. Errors that retrying cannot fix are not: a
// rejected password or IAM token, a missing database, a certificate that
// does not verify, and every error a query itself raises.
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
			"53300": // too_many_connections
			return true
		}
		// Class 08: connection exception.
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var (
		unknownCA   x509.UnknownAuthorityError
		invalidCert x509.CertificateInvalidError
		hostname    x509.HostnameError
		verify      *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &invalidCert) || errors.As(err, &hostname) || errors.As(err, &verify) {
		return false
	}
	var (
		netErr     net.Error
		connectErr *pgconn.ConnectError
	)
	return errors.As(err, &netErr) || errors.As(err, &connectErr) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
