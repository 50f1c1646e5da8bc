package database_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
)

// pgx, like libpq, ends the user name and password at the first '@' before
// any '/', even inside what looks like a query: a password given as a query
// parameter with an unescaped '@' in a URL without a path would put its tail
// in the host, which the TLS rule's error names and DNS is asked for. Such a
// URL is refused without a word of it, InsecureTLS or not.
func TestAnAtInAQueryPasswordIsRefusedWithoutAWordOfIt(t *testing.T) {
	t.Parallel()
	for _, c := range []database.Config{
		{URL: "postgres://db.example.com?sslmode=verify-full&user=app&password=Xy@9kLmNpQ"},
		{URL: "postgres://db.example.com:5432?user=app&password=Xy@9kLmNpQ&sslmode=verify-full"},
		{URL: "postgres://db.example.com?user=app&password=Xy@9kLmNpQ", InsecureTLS: true},
		{URL: "postgres://db.example.com#frag@9kLmNpQ", InsecureTLS: true},
	} {
		_, err := c.PoolConfig()
		require.Error(t, err, c.URL)
		assert.Contains(t, err.Error(), "ambiguous", c.URL)
		assert.NotContains(t, err.Error(), "9kLmNpQ", c.URL)
		assert.NotContains(t, err.Error(), "Xy", c.URL)
	}
}

// An '@' that cannot be part of the user name or password (in a query value
// after it, percent-encoded in the database name, quoted in keyword/value
// form) is accepted, as pgx reads it unambiguously.
func TestUnambiguousAtsAreAccepted(t *testing.T) {
	t.Parallel()
	for u, db := range map[string]string{
		"postgres://app:pw@db.example.com?sslmode=verify-full&application_name=sweeper@eu-west-1":                           "",
		"postgres://app:pw@db.example.com:5432?options=-c%20search_path%3Darchive&application_name=a@b&sslmode=verify-full": "",
		"postgres://app:pw@db.example.com/pay%40eu?sslmode=verify-full":                                                     "pay@eu",
		"host=db.example.com dbname='pay@eu' sslmode=verify-full":                                                           "pay@eu",
	} {
		cfg, err := database.Config{URL: u}.PoolConfig()
		require.NoError(t, err, u)
		require.Equal(t, "db.example.com", cfg.ConnConfig.Host, u)
		if db != "" {
			require.Equal(t, db, cfg.ConnConfig.Database, u)
		}
	}
}

// With DATABASE_SSL_ROOT_CERT, sslnegotiation=direct keeps the ALPN
// PostgreSQL 17 requires of a direct handshake, whatever sslmode the URL
// gives (under sslmode=disable pgx builds no TLS settings to keep).
func TestSSLRootCertKeepsDirectNegotiation(t *testing.T) {
	t.Parallel()
	path, _ := caBundle(t, "ca.pem")
	for _, u := range []string{
		"postgres://app@db.example.com/app?sslnegotiation=direct&sslmode=allow",
		"postgres://app@db.example.com/app?sslnegotiation=direct",
		"postgres://app@db.example.com/app?sslnegotiation=direct&sslmode=require",
		"postgres://app@db.example.com/app?sslnegotiation=direct&sslmode=disable",
	} {
		cfg, err := database.Config{URL: u, SSLRootCert: path}.PoolConfig()
		require.NoError(t, err, u)
		cc := cfg.ConnConfig
		require.Equal(t, "direct", cc.SSLNegotiation)
		for _, tc := range append([]*pgconn.FallbackConfig{{TLSConfig: cc.TLSConfig}}, cc.Fallbacks...) {
			require.NotNil(t, tc.TLSConfig, u)
			assert.Equal(t, []string{"postgresql"}, tc.TLSConfig.NextProtos, u)
		}
	}
}

// No connection string makes PoolConfig panic, and no refusal echoes the
// password pgx reads in it (one of at least 6 bytes: shorter ones match by
// chance).
func FuzzPoolConfig(f *testing.F) {
	for _, s := range []string{
		"postgres://u:p%40w@h:5/d?sslmode=verify-full", "postgres://[::1]:5,h2/", "postgres:///?host=/tmp",
		"host='a b' dbname = 'it\\'s' sslmode=disable", "postgres://u:Xy@9k@h/db", "postgres://h?password=ab@cdefgh",
		"postgresql://u@[2001:db8::1]:5432,db2.example.com:5433/app?target_session_attrs=read-write",
	} {
		f.Add(s, false, false)
	}
	f.Fuzz(func(t *testing.T, u string, secret, insecure bool) {
		c := database.Config{URL: u, InsecureTLS: insecure}
		if secret {
			c.SecretARN = "arn:x"
		}
		_, err := c.PoolConfig()
		if err == nil || !isURLForm(u) {
			return
		}
		// What pgx itself reads as the password.
		if cfg, perr := pgxParse(u); perr == nil && len(cfg) >= 6 && strings.Contains(err.Error(), cfg) {
			t.Fatalf("error %q holds the password %q", err, cfg)
		}
	})
}

func isURLForm(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

func pgxParse(u string) (string, error) {
	cc, err := pgconn.ParseConfig(u)
	if err != nil {
		return "", err
	}
	return cc.Password, nil
}
