package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// A redis-reconcile that stops midway (interrupted here; a failover or the
// database gone alike) still prints what it did before the error: the rows
// it archived stay archived, and the operator needs their count.
func TestAnInterruptedRedisReconcileSaysWhatItDid(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	client, prefix := testenv.Redis(t)
	ctx := context.Background()
	store := livestore.NewRedis(client, db.Pool, prefix)
	const n = 3000
	for i := range n {
		key := fmt.Sprintf("idem:v1:kept%d", i)
		_, err := store.Register(ctx, idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint(key), TTL: time.Hour})
		require.NoError(t, err)
		require.NoError(t, client.HSet(ctx, prefix+key, "state", "completed", "status", "201").Err())
		require.NoError(t, client.Persist(ctx, prefix+key).Err())
	}

	// WHEN the run is interrupted once it archived some
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for runCtx.Err() == nil {
			if dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive") > 0 {
				cancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var out, errb bytes.Buffer
	code := run(runCtx, []string{"redis-reconcile", "--prefix", prefix}, &out, &errb, func(k string) string {
		return map[string]string{"DATABASE_URL": db.URL, "REDIS_URL": os.Getenv("REDIS_URL")}[k]
	})

	// THEN it fails, saying why (the key it was on may get a line of its
	// own), and prints the summary of what it did
	require.Equal(t, exitError, code, "stdout: %s\nstderr: %s", out.String(), errb.String())
	require.Contains(t, errb.String(), "context canceled")
	require.LessOrEqual(t, strings.Count(strings.TrimSpace(errb.String()), "\n")+1, 2, "%q", errb.String())
	require.NotContains(t, errb.String(), "goroutine")
	var res livestore.ReconcileResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), "a summary on stdout: %q", out.String())
	require.Positive(t, res.Scanned)
	require.Less(t, res.Archived, n, "interrupted before the end")
	archived := dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive")
	require.LessOrEqual(t, int64(res.Archived), archived, "it counts only rows it archived")
	require.GreaterOrEqual(t, int64(res.Archived), archived-1, "every row archived is counted, but one the interrupt cut short of its expiry")
}
