package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A schema restored with pg_restore --no-owner (its tables now the restoring
// user's), and a transaction that has read the live table (an
// investigation, pg_dump). `archivectl migrate` runs roles.sql, whose ALTER
// TABLE idempotency_keys OWNER TO idempotency_owner needs ACCESS EXCLUSIVE:
// each wait is bounded (lock_timeout), so registrations never queue behind
// it for longer, and when the operator kills it (SIGKILL, a closed SSH
// session) its backend leaves the queue at the end of that wait. Once the
// reader ends, the next run succeeds.
func TestAKilledMigrateLeavesNoRegistrationQueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_keys OWNER TO CURRENT_USER")
	require.NoError(t, err)

	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_keys")
	require.NoError(t, err)

	bin := filepath.Join(t.TempDir(), "archivectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	app := "killed-migrate-" + db.Schema
	cmd := exec.Command(bin, "migrate")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "PGAPPNAME="+app)
	require.NoError(t, cmd.Start())
	waiting := func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app) > 0
	}
	require.Eventually(t, waiting, 30*time.Second, 10*time.Millisecond, "migrate never waited on the lock")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	time.Sleep(2 * time.Second)

	assert.False(t, waiting(), "the killed migrate's backend is still in the lock queue")

	// A registration, under the live store's 5 s bound.
	api, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer api.Release()
	_, err = api.Exec(ctx, "SET statement_timeout = '3s'")
	require.NoError(t, err)
	_, err = api.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, created_at, expires_at, skew_ms)
		VALUES ('idem:v1:after-kill', decode(repeat('00', 32), 'hex'), 'in_flight', now(), now() + interval '1 day', 0)`)
	assert.NoError(t, err, "a registration queued behind the killed migrate's lock request")
	_, _ = api.Exec(ctx, "RESET statement_timeout")

	// The next deploy's migrate, once the reader ended.
	require.NoError(t, reader.Rollback(ctx))
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytesBuffer
	code := run(rctx, []string{"migrate"}, &stdout, &stderr, func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	})
	require.Equal(t, exitOK, code, "the re-run: %s", stderr.String())
}

type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
func (w *bytesBuffer) String() string              { return string(w.b) }
