package testenv_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/testenv"
)

// withServices returns with-services.sh running command (under bash) with
// a PostgreSQL of its own: DATABASE_URL and REDIS_URL left out.
func withServices(t *testing.T, extraEnv []string, command string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(t), "shared", "testenv", "with-services.sh"), "bash", "-c", command)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "PG_BIN_DIR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "WITH_SERVICES_NO_REDIS=1")
	cmd.Env = append(cmd.Env, extraEnv...)
	return cmd
}

// The throwaway cluster takes no TCP connection (it trusts every one it
// takes): its URL names a socket directory only its owner may enter, and
// the command's exit status is the script's.
func TestTheThrowawayClusterListensOnAPrivateSocketOnly(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	cmd := withServices(t, nil, `echo "$DATABASE_URL"; exit 7`)
	cmd.Stdout = &out
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 7, exit.ExitCode())
	url := strings.TrimSpace(out.String())
	require.Regexp(t, `^postgres://postgres@/postgres\?host=/[^&]+/pg/sock&port=[0-9]+&sslmode=disable$`, url)
	host := strings.TrimPrefix(url[strings.Index(url, "host="):], "host=")
	host = host[:strings.Index(host, "&")]
	_, err = os.Stat(host)
	require.True(t, os.IsNotExist(err), "the socket directory is removed on exit")
}

// SIGTERM stops the command and the servers at once, not once the command
// ends by itself; a PG_BIN_DIR that holds no server is refused, never
// replaced by the machine's PostgreSQL.
func TestSIGTERMStopsTheCommandAndTheServers(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "url")
	cmd := withServices(t, nil, `echo "$DATABASE_URL" > `+marker+`; sleep 120`)
	require.NoError(t, cmd.Start())
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(marker); err == nil && len(b) > 0 {
			break
		}
		require.Less(t, time.Since(start), time.Minute, "the command never started")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		require.Equal(t, 143, exit.ExitCode())
	case <-time.After(40 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("with-services.sh still ran 40 s after SIGTERM: it waited for its command")
	}
	b, err := os.ReadFile(marker)
	require.NoError(t, err)
	dir := strings.SplitN(strings.SplitN(string(b), "host=", 2)[1], "/pg/sock", 2)[0]
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the cluster's directory %s is removed", dir)

	var stderr bytes.Buffer
	bad := withServices(t, []string{"PG_BIN_DIR=" + t.TempDir()}, "true")
	bad.Stderr = &stderr
	require.Error(t, bad.Run())
	require.Contains(t, stderr.String(), "has no pg_ctl: fix it, or unset it for the machine's PostgreSQL")
}
