// Package database opens pgx connection pools and runs transactions for the
// other packages of this module. It is the one place that knows how a
// connection is configured, so that the sweeper, the partition manager and the
// lookup all talk to PostgreSQL the same way.
package database

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"regexp"
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
	// URL is a PostgreSQL connection string (postgres://user@host:5432/db?...
	// or keyword/value). A search_path query parameter selects the schema.
	// '@', '/', ':', '?' and '#' in the user name or password must be
	// percent-encoded: a URL whose host or database name would hold part of
	// them is refused. pool_* settings other than pool_max_conns (refused:
	// MaxConns) are honoured, and refused when the pool cannot run with them.
	//
	// Required unless SecretARN is set. Beside a secret, the secret gives
	// user and password, and each of host, port and database the URL does
	// not name: the host when the URL names none (its host then needs
	// sslmode=verify-full, the default there, unless it proves local); the
	// port when the URL names neither host nor port (a proxy's port is not
	// the instance's; a URL host without a port means 5432); the database
	// when the URL names none. Everything else (options, sslmode) comes
	// from the URL.
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
	// attempt at every host verifies the server's certificate against it and
	// its name against the host (sslmode=verify-full), whatever sslmode URL
	// gives; the URL's text is not rewritten, and a URL that sets sslrootcert
	// as well is refused. Empty uses what URL says (the system roots with
	// sslmode=verify-full, which is enough behind RDS Proxy).
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

// secretID matches what may be a SecretId of GetSecretValue: an ARN or a
// secret's name (RDS names the secrets it manages rds!db-...), never text
// with blanks, quotes, braces or backslashes, as a secret's JSON has.
var secretID = regexp.MustCompile(`^[^\s{}"'\\]{1,1000}$`)

// ConfigError is a Config error about one field, so that a caller can name
// the field its own way (an environment variable, a flag). Its message never
// holds the connection string nor any part of a password.
type ConfigError struct {
	// Field is the Config field: URL, SecretARN, IAMAuth, SSLRootCert,
	// MaxConns or ExecMode.
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return e.Msg }

func configError(field, format string, args ...any) error {
	return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// PoolConfig validates c and returns the pgxpool configuration it describes,
// without credentials from AWS (Open adds those). Its errors are
// *ConfigError, and never include the connection string, which may hold a
// password.
func (c Config) PoolConfig() (*pgxpool.Config, error) {
	cfg, _, err := c.poolConfig()
	return cfg, err
}

// poolConfig is PoolConfig, also reporting which settings URL names itself
// (the rest of host, port and database come from the secret, if any).
func (c Config) poolConfig() (*pgxpool.Config, settingsNamed, error) {
	var named settingsNamed
	switch {
	case c.URL == "" && c.SecretARN == "":
		return nil, named, configError("URL", "database URL is empty: set DATABASE_URL (or DATABASE_SECRET_ARN)")
	case c.SecretARN != "" && c.IAMAuth:
		return nil, named, configError("IAMAuth", "choose one source of database credentials: a secret or IAM authentication, not both")
	case c.IAMAuth && c.URL == "":
		return nil, named, configError("URL", "IAM authentication needs DATABASE_URL naming host, port, user and database")
	case c.SecretARN != "" && !secretID.MatchString(c.SecretARN):
		// Not echoed: the value may be the secret's JSON itself, pasted in
		// place of its ARN.
		return nil, named, configError("SecretARN", "must be a Secrets Manager secret's ARN or name, without blanks, quotes, braces or backslashes; the value is not shown, as it may be the secret itself")
	case c.MaxConns < 0 || c.MaxConns > MaxMaxConns:
		return nil, named, configError("MaxConns", "database max connections must be 1 to %d, got %d", MaxMaxConns, c.MaxConns)
	}
	mode, modeSet := execModes[strings.ToLower(c.ExecMode)]
	if c.ExecMode != "" && !modeSet {
		return nil, named, configError("ExecMode", "unknown statement execution mode %s (want cache_statement, cache_describe, describe_exec, exec or simple_protocol)", shownWord(c.ExecMode))
	}
	var err error
	if named, err = namedSettings(c.URL); err != nil {
		return nil, named, &ConfigError{Field: "URL", Msg: err.Error()}
	}
	var roots *x509.CertPool
	if c.SSLRootCert != "" {
		if named.keys["sslrootcert"] {
			return nil, named, configError("SSLRootCert", "database URL sets sslrootcert and DATABASE_SSL_ROOT_CERT is set too: keep one")
		}
		if roots, err = rootCerts(c.SSLRootCert); err != nil {
			return nil, named, &ConfigError{Field: "SSLRootCert", Msg: err.Error()}
		}
	}
	connString := c.URL
	if c.SecretARN != "" && !named.host() {
		// Host (and, unless the URL names them, port and database) come
		// from the secret on first connect; until then a placeholder that
		// is not local stands in, so that the TLS rule below applies.
		connString = withSecretHost(connString, named)
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		if named.keys["sslrootcert"] {
			// pgx reads the bundle while it parses; its error names the
			// file, and the string may hold a password.
			return nil, named, configError("URL", "database URL is not a valid PostgreSQL connection string, or its sslrootcert names no readable PEM CA bundle")
		}
		return nil, named, configError("URL", "database URL is not a valid PostgreSQL connection string")
	}
	cc := cfg.ConnConfig
	// Before any host is printed (the TLS rule) or looked up: a host or
	// database name that holds what an unescaped '@' or '/' cut out of a
	// password.
	for _, a := range attempts(cc) {
		if !plausibleHost(a.Host) {
			return nil, named, &ConfigError{Field: "URL", Msg: errAmbiguousURL.Error()}
		}
	}
	// pgx names the user in every connect error ("failed to connect to
	// `user=...`"), so a password encoded together with the user name (a
	// templated urlencode(user + ":" + password), or user=app:pw) would be
	// printed by the first one. No user name this project's roles take holds
	// a ':'.
	if strings.ContainsRune(cc.User, ':') {
		return nil, named, configError("URL", "database user name holds ':' (a password encoded together with it?): give user and password apart, user:password@host, each percent-encoded on its own; the value is not shown")
	}
	// The pool's size is MaxConns (DATABASE_MAX_CONNS), which would
	// silently override a size in the URL. Asked of the parser (pgxpool
	// takes the setting out of what it returns), so that an encoded name
	// counts and the text in a password does not.
	if pc, err := pgconn.ParseConfig(connString); err == nil {
		if _, ok := pc.RuntimeParams["pool_max_conns"]; ok {
			return nil, named, configError("URL", "database URL sets pool_max_conns: set DATABASE_MAX_CONNS instead")
		}
		// One of the two would silently give way to the other.
		if v, ok := pc.RuntimeParams["default_query_exec_mode"]; ok && modeSet && execModes[strings.ToLower(v)] != mode {
			return nil, named, configError("URL", "database URL sets default_query_exec_mode to another mode than DATABASE_EXEC_MODE: set only one")
		}
	}
	cfg.MaxConns = cmp.Or(c.MaxConns, 4)
	if err := checkPoolSettings(cfg); err != nil {
		return nil, named, &ConfigError{Field: "URL", Msg: err.Error()}
	}
	if roots != nil {
		verifyFull(cc, roots)
	}
	if !c.InsecureTLS {
		if host, ok := everyHostVerified(cc); !ok {
			if host == secretPlaceholderHost {
				return nil, named, configError("URL", "the database secret's host is not local: DATABASE_URL must use sslmode=verify-full, or leave sslmode out")
			}
			return nil, named, configError("URL", "database host %s is not local: use sslmode=verify-full (with sslrootcert naming the RDS CA bundle when not behind RDS Proxy)", host)
		}
	}
	if modeSet {
		cc.DefaultQueryExecMode = mode
	}
	// pgx sends one password to every host it tries, and an IAM token is
	// signed for one host: a fallback host would refuse it.
	for _, fb := range cc.Fallbacks {
		if c.IAMAuth && (fb.Host != cc.Host || fb.Port != cc.Port) {
			return nil, named, configError("URL", "DATABASE_IAM_AUTH takes one database host: a token is signed for one host, and every host of a multi-host DATABASE_URL would be sent the first one's (name one endpoint, an RDS Proxy's, say)")
		}
	}
	// A cache the mode needs, sized 0 in the URL, fails every query.
	switch {
	case cc.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cc.StatementCacheCapacity == 0:
		return nil, named, configError("URL", "database URL sets statement_cache_capacity=0, which the cache_statement exec mode needs: use the exec or simple_protocol mode (DATABASE_EXEC_MODE, or the URL's default_query_exec_mode, not both), or leave the capacity out")
	case cc.DefaultQueryExecMode == pgx.QueryExecModeCacheDescribe && cc.DescriptionCacheCapacity == 0:
		return nil, named, configError("URL", "database URL sets description_cache_capacity=0, which the cache_describe exec mode needs: use the exec or simple_protocol mode (DATABASE_EXEC_MODE, or the URL's default_query_exec_mode, not both), or leave the capacity out")
	}
	return cfg, named, nil
}

// checkPoolSettings refuses pgxpool settings (pool_* in the URL) the pool
// cannot run with: pgxpool would panic on a health check period that is not
// positive (time.NewTicker), and reads negative times and counts as nonsense.
func checkPoolSettings(cfg *pgxpool.Config) error {
	bad := func(name, want string, got any) error {
		return fmt.Errorf("database URL sets %s to %v: it must be %s", name, got, want)
	}
	switch {
	case cfg.HealthCheckPeriod <= 0:
		return bad("pool_health_check_period", "positive", cfg.HealthCheckPeriod)
	case cfg.MaxConnLifetime < 0:
		return bad("pool_max_conn_lifetime", "0 or more", cfg.MaxConnLifetime)
	case cfg.MaxConnLifetimeJitter < 0:
		return bad("pool_max_conn_lifetime_jitter", "0 or more", cfg.MaxConnLifetimeJitter)
	case cfg.MaxConnIdleTime < 0:
		return bad("pool_max_conn_idle_time", "0 or more", cfg.MaxConnIdleTime)
	case cfg.PingTimeout < 0:
		return bad("pool_ping_timeout", "0 or more", cfg.PingTimeout)
	case cfg.MinConns < 0 || cfg.MinConns > cfg.MaxConns:
		return bad("pool_min_conns", fmt.Sprintf("0 to the pool size (DATABASE_MAX_CONNS, %d)", cfg.MaxConns), cfg.MinConns)
	case cfg.MinIdleConns < 0 || cfg.MinIdleConns > cfg.MaxConns:
		return bad("pool_min_idle_conns", fmt.Sprintf("0 to the pool size (DATABASE_MAX_CONNS, %d)", cfg.MaxConns), cfg.MinIdleConns)
	}
	return nil
}

// isLocal reports whether host can only be this machine: a loopback
// address, "localhost" (which Go's resolver and glibc answer from the hosts
// file) or a Unix socket directory. Other names, *.localhost among them, are
// asked of DNS, which may answer with any address.
func isLocal(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// attempts returns every host a connection may try: the first and each
// fallback of a multi-host string (and the plaintext retry of sslmode=prefer).
func attempts(cc *pgx.ConnConfig) []*pgconn.FallbackConfig {
	return append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
}

// everyHostVerified reports whether every host a connection may reach — the
// first and each fallback of a multi-host string — is local or verifies the
// server's certificate and name (sslmode=verify-full: no plaintext fallback,
// no skipped verification). When not, it returns the first host at fault.
func everyHostVerified(cc *pgx.ConnConfig) (string, bool) {
	for _, a := range attempts(cc) {
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
	_, err := rootCerts(path)
	return err
}

func rootCerts(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err // named below, as shownPath allows
		}
		return nil, fmt.Errorf("database CA bundle %s: %w", shownPath(path), err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("database CA bundle %s holds no PEM certificate", shownPath(path))
	}
	return roots, nil
}

// shownWord quotes v for an error when it is a word, as a mode's name is;
// anything else (a connection string pasted into the wrong variable) is
// not shown, as it may hold a password.
func shownWord(v string) string {
	if len(v) <= 32 && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == "" {
		return strconv.Quote(v)
	}
	return "(the value is not shown: it is not a mode's name, and may be a connection string)"
}

// shownPath quotes a file path for an error unless it looks like a
// connection string (a URL, key=value settings, user@host), which may
// hold a password.
func shownPath(path string) string {
	if strings.Contains(path, "://") || strings.ContainsAny(path, "=@") {
		return "(path not shown: it looks like a connection string)"
	}
	return strconv.Quote(path)
}

// verifyFull makes every attempt of cc verify the server's certificate
// against roots and its name against the host (sslmode=verify-full), on the
// configuration pgx parsed, so that nothing else the connection string says
// changes. The plaintext attempts of sslmode=prefer or allow go, and so does
// the second attempt at the same host they leave; Unix sockets keep no TLS,
// as pgx gives them none.
func verifyFull(cc *pgx.ConnConfig, roots *x509.CertPool) {
	var template *tls.Config // client certificates, sslnegotiation=direct
	for _, a := range attempts(cc) {
		if a.TLSConfig != nil {
			template = a.TLSConfig
			break
		}
	}
	var out []*pgconn.FallbackConfig
	seen := map[string]bool{}
	for _, a := range attempts(cc) {
		endpoint := net.JoinHostPort(a.Host, strconv.Itoa(int(a.Port)))
		if seen[endpoint] {
			continue
		}
		seen[endpoint] = true
		f := &pgconn.FallbackConfig{Host: a.Host, Port: a.Port}
		if network, _ := pgconn.NetworkAddress(a.Host, a.Port); network != "unix" {
			t := &tls.Config{}
			if template != nil {
				t = template.Clone()
			} else if cc.SSLNegotiation == "direct" {
				// sslmode=disable: pgx built no TLS settings to start from.
				// A direct handshake needs the ALPN pgx would have set
				// (PostgreSQL 17 refuses one without it). Client
				// certificates, which pgx reads only for a TLS sslmode,
				// are not loaded.
				t.NextProtos = []string{"postgresql"}
			}
			t.InsecureSkipVerify, t.VerifyPeerCertificate, t.VerifyConnection = false, nil, nil
			t.RootCAs, t.ServerName = roots, a.Host
			f.TLSConfig = t
		}
		out = append(out, f)
	}
	cc.Host, cc.Port, cc.TLSConfig = out[0].Host, out[0].Port, out[0].TLSConfig
	cc.Fallbacks = out[1:]
}

// Open validates c and creates a pool. It does not connect: the first query
// does. awsCfg is needed only with SecretARN or IAMAuth.
func Open(ctx context.Context, c Config, awsCfg *aws.Config) (*pgxpool.Pool, error) {
	cfg, named, err := c.poolConfig()
	if err != nil {
		return nil, err
	}
	if (c.SecretARN != "" || c.IAMAuth) && awsCfg == nil {
		return nil, errors.New("database credentials from AWS need an AWS configuration")
	}
	switch {
	case c.SecretARN != "":
		src := &secretSource{
			arn:        c.SecretARN,
			ttl:        cmp.Or(c.SecretTTL, 5*time.Minute),
			minRefetch: cmp.Or(c.SecretMinRefetch, 5*time.Second),
			client:     secretsmanager.NewFromConfig(*awsCfg),
			fromURL:    named,
		}
		cfg.BeforeConnect = src.beforeConnect
	case c.IAMAuth:
		creds, region := awsCfg.Credentials, awsCfg.Region
		if region == "" || creds == nil {
			return nil, errors.New("DATABASE_IAM_AUTH needs an AWS region and credentials to sign its tokens: set AWS_REGION (Lambda sets it)")
		}
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

// ArbiterIndexSwapped reports the error PostgreSQL raises for an INSERT ...
// ON CONFLICT into a partition whose unique index REINDEX INDEX
// CONCURRENTLY is swapping for its rebuilt copy (the partition manager's
// compaction): XX000 "invalid arbiter index list", whether or not the row
// conflicts. The statement wrote nothing (it failed, and its transaction
// with it) and succeeds once the swap is done, a moment later: it may run
// again.
func ArbiterIndexSwapped(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == CodeInternalError && pgErr.Message == "invalid arbiter index list"
}

// SQLSTATE codes this module reacts to.
const (
	CodeCheckViolation        = "23514" // also raised for "no partition of relation found for row"
	CodeDeadlockDetected      = "40P01"
	CodeInsufficientPrivilege = "42501"
	CodeInternalError         = "XX000"
	CodeInvalidPassword       = "28P01" // password authentication failed
	CodeLockNotAvailable      = "55P03" // lock_timeout expired
	CodeQueryCanceled         = "57014" // statement_timeout expired
	CodeSerializationFailure  = "40001" // under REPEATABLE READ or SERIALIZABLE
	CodeUndefinedColumn       = "42703"
	CodeUndefinedFunction     = "42883"
	CodeUndefinedTable        = "42P01"
	CodeUniqueViolation       = "23505"
)
