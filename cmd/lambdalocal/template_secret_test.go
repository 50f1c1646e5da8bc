package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// sslpassword is the passphrase of the client key (sslkey): a secret as much
// as password, which the template promises never to write. pgx reads it from
// DATABASE_URL in both forms, and from PGSSLPASSWORD.
func TestTemplateKeepsTheClientKeyPassphraseOut(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u@h/db?sslkey=/k.pem&sslpassword=s3cret&sslmode=verify-full",
		"postgres://u:pw@h/db?sslpassword=s3cret",
		"host=h user=u sslkey=/k.pem sslpassword=s3cret dbname=d",
		"host=h sslpassword='s3 cret' dbname=d",
	} {
		t.Setenv("DATABASE_URL", dsn)
		out := filepath.Join(t.TempDir(), "t.json")
		require.NoError(t, run(context.Background(), []string{"template", "-o", out}, io.Discard, io.Discard))
		b, err := os.ReadFile(out)
		require.NoError(t, err)
		require.NotContains(t, string(b), "s3", dsn)
		var doc struct {
			Resources map[string]struct {
				Properties struct {
					Environment struct{ Variables map[string]string }
				}
			}
		}
		require.NoError(t, json.Unmarshal(b, &doc))
		vars := doc.Resources["SweepFunction"].Properties.Environment.Variables
		require.Contains(t, vars, "PGSSLPASSWORD", "declared, so that it can be given at invoke time: %s", dsn)
	}
}

// A password encoded together with the user name is no password key to
// strip: the template is refused, as the functions refuse the string, and
// nothing is written.
func TestATemplateRefusesAPasswordFoldedIntoTheUserName(t *testing.T) {
	for _, dsn := range []string{
		"postgres://app%3Ahunter2secret@db.example.com:5432/app?sslmode=verify-full",
		"host=db.example.com user=app:hunter2secret dbname=app sslmode=verify-full",
	} {
		t.Setenv("DATABASE_URL", dsn)
		out := filepath.Join(t.TempDir(), "t.json")
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{"template", "-o", out}, &stdout, &stderr)
		require.ErrorContains(t, err, "user name holds ':'", dsn)
		require.NotContains(t, err.Error()+stdout.String()+stderr.String(), "hunter2secret", dsn)
		_, statErr := os.Stat(out)
		require.True(t, os.IsNotExist(statErr), "%s: a template was written", dsn)
	}
}
