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

// A daemon address the X-Ray SDK cannot parse or resolve would panic the
// invoked function at start, with a stack trace: invoke refuses it with a
// line naming the variable. The shapes the SDK takes are passed on. (Not
// parallel: the check reads the process's environment, as the SDK does.)
func TestAnXRayDaemonAddressTheSDKWouldPanicOnIsRefused(t *testing.T) {
	for _, ok := range []string{"", "127.0.0.1:2000", "localhost:2000", "tcp:127.0.0.1:2000 udp:127.0.0.1:2001", "udp:127.0.0.1:2001 tcp:127.0.0.1:2000"} {
		t.Setenv(xrayDaemonAddress, ok)
		require.NoError(t, checkXRayDaemonAddress(ok), ok)
	}
	for _, bad := range []string{"xray-daemon", "xray-daemon.invalid:2000", "tcp:127.0.0.1:2000", "udp:127.0.0.1:1 udp:127.0.0.1:2",
		"a b c", "[::1]:2000", "udp:127.0.0.1:2000  tcp:127.0.0.1:2000", "udp:127.0.0.1:2000\ttcp:127.0.0.1:2000", "localhost:domain", "127.0.0.1:"} {
		t.Setenv(xrayDaemonAddress, bad)
		err := checkXRayDaemonAddress(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "AWS_XRAY_DAEMON_ADDRESS", bad)
	}
}
