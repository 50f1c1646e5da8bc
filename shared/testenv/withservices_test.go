package testenv_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// requireExit waits up to 40 s for cmd, started with its own process group
// or not, to exit with code after what was done to it.
func requireExit(t *testing.T, cmd *exec.Cmd, code int, what string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, what)
		require.Equal(t, code, exit.ExitCode(), what)
	case <-time.After(40 * time.Second):
		_ = cmd.Process.Kill()
		if cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		t.Fatalf("%s: with-services.sh still ran 40 s later: it waited for its command", what)
	}
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
	requireExit(t, cmd, 143, "SIGTERM")
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

// Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends
// it) stops a command that leaves SIGINT to its default action, as it would
// without the script; and a signal that reached the command first leaves
// the script's own exit status (128 + the signal) as it is.
func TestCtrlCAndGroupSignalsStopTheCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}, {syscall.SIGTERM, 143}, {syscall.SIGTERM, 143}} {
		marker := filepath.Join(t.TempDir(), "started")
		cmd := withServices(t, nil, `: > `+marker+`; sleep 120; echo "not stopped"`)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		var out bytes.Buffer
		cmd.Stdout = &out
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, time.Minute, 20*time.Millisecond, "the command never started")
		require.NoError(t, syscall.Kill(-cmd.Process.Pid, tc.sig))
		requireExit(t, cmd, tc.code, tc.sig.String()+" to the process group")
		require.NotContains(t, out.String(), "not stopped")
	}
}

// A TMPDIR that a URL must encode (a space, '%', '&', '#') gives a
// DATABASE_URL that names the cluster's socket; WITH_SERVICES_OWN_DATABASE
// says the script started it, and is never taken from outside.
func TestAnOddTMPDIRGivesAWorkingURL(t *testing.T) {
	t.Parallel()
	// Beside t.TempDir's, which the cluster's owner could not enter.
	tmp, err := os.MkdirTemp("", "my dir %41&#")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o755))
	dir := t.TempDir()
	urlFile, done := filepath.Join(dir, "url"), filepath.Join(dir, "done")
	cmd := withServices(t, []string{"TMPDIR=" + tmp, "WITH_SERVICES_OWN_DATABASE=x"},
		`echo "$DATABASE_URL $WITH_SERVICES_OWN_DATABASE" > `+urlFile+`.tmp && mv `+urlFile+`.tmp `+urlFile+`; while [ ! -f `+done+` ]; do sleep 0.05; done`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var line string
	require.Eventually(t, func() bool { b, err := os.ReadFile(urlFile); line = string(b); return err == nil }, time.Minute, 20*time.Millisecond, "%s", &stderr)
	url, own, _ := strings.Cut(strings.TrimSpace(line), " ")
	require.Equal(t, "1", own)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, url)
	require.Contains(t, url, "my%20dir%20%2541%26%23")
	require.NoError(t, conn.Ping(ctx))
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, os.WriteFile(done, nil, 0o644))
	require.NoError(t, cmd.Wait())

	var out bytes.Buffer
	given := withServices(t, []string{"DATABASE_URL=postgres://u:pw@localhost/db", "WITH_SERVICES_OWN_DATABASE=1"}, `echo "[$WITH_SERVICES_OWN_DATABASE]"`)
	given.Stdout = &out
	require.NoError(t, given.Run())
	require.Equal(t, "[]", strings.TrimSpace(out.String()))
}

// A TMPDIR whose path postgresql.conf's quoted, comma-separated
// unix_socket_directories cannot hold is refused, saying why.
func TestATMPDIRTheSocketSettingCannotHoldIsRefused(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"a,b", "q'x", `dq"x`, `bs\x`} {
		tmp, err := os.MkdirTemp("", name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(tmp) })
		require.NoError(t, os.Chmod(tmp, 0o755))
		var stderr bytes.Buffer
		cmd := withServices(t, []string{"TMPDIR=" + tmp}, "echo ran")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.Error(t, err, name)
		require.NotContains(t, string(out), "ran", name)
		require.Contains(t, stderr.String(), "which PostgreSQL's unix_socket_directories cannot take: set TMPDIR", name)
	}
}
