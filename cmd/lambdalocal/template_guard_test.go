package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The last guard asks pgx, not the stripping: whatever keys it is told the
// string holds, a password or sslpassword pgx reads fails it; PGPASSWORD and
// a passfile do not.
func TestTheLastGuardAsksPgxAndIgnoresTheEnvironment(t *testing.T) {
	for _, c := range []struct {
		connString string
		keys       []string
	}{
		{"postgres://u:pw@h/db", []string{"user", "host", "port", "database", "password"}},
		{"postgres://u@h/db?pass%77ord=pw", []string{"user", "host", "port", "database", "password"}},
		{"host=h dbname='d'password=pw", []string{"host", "database", "password"}},
		{"host=h sslpassword=pw", []string{"host", "sslpassword", "SSLPASSWORD"}},
		{"host=h dbname=d password=pw", []string{"host", "database"}},
	} {
		err := checkNoSecretKey(c.connString, c.keys)
		require.ErrorContains(t, err, "DATABASE_URL", "%q", c.connString)
		require.NotContains(t, err.Error(), "pw", "%q", c.connString)
	}
	require.ErrorContains(t, checkNoSecretKey("host='h", []string{"host"}), "DATABASE_URL")

	t.Setenv("PGPASSWORD", "envpassword")
	t.Setenv("PGSSLPASSWORD", "envpassphrase")
	passfile := filepath.Join(t.TempDir(), "pgpass")
	require.NoError(t, os.WriteFile(passfile, []byte("*:*:*:*:filepassword\n"), 0o600))
	t.Setenv("PGPASSFILE", passfile)
	for _, c := range []struct {
		connString string
		keys       []string
	}{
		{"", nil},
		{"postgres://u@h/db?sslmode=verify-full", []string{"user", "host", "port", "database", "sslmode"}},
		{"host=h dbname=d", []string{"host", "database"}},
		// pgx fails on the key file only after the key check: not a password.
		{"postgres://u@h/db?sslkey=/nonexistent/k.pem&sslcert=/nonexistent/c.pem", []string{"user", "host", "port", "database", "sslkey", "sslcert"}},
	} {
		require.NoError(t, checkNoSecretKey(c.connString, c.keys), "%q", c.connString)
	}
	// The same password in DATABASE_URL and PGPASSWORD: stripped all the same.
	t.Setenv("PGPASSWORD", "Zq9Secr3t")
	_, url := templateDatabaseURL(t, "postgres://archive:Zq9Secr3t@db.example.com/app?sslmode=verify-full")
	require.Equal(t, "postgres://archive@db.example.com/app?sslmode=verify-full", url)
}

// The template is refused, naming DATABASE_URL but not the password, when
// its bytes would hold the password anyway, in any escaping.
func TestTemplateIsRefusedWhenItsBytesHoldThePassword(t *testing.T) {
	for _, c := range []struct{ dsn, elsewhere string }{
		{"postgres://archive:Zq9Secr3t@db.example.com/app?sslmode=verify-full", "Zq9Secr3t"},
		{"postgres://archive:Zq9%20Secr%26t@db.example.com/app?sslmode=verify-full", "Zq9+Secr%26t"},
		{"postgres://archive:Zq9%20Secr%26t@db.example.com/app?sslmode=verify-full", "Zq9%20Secr&t"},
		{"postgres://archive:Zq9%3CSecr3t@db.example.com/app?sslmode=verify-full", "Zq9<Secr3t"},
		{"host=h password='Zq9 Secr3t' dbname=d", "Zq9 Secr3t"},
		{"host=h dbname=d sslpassword=Zq9\\Secr3t", "Zq9Secr3t"},
	} {
		t.Setenv("DATABASE_URL", c.dsn)
		t.Setenv("METRICS_NAMESPACE", "ns/"+c.elsewhere)
		out := filepath.Join(t.TempDir(), "t.json")
		err := run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard)
		require.ErrorContains(t, err, "DATABASE_URL", "%q", c.dsn)
		require.NotContains(t, err.Error(), "Secr", "%q", c.dsn)
		require.NoFileExists(t, out)
	}
	require.False(t, containsSecret([]byte(`{"A": "pw"}`), []string{"pw"}), "under 4 bytes: not checked")
	require.True(t, containsSecret([]byte(`{"A": "x\u0026y\u003cz"}`), []string{"x&y<z"}))
}

// A password that is also ordinary text of the kept DATABASE_URL (the
// "postgres" of a local server's postgres://postgres:postgres@...) does not
// refuse the template: its password is gone, which pgx's check proves.
func TestAPasswordThatIsAlsoTheUserOrDatabaseNameDoesNotRefuseTheTemplate(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres:postgres@127.0.0.1:5432/postgres")
	t.Setenv("METRICS_NAMESPACE", "")
	out := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(b), `"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres"`)
	require.NotContains(t, string(b), "postgres:postgres@")
}

// Two ways of writing DATABASE_URL that neither pgx nor the stripping reads
// as a URL with a password carried it whole into the template: a '/' in the
// password (generated base64 passwords hold them), where libpq ends the user
// and reads "user:pass" as a host, and a scheme not in lower case, which
// pgx reads as a keyword/value string. Both are refused, naming what to do.
func TestAURLThatHidesItsPasswordFromTheParserIsRefused(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://app:Sekr1t/Pw@db.example/app":                  "percent-encode a '/'",
		"postgresql://app:Sekr1t/Pw@db.example:5432/app":           "percent-encode a '/'",
		"Postgresql://app:Sekr1tPw@db.example/app?sslmode=require": "in lower case",
		"POSTGRES://app:Sekr1tPw@db.example/app":                   "in lower case",
	} {
		t.Setenv("DATABASE_URL", dsn)
		out := filepath.Join(t.TempDir(), "t.json")
		err := run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard)
		require.ErrorContains(t, err, want, dsn)
		require.NotContains(t, err.Error(), "Sekr1t")
		require.NoFileExists(t, out)
	}
	// Percent-encoded, the same password is stripped.
	t.Setenv("DATABASE_URL", "postgres://app:Sekr1t%2FPw@db.example/app")
	out := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NotContains(t, string(b), "Sekr1t")
}
