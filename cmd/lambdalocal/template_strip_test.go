package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// templateDatabaseURL runs `lambdalocal template` with DATABASE_URL set to
// dsn and returns the template's bytes and its DATABASE_URL.
func templateDatabaseURL(t *testing.T, dsn string) (string, string) {
	t.Helper()
	t.Setenv("DATABASE_URL", dsn)
	out := filepath.Join(t.TempDir(), "t.json")
	var stderr bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"template", "-o", out}, &stderr, &stderr), "%q", dsn)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Resources map[string]struct {
			Properties struct {
				Environment struct{ Variables map[string]string }
			}
		}
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Len(t, doc.Resources, 3)
	vars := doc.Resources["LookupFunction"].Properties.Environment.Variables
	require.Contains(t, vars, "DATABASE_URL")
	return string(raw), vars["DATABASE_URL"]
}

// pgxSecretKeys returns the password and sslpassword keys pgx itself reads
// from connString, from the string alone (not PGPASSWORD nor a passfile).
func pgxSecretKeys(t *testing.T, connString string) []string {
	t.Helper()
	var found []string
	for _, key := range []string{"password", "sslpassword"} {
		// Every key but this one is allowed: pgx refuses the string if it
		// holds it.
		others := []string{"host", "port", "user", "database", "sslmode", "sslkey", "sslcert",
			"application_name", "target_session_attrs", "search_path", "options", "ssl", "connect_timeout"}
		if key == "password" {
			others = append(others, "sslpassword")
		} else {
			others = append(others, "password")
		}
		_, err := pgconn.ParseConfigWithOptions(connString, pgconn.ParseConfigOptions{ConnStringAllowedKeys: others})
		if err != nil && strings.Contains(err.Error(), `connection string key "`+key+`" is not in ConnStringAllowedKeys`) {
			found = append(found, key)
		}
	}
	return found
}

// Each DATABASE_URL below is one pgx reads a password (or a client key
// passphrase) from; the template gets it without, and with everything else
// exactly as written.
func TestTemplateStripsSecretsAsPgxReadsThem(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		// The red team's: a leading blank (settings trims it) ...
		{" postgres://archive:Zq9Secr3t@db.example.com:5432/app?sslmode=verify-full", "postgres://archive@db.example.com:5432/app?sslmode=verify-full"},
		{"\tpostgres://archive:Zq9Secr3t@db.example.com:5432/app?sslmode=verify-full\n", "postgres://archive@db.example.com:5432/app?sslmode=verify-full"},
		// ... a query pair holding ';' (net/url drops it, pgx does not) ...
		{"postgres://archive@db.example.com:5432/app?sslmode=verify-full&password=Zq9Secr3t;x", "postgres://archive@db.example.com:5432/app?sslmode=verify-full"},
		// ... no blank between a quoted value and the next keyword ...
		{"host=db.example.com dbname='app'password=Zq9Secr3t sslmode=verify-full", "host=db.example.com dbname='app'sslmode=verify-full"},
		// ... a quoted value holding "password=".
		{"host=db.example.com application_name='x password=' password='Zq9 Secr3t' sslmode=verify-full", "host=db.example.com application_name='x password=' sslmode=verify-full"},
		// Multi-host URLs, IPv6 hosts among them.
		{"postgres://archive:Zq9Secr3t@h1.example.com:5432,h2.example.com:5433/app?target_session_attrs=read-write&sslmode=verify-full", "postgres://archive@h1.example.com:5432,h2.example.com:5433/app?target_session_attrs=read-write&sslmode=verify-full"},
		{"postgresql://archive@[::1]:5432,[::2]:5433/app?password=Zq9Secr3t&sslmode=verify-full", "postgresql://archive@[::1]:5432,[::2]:5433/app?sslmode=verify-full"},
		// Percent-encoded keys, in the order written (net/url sorts them).
		{"postgres://archive@db.example.com/app?sslmode=verify-full&pass%77ord=Zq9Secr3t&application_name=lookup", "postgres://archive@db.example.com/app?sslmode=verify-full&application_name=lookup"},
		{"postgres://archive@db.example.com/app?sslmode=verify-full&%73slpassword=Zq9Secr3t&application_name=a;b", "postgres://archive@db.example.com/app?sslmode=verify-full&application_name=a;b"},
		// A password in both the userinfo and the query.
		{"postgres://archive:Zq9Secr3t@db.example.com/app?sslmode=verify-full&password=Zq9Other&application_name=lookup", "postgres://archive@db.example.com/app?sslmode=verify-full&application_name=lookup"},
		// sslpassword, the client key's passphrase.
		{"host=db.example.com dbname='app'sslpassword=Zq9Secr3t sslkey=/k.pem", "host=db.example.com dbname='app'sslkey=/k.pem"},
		{"postgres://archive@db.example.com/app?sslkey=/k.pem&sslpassword=Zq9Secr3t&sslmode=verify-full&application_name=a;b", "postgres://archive@db.example.com/app?sslkey=/k.pem&sslmode=verify-full&application_name=a;b"},
		// Keyword values with \' and \\ escapes.
		{`host=h application_name='a\' password=x' password=Zq9Secr3t dbname=d`, `host=h application_name='a\' password=x' dbname=d`},
		{`host=h password='Zq9Secr3t\\' application_name='lookup' dbname=d`, `host=h application_name='lookup' dbname=d`},
		{`host=h password='Zq9\'Secr3t' dbname='d\\'`, `host=h dbname='d\\'`},
		// Tabs and newlines as separators.
		{"host=h\tpassword=Zq9Secr3t\ndbname=d", "host=h\tdbname=d"},
		{"host=h\r\n\tsslpassword='Zq9 Secr3t'\vdbname=d\fpassword=Zq9Secr3t", "host=h\r\n\tdbname=d"},
	} {
		got, stripped := stripPassword(c.dsn)
		require.True(t, stripped, "%q", c.dsn)
		require.Equal(t, c.want, got, "%q", c.dsn)
		require.Empty(t, pgxSecretKeys(t, got), "pgx finds no secret in %q", got)
		raw, url := templateDatabaseURL(t, c.dsn)
		require.Equal(t, c.want, url, "%q", c.dsn)
		require.NotContains(t, raw, "Secr3t", "%q", c.dsn)
		require.NotContains(t, raw, "Zq9Other", "%q", c.dsn)
	}
}

// A DATABASE_URL without a password goes into the template as written
// (trimmed, as settings reads it), even where it looks like one.
func TestTemplateKeepsAPasswordlessDatabaseURLAsWritten(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://archive@h1.example.com:5432,h2.example.com:5433/app?sslmode=verify-full&application_name=a;b", ""},
		{"postgres://archive@db.example.com/app?sslmode=verify-full&application_name=x%20y&search_path=a%2Cb", ""},
		{"postgresql://archive@[::1]:5432/app?sslmode=verify-full&application_name=password", ""},
		{"host=h application_name='a password=x' dbname=d", ""},
		{`host=h application_name='it\'s password=x' dbname='d'sslmode=verify-full`, ""},
		{"host=h\toptions='-c search_path=a'\ndbname=d", ""},
		{" host=h dbname=d\n", "host=h dbname=d"},
	} {
		want := c.want
		if want == "" {
			want = c.dsn
		}
		got, stripped := stripPassword(c.dsn)
		require.False(t, stripped, "%q", c.dsn)
		require.Equal(t, want, got, "%q", c.dsn)
		_, url := templateDatabaseURL(t, c.dsn)
		require.Equal(t, want, url, "%q", c.dsn)
	}
}
