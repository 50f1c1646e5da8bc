package database_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// pgx, like libpq, ends the user name and password at the first '@' (and the
// authority at the first '/'): an unescaped '@' or '/' in a password moves
// its tail into the host or the database name, from where an error message,
// a log line or a DNS lookup would carry it. Such a URL is refused with a
// message that echoes neither the tail nor the host.
func TestAPasswordWithAnUnescapedAtOrSlashIsRefusedWithoutAWordOfIt(t *testing.T) {
	t.Parallel()
	const tail = "9kLmNpQ" // what follows the '@' or '/' in the password
	for _, c := range []database.Config{
		{URL: "postgres://app:Xy@9kLmNpQ@10.0.0.5:5432/app"},
		{URL: "postgres://app:Xy@9kLmNpQ@db.example.com:5432/app?sslmode=verify-full"},
		{URL: "postgresql://app:Xy@9kLmNpQ@db.example.com/app?sslmode=verify-full", InsecureTLS: true},
		{URL: "postgres://app:Xy@9kLmNpQ@db.example.com/?sslmode=verify-full", SecretARN: "arn:x"},
		// A '/' ends the authority first: the tail lands in the database name.
		{URL: "postgres://app:5432/9kLmNpQ@db.example.com/app?sslmode=verify-full"},
		// A host no DNS name or address looks like.
		{URL: "host='db.example.com!9kLmNpQ' sslmode=verify-full"},
	} {
		_, err := c.PoolConfig()
		require.Error(t, err, c.URL)
		require.ErrorContains(t, err, "percent-encode @ / : ? #", c.URL)
		require.NotContains(t, err.Error(), tail, c.URL)
		require.NotContains(t, err.Error(), "example.com", "no host is echoed")
		require.NotContains(t, err.Error(), "10.0.0.5", "no host is echoed")
		var ce *database.ConfigError
		require.True(t, errors.As(err, &ce), c.URL)
		require.Equal(t, "URL", ce.Field)

		// Open refuses it too, before any lookup or connection.
		_, err = database.Open(context.Background(), c, nil)
		require.Error(t, err)
		require.NotContains(t, err.Error(), tail)
	}

	// Percent-encoded, the same password is fine.
	cfg, err := database.Config{URL: "postgres://app:Xy%409kLmNpQ@10.0.0.5:5432/app?sslmode=verify-full"}.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, "Xy@9kLmNpQ", cfg.ConnConfig.Password)
	require.Equal(t, "10.0.0.5", cfg.ConnConfig.Host)
}

// Settings of pgxpool in DATABASE_URL are checked with the rest: a health
// check period that is not positive would make pgxpool panic
// (time.NewTicker) when the pool is created, on a Lambda function's first
// invocation after an init that passed.
func TestPoolSettingsInTheURLAreValidated(t *testing.T) {
	t.Parallel()
	for setting, name := range map[string]string{
		"pool_health_check_period=0s":         "pool_health_check_period",
		"pool_health_check_period=-1s":        "pool_health_check_period",
		"pool_max_conn_lifetime=-1s":          "pool_max_conn_lifetime",
		"pool_max_conn_lifetime_jitter=-1s":   "pool_max_conn_lifetime_jitter",
		"pool_max_conn_idle_time=-1m":         "pool_max_conn_idle_time",
		"pool_ping_timeout=-1s":               "pool_ping_timeout",
		"pool_min_conns=-1":                   "pool_min_conns",
		"pool_min_conns=5":                    "pool_min_conns", // over the pool size, 4
		"pool_min_idle_conns=-2":              "pool_min_idle_conns",
		"pool_health_check_period=soon":       "not a valid PostgreSQL connection string",
		"pool_max_conn_lifetime=9999999999h0": "not a valid PostgreSQL connection string",
	} {
		c := database.Config{URL: "postgres://u:secret@127.0.0.1:1/db?" + setting}
		_, err := c.PoolConfig()
		require.ErrorContains(t, err, name, setting)
		require.NotContains(t, err.Error(), "secret")
		pool, err := database.Open(context.Background(), c, nil)
		require.Error(t, err, setting)
		require.Nil(t, pool)
	}
	for _, setting := range []string{
		"pool_health_check_period=30s", "pool_max_conn_lifetime=0s", "pool_max_conn_idle_time=0s",
		"pool_min_conns=4", "pool_min_idle_conns=1", "pool_max_conn_lifetime_jitter=5m",
	} {
		_, err := database.Config{URL: "postgres://u@127.0.0.1/db?" + setting}.PoolConfig()
		require.NoError(t, err, setting)
	}
}

// DATABASE_SSL_ROOT_CERT changes the TLS settings of the parsed
// configuration and nothing else: the URL text is not rewritten, so a '+',
// a ';' or a multi-host list with an IPv6 address mean what they meant.
func TestSSLRootCertLeavesTheRestOfTheURLAlone(t *testing.T) {
	t.Parallel()
	path, _ := caBundle(t, "ca.pem")
	for _, u := range []string{
		"postgres://app@db.example.com/app?password=p+w",
		"postgres://app@db.example.com/app?options=-c%20search_path%3Darchive+x",
		"postgres://app@db.example.com/app?application_name=sweep;eu",
		"postgres://app@[2001:db8::1]:5432,db2.example.com:5433/app",
		"postgres://app:p%2Bw@db.example.com/app?search_path=a%2Cb",
	} {
		plain, err := database.Config{URL: u, InsecureTLS: true}.PoolConfig()
		require.NoError(t, err, u)
		withCA, err := database.Config{URL: u, SSLRootCert: path}.PoolConfig()
		require.NoError(t, err, "%s: valid without DATABASE_SSL_ROOT_CERT, refused with it", u)
		p, w := plain.ConnConfig, withCA.ConnConfig
		require.Equal(t, p.Password, w.Password, u)
		require.Equal(t, p.Database, w.Database, u)
		require.Equal(t, p.RuntimeParams, w.RuntimeParams, u)
		require.Equal(t, p.Host, w.Host, u)
		require.Equal(t, hosts(p), hosts(w), "%s: the hosts stay, the plaintext retries go", u)
		require.Len(t, w.Fallbacks, len(hosts(w))-1, u)
		require.Equal(t, p.Host, w.TLSConfig.ServerName, u)
		require.False(t, w.TLSConfig.InsecureSkipVerify, u)
	}
}

// hosts lists the distinct host:port pairs a connection may try, in order.
func hosts(cc *pgx.ConnConfig) []string {
	var out []string
	seen := map[string]bool{}
	for _, a := range append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port}}, cc.Fallbacks...) {
		hp := fmt.Sprintf("%s:%d", a.Host, a.Port)
		if !seen[hp] {
			seen[hp] = true
			out = append(out, hp)
		}
	}
	return out
}

// Only names that can reach nothing but this machine are exempt from the
// TLS rule. *.localhost is asked of DNS by Go's resolver and by glibc, and
// DNS may answer with any address.
func TestOnlyLoopbackAndLocalhostAreExemptFromTLS(t *testing.T) {
	t.Parallel()
	for host, local := range map[string]bool{
		"localhost":            true,
		"127.0.0.1":            true,
		"127.1.2.3":            true,
		"[::1]":                true,
		"%2Fvar%2Frun%2Fpg":    true, // a Unix socket directory
		"archive-db.localhost": false,
		"localhost.example":    false,
		"10.0.0.5":             false,
	} {
		_, err := database.Config{URL: "postgres://u:pw@" + host + "/app?sslmode=disable"}.PoolConfig()
		require.Equal(t, local, err == nil, "%s: %v", host, err)
	}
}

// secretARN is the secret fakeSecretsManager serves.
const secretARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:archive-db"

// With DATABASE_SECRET_ARN, DATABASE_URL may add options only: the host,
// port and database still come from the secret, and the secret's host is
// held to the TLS rule as when there is no URL.
func TestASecretKeepsItsHostWhenTheURLAddsOnlyOptions(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	var calls atomic.Int32
	srv := fakeSecretsManager(t, map[string]any{
		"username": cc.User, "password": "pw", "host": cc.Host, "port": fmt.Sprint(cc.Port), "dbname": cc.Database,
	}, &calls)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range []string{
		"postgres:///?search_path=" + db.Schema,
		"postgresql://?search_path=" + db.Schema + "&application_name=options-only",
		"search_path=" + db.Schema,
	} {
		pool, err := database.Open(ctx, database.Config{SecretARN: secretARN, URL: u}, awsConfig(srv.URL))
		require.NoError(t, err, u)
		var schema string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema), "%s: the pool connects to the secret's host %s:%d", u, cc.Host, cc.Port)
		require.Equal(t, db.Schema, schema, u)
		pool.Close()
	}
	// A weaker sslmode beside the secret is refused: the secret's host is
	// not known to be local until the first connection.
	_, err = database.Config{SecretARN: secretARN, URL: "postgres:///?sslmode=require"}.PoolConfig()
	require.ErrorContains(t, err, "secret's host")
}

// A URL naming the host (an RDS Proxy endpoint) but no database leaves the
// database to the secret; the server would otherwise pick the database named
// after the user.
func TestASecretKeepsItsDatabaseBehindAProxyURL(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	ctx := context.Background()
	var buf [4]byte
	_, _ = rand.Read(buf[:])
	name := "secret_db_" + hex.EncodeToString(buf[:])
	_, err = db.Pool.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })

	var calls atomic.Int32
	srv := fakeSecretsManager(t, map[string]any{
		// The port is the instance's, which behind a proxy is not used.
		"username": cc.User, "password": "pw", "host": "instance.example.com", "port": 1, "dbname": name,
	}, &calls)
	proxy := fmt.Sprintf("postgres://%s:%d/?sslmode=disable", cc.Host, cc.Port) // the "proxy"
	if strings.HasPrefix(cc.Host, "/") {
		// The test harness's cluster, on a Unix socket.
		proxy = fmt.Sprintf("postgres:///?host=%s&port=%d&sslmode=disable", cc.Host, cc.Port)
	}
	pool, err := database.Open(ctx, database.Config{SecretARN: secretARN, URL: proxy}, awsConfig(srv.URL))
	require.NoError(t, err)
	defer pool.Close()
	var current string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&current))
	require.Equal(t, name, current, "the secret's dbname was ignored")
}

// Every database error names the field at fault, so that settings can name
// the variable.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for field, c := range map[string]database.Config{
		"ExecMode":    {URL: "postgres://u@localhost/app", ExecMode: "turbo"},
		"MaxConns":    {URL: "postgres://u@localhost/app", MaxConns: -1},
		"URL":         {URL: "postgres://u@db.example.com/app"},
		"IAMAuth":     {URL: "postgres://u@localhost/app", SecretARN: "arn:x", IAMAuth: true},
		"SSLRootCert": {URL: "postgres://u@localhost/app", SSLRootCert: "/nonexistent/ca.pem"},
	} {
		_, err := c.PoolConfig()
		var ce *database.ConfigError
		require.True(t, errors.As(err, &ce), "%s: %v", field, err)
		require.Equal(t, field, ce.Field)
	}
}

// A connection string that is neither a postgres:// URL nor keyword=value
// pairs (a JDBC URL, an SQLAlchemy one) is refused without a word of it:
// pgx would read it as keyword=value pairs and send its "keywords" and their
// values, a password among them, to the server as settings. Keyword/value
// strings, custom settings with a '.' included, are read as before.
func TestAConnectionStringOfAnotherDialectIsRefusedWithoutAWordOfIt(t *testing.T) {
	t.Parallel()
	const secret = "s3cretPw"
	for _, url := range []string{
		"jdbc:postgresql://db.example.com/app?user=app&password=" + secret,
		"postgresql+psycopg2://app:" + secret + "@db.example.com/app?sslmode=verify-full",
		"host=db.example.com password=" + secret + " =x",
	} {
		_, err := database.Config{URL: url}.PoolConfig()
		require.ErrorContains(t, err, "neither a postgres:// URL nor keyword=value pairs", url)
		require.NotContains(t, err.Error(), secret)
		require.NotContains(t, err.Error(), "example.com")
	}
	cfg, err := database.Config{URL: "host=db.example.com user=app password='a b' sslmode=verify-full idemarchive.flag=on myapp.cost$limit=5 app.größe=1 application_name=x"}.PoolConfig()
	require.NoError(t, err)
	require.Equal(t, "a b", cfg.ConnConfig.Password)
	require.Equal(t, "on", cfg.ConnConfig.RuntimeParams["idemarchive.flag"])
	require.Equal(t, "5", cfg.ConnConfig.RuntimeParams["myapp.cost$limit"], "PostgreSQL takes '$' in a setting's name")
	require.Equal(t, "1", cfg.ConnConfig.RuntimeParams["app.größe"], "and letters of any script")
}

// A connection string pasted into another variable is not echoed by its
// error (the init line of a function redacts it, a library caller's may
// not): an exec mode that is not a word, a CA bundle path that looks like
// a connection string. A word, or a path, is still quoted; and a URL whose
// sslrootcert names no bundle is told so, naming no path.
func TestConfigErrorsDoNotEchoAConnectionString(t *testing.T) {
	t.Parallel()
	const secret = "Zq7SecretXyz"
	for field, c := range map[string]database.Config{
		"ExecMode":    {URL: "postgres://u@localhost/app", ExecMode: "host=db user=app password=" + secret},
		"SSLRootCert": {URL: "postgres://u@localhost/app", SSLRootCert: "postgres://app:" + secret + "@db.example.com/app"},
	} {
		_, err := c.PoolConfig()
		var ce *database.ConfigError
		require.True(t, errors.As(err, &ce), "%s: %v", field, err)
		require.Equal(t, field, ce.Field)
		require.NotContains(t, err.Error(), secret, field)
	}
	_, err := database.Config{URL: "postgres://u@localhost/app", ExecMode: "turbo"}.PoolConfig()
	require.ErrorContains(t, err, `unknown statement execution mode "turbo"`)
	_, err = database.Config{URL: "postgres://u@localhost/app", SSLRootCert: "/nonexistent/ca.pem"}.PoolConfig()
	require.ErrorContains(t, err, `database CA bundle "/nonexistent/ca.pem": no such file or directory`)
	_, err = database.Config{URL: "postgres://u@localhost/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"}.PoolConfig()
	require.ErrorContains(t, err, "its sslrootcert names no readable PEM CA bundle")
}

// pgx names the user in every connect error, so a password encoded together
// with the user name (its ':' percent-encoded too, or user=app:pw) would be
// printed by the first failed connection. Such a string is refused before
// any, without a word of it.
func TestAPasswordFoldedIntoTheUserNameIsRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app%3As3cretpw@10.0.0.5:5432/db?sslmode=verify-full",
		"host=10.0.0.5 port=5432 user=app:s3cretpw sslmode=verify-full",
		"host=10.0.0.5 user='app:s3cretpw' password=x sslmode=verify-full",
	} {
		_, err := database.Config{URL: u}.PoolConfig()
		require.Error(t, err, u)
		require.ErrorContains(t, err, "user name holds ':'", u)
		require.NotContains(t, err.Error(), "s3cretpw", u)
		var ce *database.ConfigError
		require.True(t, errors.As(err, &ce), u)
		require.Equal(t, "URL", ce.Field)
	}
	cfg, err := database.Config{URL: "postgres://app:s3cret%3Apw@10.0.0.5:5432/db?sslmode=verify-full"}.PoolConfig()
	require.NoError(t, err, "a ':' in the password alone is fine")
	require.Equal(t, "app", cfg.ConnConfig.User)
	require.Equal(t, "s3cret:pw", cfg.ConnConfig.Password)
}
