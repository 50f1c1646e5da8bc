package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An invoked function gets the project's settings and the variables pgx
// and the AWS SDK read (a password in PGPASSWORD, the region a secret needs),
// as a deployed one has them; nothing else of the shell's environment.
func TestAnInvokedFunctionGetsTheConnectionEnvironment(t *testing.T) {
	t.Parallel()
	got := functionEnv([]string{
		"DATABASE_URL=postgres://u@db/app", "SWEEP_BATCH_SIZE=500", "PGPASSWORD=pw", "PGSSLMODE=verify-full",
		"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKID", "HOME=/root", "PATH=/usr/bin", "GITHUB_TOKEN=ghp_x", "NOEQUALS",
		"PAYLOAD=a=b",
	})
	require.Equal(t, map[string]string{
		"DATABASE_URL": "postgres://u@db/app", "SWEEP_BATCH_SIZE": "500", "PGPASSWORD": "pw", "PGSSLMODE": "verify-full",
		"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKID",
	}, got)
}
