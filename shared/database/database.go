// Package database opens pgx connection pools and runs transactions for the
// other packages of this module. It is the one place that knows how a
// connection is configured, so that the sweeper, the partition manager and the
// lookup all talk to PostgreSQL the same way.
package database

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures a connection pool. Credentials come from one of three
// places: the URL itself (local use), a Secrets Manager secret (SecretARN), or
// RDS IAM authentication tokens minted for every new connection (IAMAuth).
type Config struct {
	// URL is a PostgreSQL connection string (postgres://user@host:5432/db?...).
	// Required unless SecretARN is set, in which case it may still override
	// the host (an RDS Proxy endpoint, say) and options. A search_path query
	// parameter selects the schema.
	URL string
	// SecretARN names a Secrets Manager secret in the shape RDS generates
	// ({"username","password","host","port","dbname",...}). It is fetched on
	// the first connection and again when older than SecretTTL, or sooner
	// when a new connection is refused its password (a rotation), so a
	// rotated password is picked up without an outage.
	SecretARN string
	// SecretTTL is how long a fetched secret is reused. Default 5 minutes.
	SecretTTL time.Duration
	// SecretMinRefetch is the least time between two fetches of the secret
	// when new connections fail to authenticate (after a rotation, before
	// SecretTTL has passed). Default 5 seconds.
	SecretMinRefetch time.Duration
	// IAMAuth mints an RDS IAM authentication token as the password of every
	// new connection (for RDS Proxy or RDS with IAM database authentication).
	// The URL names host, port, user and database; AWS_REGION the region.
	IAMAuth bool
	// InsecureTLS allows a non-local host without sslmode=verify-full. Only
	// for test rigs such as LocalStack; never in production.
	InsecureTLS bool
	// SSLRootCert is the path of a PEM file of the certificate authorities
	// the server's certificate must chain to: the RDS CA bundle
	// (global-bundle.pem) for a direct connection to RDS. When set, every
	// connection uses sslmode=verify-full with sslrootcert=SSLRootCert,
	// overriding both options in URL. Empty uses what URL says (the system
	// roots with sslmode=verify-full, which is enough behind RDS Proxy).
	SSLRootCert string
	// MaxConns caps the pool, 1 to MaxMaxConns. 0 means the default, 4: a
	// pool of no connections cannot work, so 0 is never meant literally.
	MaxConns int32
	// ExecMode selects how statements are sent. "cache_statement" (default)
	// uses named prepared statements; "exec" and "simple_protocol" prepare
	// nothing server-side, which keeps RDS Proxy from pinning sessions.
	ExecMode string
}

// MaxMaxConns is the largest pool Config accepts. RDS allows a few thousand
// connections per instance at most; a pool larger than this is a typo.
const MaxMaxConns = 1000

var execModes = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// PoolConfig validates c and returns the pgxpool configuration it describes,
// without credentials from AWS (Open adds those). Errors never include the
// connection string, which may hold a password.
func (c Config) PoolConfig() (*pgxpool.Config, error) {
	if c.URL == "" && c.SecretARN == "" {
		return nil, errors.New("database URL is empty: set DATABASE_URL (or DATABASE_SECRET_ARN)")
	}
	if c.SecretARN != "" && c.IAMAuth {
		return nil, errors.New("choose one source of database credentials: a secret or IAM authentication, not both")
	}
	if c.IAMAuth && c.URL == "" {
		return nil, errors.New("IAM authentication needs DATABASE_URL naming host, port, user and database")
	}
	connString := c.URL
	if connString == "" {
		// Host, port and database come from the secret on first connect;
		// until then the placeholder must not be a local address, so that
		// the TLS rule below applies.
		connString = "host=secret.invalid sslmode=verify-full"
	}
	if c.SSLRootCert != "" {
		if err := CheckRootCert(c.SSLRootCert); err != nil {
			return nil, err
		}
		var err error
		if connString, err = withVerifyFull(connString, c.SSLRootCert); err != nil {
			return nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, errors.New("database URL is not a valid PostgreSQL connection string")
	}
	// The pool's size is MaxConns (DATABASE_MAX_CONNS), which would
	// silently override a size in the URL. Asked of the parser (pgxpool
	// takes the setting out of what it returns), so that an encoded name
	// counts and the text in a password does not.
	if cc, err := pgconn.ParseConfig(connString); err == nil {
		if _, ok := cc.RuntimeParams["pool_max_conns"]; ok {
			return nil, errors.New("database URL sets pool_max_conns: set DATABASE_MAX_CONNS instead")
		}
	}
	if c.URL != "" && !c.InsecureTLS {
		if host, ok := everyHostVerified(cfg.ConnConfig); !ok {
			return nil, fmt.Errorf("database host %s is not local: use sslmode=verify-full (with sslrootcert naming the RDS CA bundle when not behind RDS Proxy)", host)
		}
	}
	if c.MaxConns < 0 || c.MaxConns > MaxMaxConns {
		return nil, fmt.Errorf("database max connections must be 1 to %d, got %d", MaxMaxConns, c.MaxConns)
	}
	cfg.MaxConns = cmp.Or(c.MaxConns, 4)
	if c.ExecMode != "" {
		mode, ok := execModes[strings.ToLower(c.ExecMode)]
		if !ok {
			return nil, fmt.Errorf("unknown statement execution mode %q (want cache_statement, cache_describe, describe_exec, exec or simple_protocol)", c.ExecMode)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
	}
	return cfg, nil
}

// isLocal reports whether host is a loopback address or a Unix socket directory.
func isLocal(host string) bool {
	switch {
	case strings.HasPrefix(host, "/"), host == "localhost", strings.HasSuffix(host, ".localhost"):
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// everyHostVerified reports whether every host a connection may reach — the
// first and each fallback of a multi-host string — is local or verifies the
// server's certificate and name (sslmode=verify-full: no plaintext fallback,
// no skipped verification). When not, it returns the first host at fault.
func everyHostVerified(cc *pgx.ConnConfig) (string, bool) {
	attempts := []*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}
	attempts = append(attempts, cc.Fallbacks...)
	for _, a := range attempts {
		if isLocal(a.Host) {
			continue
		}
		if a.TLSConfig == nil || a.TLSConfig.InsecureSkipVerify || a.TLSConfig.ServerName == "" {
			return a.Host, false
		}
	}
	return "", true
}

// CheckRootCert reports, naming the file, why path is not a usable CA bundle
// for Config.SSLRootCert.
func CheckRootCert(path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("database CA bundle: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return fmt.Errorf("database CA bundle %s holds no PEM certificate", path)
	}
	return nil
}

// withVerifyFull returns connString with sslmode=verify-full and sslrootcert
// set to path, replacing any value it had, in either of the two forms
// PostgreSQL connection strings take.
func withVerifyFull(connString, path string) (string, error) {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err != nil {
			return "", errors.New("database URL is not a valid PostgreSQL connection string")
		}
		q := u.Query()
		q.Set("sslmode", "verify-full")
		q.Set("sslrootcert", path)
		// pgconn unescapes the query as a path: a space must be %20, not
		// the + that Encode writes (a literal + is already %2B).
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(path)
	return connString + " sslmode=verify-full sslrootcert='" + quoted + "'", nil
}

// Open validates c and creates a pool. It does not connect: the first query
// does. awsCfg is needed only with SecretARN or IAMAuth.
func Open(ctx context.Context, c Config, awsCfg *aws.Config) (*pgxpool.Pool, error) {
	cfg, err := c.PoolConfig()
	if err != nil {
		return nil, err
	}
	if (c.SecretARN != "" || c.IAMAuth) && awsCfg == nil {
		return nil, errors.New("database credentials from AWS need an AWS configuration")
	}
	switch {
	case c.SecretARN != "":
		src := &secretSource{
			arn:          c.SecretARN,
			ttl:          cmp.Or(c.SecretTTL, 5*time.Minute),
			minRefetch:   cmp.Or(c.SecretMinRefetch, 5*time.Second),
			client:       secretsmanager.NewFromConfig(*awsCfg),
			overrideHost: c.URL != "",
		}
		cfg.BeforeConnect = src.beforeConnect
	case c.IAMAuth:
		creds, region := awsCfg.Credentials, awsCfg.Region
		cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
			endpoint := net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
			token, err := auth.BuildAuthToken(ctx, endpoint, region, cc.User, creds)
			if err != nil {
				return fmt.Errorf("mint RDS IAM auth token for %s@%s: %w", cc.User, endpoint, err)
			}
			cc.Password = token
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create connection pool: %w", err)
	}
	return pool, nil
}

// Beginner is what InTx needs: a pool or a connection.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// InTx runs fn in a transaction: commit when fn returns nil, roll back otherwise.
// settings are applied with SET LOCAL semantics (set_config(..., true)) before
// fn runs, in one round trip, so they end with the transaction.
//
// The transaction is READ COMMITTED whatever default_transaction_isolation
// the role, the database or a parameter group sets: the sweep batch relies
// on a row lock that follows a row to a version its snapshot cannot see
// (where REPEATABLE READ would fail the batch with a serialization error
// under steady completion traffic), and nothing here needs more.
func InTx(ctx context.Context, db Beginner, settings map[string]string, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if len(settings) > 0 {
			names := make([]string, 0, len(settings))
			values := make([]string, 0, len(settings))
			for k, v := range settings {
				names = append(names, k)
				values = append(values, v)
			}
			const setLocal = `SELECT set_config(name, value, true) FROM unnest($1::text[], $2::text[]) AS s(name, value)`
			if _, err := tx.Exec(ctx, setLocal, names, values); err != nil {
				return fmt.Errorf("set transaction settings: %w", err)
			}
		}
		return fn(tx)
	})
}

// MaxTimeout is the longest lock or statement timeout a component accepts:
// the longest a Lambda invocation runs (15 minutes).
const MaxTimeout = 15 * time.Minute

// CheckTimeout reports a lock or statement timeout PostgreSQL would not
// honour as written: under 1ms (PostgreSQL reads 0 as "no timeout"), not a
// whole number of milliseconds (PostgreSQL would round it), or over
// MaxTimeout. The message suggests only values that are valid.
func CheckTimeout(d time.Duration) error {
	switch {
	case d < time.Millisecond:
		return fmt.Errorf("must be at least 1ms, got %s (PostgreSQL counts whole milliseconds, and 0 would mean no timeout at all)", d)
	case d > MaxTimeout:
		return fmt.Errorf("must be at most %s, the longest a Lambda invocation runs, got %s", MaxTimeout, d)
	case d%time.Millisecond != 0:
		down := d.Truncate(time.Millisecond)
		return fmt.Errorf("must be a whole number of milliseconds, got %s (PostgreSQL counts whole milliseconds): use %s or %s", d, down, down+time.Millisecond)
	}
	return nil
}

// Timeouts returns the settings that bound lock waits and statements, for InTx.
func Timeouts(lock, statement time.Duration) map[string]string {
	return map[string]string{
		"lock_timeout":      fmt.Sprintf("%dms", lock.Milliseconds()),
		"statement_timeout": fmt.Sprintf("%dms", statement.Milliseconds()),
	}
}

// SQLState returns the SQLSTATE of a PostgreSQL error, or "" for other errors.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// SQLSTATE codes this module reacts to.
const (
	CodeCheckViolation        = "23514" // also raised for "no partition of relation found for row"
	CodeDeadlockDetected      = "40P01"
	CodeInsufficientPrivilege = "42501"
	CodeInvalidPassword       = "28P01" // password authentication failed
	CodeLockNotAvailable      = "55P03" // lock_timeout expired
	CodeQueryCanceled         = "57014" // statement_timeout expired
	CodeUndefinedColumn       = "42703"
	CodeUndefinedTable        = "42P01"
	CodeUniqueViolation       = "23505"
)
