package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// The first Ctrl-C cancels the run, which then winds down (a sweep counts
// the backlog left, for up to 5 s); a second one ends the process at once.
// signal.NotifyContext kept catching SIGINT after the first, so the
// second, and every later one, was swallowed. The sweep here is stuck
// behind a lock an operator's transaction holds, so its wind-down waits
// out the whole grace.
func TestASecondCtrlCEndsTheProcessAtOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:old", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	bin := filepath.Join(t.TempDir(), "archivectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	cmd := exec.Command(bin, "sweep")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "PGAPPNAME=second-ctrl-c")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	// Once the sweep waits on the lock, interrupt it twice.
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'second-ctrl-c' AND wait_event_type = 'Lock'") > 0
	}, 30*time.Second, 10*time.Millisecond, "the sweep never waited on the lock")
	t0 := time.Now()
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	time.Sleep(300 * time.Millisecond)
	_ = cmd.Process.Signal(os.Interrupt) // the process may be gone already
	_ = cmd.Wait()
	took := time.Since(t0)
	t.Logf("exited %v after the first SIGINT: %v; stderr %q", took, cmd.ProcessState, stderr.String())
	require.Less(t, took, 3*time.Second, "the second SIGINT did not end the process")
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGINT, "ended by the second SIGINT: %v", cmd.ProcessState)
}
