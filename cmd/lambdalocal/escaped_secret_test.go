package main

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// An unquoted keyword value may hold a space escaped with '\' (libpq and
// pgx both read "password=s3\ cret" as one value, backslash and all). The
// pattern stopped at the space and left the rest of the secret in the
// template.
func TestAnEscapedSpaceInAnUnquotedSecretIsStrippedWhole(t *testing.T) {
	for _, dsn := range []string{
		`host=h password=s3\ cret dbname=d`,
		`host=h sslpassword=s3\ cret\ too dbname=d`,
	} {
		cfg, err := pgconn.ParseConfig(dsn)
		require.NoError(t, err, "pgx reads %s", dsn)
		require.Equal(t, "d", cfg.Database, "pgx reads the escaped space as part of the value: %s", dsn)
		got, stripped := stripPassword(dsn)
		require.True(t, stripped)
		require.NotContains(t, got, "cret", dsn)
		require.Equal(t, "host=h dbname=d", got)
	}
}
