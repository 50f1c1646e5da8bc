package database

import (
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The port of an RDS secret is a number or a decimal string, 1 to 65535;
// anything else fails the connection with an error that holds no value of the
// secret, rather than be read for its leading digits, as port 0, or ignored.
func TestASecretPortIsReadStrictly(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]uint16{`5432`: 5432, `"5432"`: 5432, `65535`: 65535, `"1"`: 1} {
		p, ok, err := parsePort(json.RawMessage(raw))
		require.NoError(t, err, raw)
		require.True(t, ok)
		require.Equal(t, want, p, raw)
	}
	for _, raw := range []string{``, `null`} {
		_, ok, err := parsePort(json.RawMessage(raw))
		require.NoError(t, err)
		require.False(t, ok, "no port: %q", raw)
	}
	for _, raw := range []string{`"5432abc"`, `"0"`, `0`, `70000`, `"70000"`, `-1`, `5432.0`, `5e3`, `" 5432"`, `"+5432"`, `""`, `{"n":1}`, `true`} {
		cc, err := pgx.ParseConfig("host=secret.invalid sslmode=verify-full")
		require.NoError(t, err)
		err = (&secretSource{}).apply(cc, rdsSecret{Username: "u", Password: "p", Host: "db.example.com", Port: json.RawMessage(raw)})
		require.EqualError(t, err, errSecretPort.Error(), raw)
	}
	// Behind a proxy the URL names, the secret's port is not used, and a
	// hand-made secret's odd port does not fail every connection.
	c := Config{URL: "postgres://proxy.example.com/archive?sslmode=verify-full", SecretARN: "arn:x"}
	cfg, named, err := c.poolConfig()
	require.NoError(t, err)
	for _, raw := range []string{`""`, `5432.0`} {
		cc := cfg.ConnConfig.Copy()
		require.NoError(t, (&secretSource{fromURL: named}).apply(cc, rdsSecret{Username: "u", Password: "p", Host: "instance.example.com", Port: json.RawMessage(raw)}), raw)
		require.Equal(t, "proxy.example.com", cc.Host)
	}
}

// apply takes from the secret what DATABASE_URL does not name: the host
// unless the URL names one, the port unless the URL names a host or a port,
// the database unless the URL names one.
func TestApplyTakesFromTheSecretWhatTheURLDoesNotName(t *testing.T) {
	t.Parallel()
	sec := rdsSecret{Username: "u", Password: "p", Host: "instance.example.com", Port: json.RawMessage(`6543`), DBName: "fromsecret"}
	for _, tc := range []struct {
		url        string
		host, db   string
		port       uint16
		serverName string
	}{
		{"", "instance.example.com", "fromsecret", 6543, "instance.example.com"},
		{"postgres:///?search_path=x", "instance.example.com", "fromsecret", 6543, "instance.example.com"},
		{"postgres://:7000/", "instance.example.com", "fromsecret", 7000, "instance.example.com"},
		{"postgres:///fromurl", "instance.example.com", "fromurl", 6543, "instance.example.com"},
		{"postgres://proxy.example.com/", "proxy.example.com", "fromsecret", 5432, "proxy.example.com"},
		{"postgres://proxy.example.com/?dbname=fromurl", "proxy.example.com", "fromurl", 5432, "proxy.example.com"},
		{"dbname=fromurl", "instance.example.com", "fromurl", 6543, "instance.example.com"},
		{"host=proxy.example.com port=7000", "proxy.example.com", "fromsecret", 7000, "proxy.example.com"},
	} {
		c := Config{URL: tc.url, SecretARN: "arn:x"}
		if tc.url != "" {
			c.URL += map[bool]string{true: "sslmode=verify-full", false: " sslmode=verify-full"}[isURL(tc.url)]
			if isURL(tc.url) {
				c.URL = tc.url + map[bool]string{true: "&", false: "?"}[containsQuery(tc.url)] + "sslmode=verify-full"
			}
		}
		cfg, named, err := c.poolConfig()
		require.NoError(t, err, c.URL)
		cc := cfg.ConnConfig.Copy()
		require.NoError(t, (&secretSource{fromURL: named}).apply(cc, sec), c.URL)
		require.Equal(t, tc.host, cc.Host, c.URL)
		require.Equal(t, tc.port, cc.Port, c.URL)
		require.Equal(t, tc.db, cc.Database, c.URL)
		require.Equal(t, tc.serverName, cc.TLSConfig.ServerName, c.URL)
		for _, f := range cc.Fallbacks {
			require.Equal(t, tc.host, f.Host, c.URL)
		}
	}
}

func containsQuery(u string) bool {
	n, _ := namedSettings(u)
	return n.hasQuery
}

// A connection string is scanned for the settings it names as pgx reads it.
func TestNamedSettings(t *testing.T) {
	t.Parallel()
	for s, want := range map[string][]string{
		"postgres:///?search_path=x":                    {"search_path"},
		"postgres://u:p%40w@h:5/d?sslmode=verify-full":  {"host", "port", "database", "sslmode"},
		"postgres://[::1]:5,h2/":                        {"host", "port"},
		"postgres://:5/":                                {"port"},
		"postgres:///?host=h&db%6eame=d":                {"host", "database"},
		"postgres://u@/?port=1":                         {"port"},
		`host='a b' dbname = 'it\'s' sslmode=disable`:   {"host", "database", "sslmode"},
		`user=u password='p\' host=x' search_path=a\ b`: {"user", "password", "search_path"},
	} {
		n, err := namedSettings(s)
		require.NoError(t, err, s)
		var got []string
		for k := range n.keys {
			got = append(got, k)
		}
		require.ElementsMatch(t, want, got, s)
	}
}
