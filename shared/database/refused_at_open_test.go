package database_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// IAM authentication with settings it cannot work with is refused when the
// pool is opened, not on every connection with "password authentication
// failed": a multi-host URL (pgx sends every host the one password, and a
// token is signed for one host), and no AWS region to sign with.
func TestIAMAuthThatCannotWorkIsRefusedAtOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := database.Open(ctx, database.Config{URL: "postgres://app@127.0.0.1:5432,127.0.0.1:5433/app?sslmode=disable", IAMAuth: true}, awsConfig("http://127.0.0.1:1"))
	require.ErrorContains(t, err, "DATABASE_IAM_AUTH takes one database host")
	// Refused by the configuration's check too, which every component
	// runs at start: a function's pool opens at its first invocation.
	_, err = database.Config{URL: "postgres://app@127.0.0.1:5432,127.0.0.1:5433/app?sslmode=disable", IAMAuth: true}.PoolConfig()
	require.ErrorContains(t, err, "DATABASE_IAM_AUTH takes one database host")
	_, err = database.Config{URL: "postgres://app@127.0.0.1:5432,127.0.0.1:5433/app?sslmode=disable"}.PoolConfig()
	require.NoError(t, err, "several hosts without IAM authentication")

	noRegion := awsConfig("http://127.0.0.1:1")
	noRegion.Region = ""
	_, err = database.Open(ctx, database.Config{URL: "postgres://app@127.0.0.1:5432/app?sslmode=disable", IAMAuth: true}, noRegion)
	require.ErrorContains(t, err, "set AWS_REGION")

	// AND sslmode=prefer's fallback to the same host without TLS is one host
	pool, err := database.Open(ctx, database.Config{URL: "postgres://app@127.0.0.1:5432/app?sslmode=prefer", IAMAuth: true}, awsConfig("http://127.0.0.1:1"))
	require.NoError(t, err)
	pool.Close()
}

// A URL that sizes a cache its exec mode needs to 0 is refused at
// configuration, naming both: accepted, every query failed.
func TestACacheTheExecModeNeedsSizedZeroIsRefused(t *testing.T) {
	t.Parallel()
	u := dbtest.URL(t)
	with := func(param string) string {
		if strings.Contains(u, "://") {
			if strings.Contains(u, "?") {
				return u + "&" + param
			}
			return u + "?" + param
		}
		return u + " " + param
	}
	for _, tc := range []struct{ param, mode, want string }{
		{"statement_cache_capacity=0", "", "statement_cache_capacity=0, which the cache_statement exec mode needs"},
		{"statement_cache_capacity=0", "cache_statement", "statement_cache_capacity=0, which the cache_statement exec mode needs"},
		{"description_cache_capacity=0", "cache_describe", "description_cache_capacity=0, which the cache_describe exec mode needs"},
	} {
		_, err := database.Config{URL: with(tc.param), ExecMode: tc.mode}.PoolConfig()
		require.ErrorContains(t, err, tc.want, "%s with mode %q", tc.param, tc.mode)
	}
	// AND the modes that use no such cache take it
	for _, mode := range []string{"exec", "simple_protocol"} {
		pool, err := database.Open(context.Background(), database.Config{URL: with("statement_cache_capacity=0"), ExecMode: mode}, nil)
		require.NoError(t, err, mode)
		var one int
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT 1").Scan(&one), mode)
		pool.Close()
	}
}
