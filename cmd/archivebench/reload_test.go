package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// Every traffic run starts from the same state, as every sweep run does: the
// plain keys' index is emptied with the archive. Left full, each run after
// the first swept into a table that already held every plain key, and did
// other work than the first.
func TestTrafficReloadsStartFromTheSameState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, parts, err := newLiveBenchDB(ctx, dbtest.URL(t), "reload")
	require.NoError(t, err)
	defer db.Drop()
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer devnull.Close()
	require.NoError(t, loadTrafficSource(ctx, db, 3_000, newProgress(devnull)))
	count := func(table string) (n int64) {
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		return n
	}
	for run := range 2 {
		require.NoError(t, reloadTrafficLive(ctx, db))
		require.Zero(t, count("idempotency_archive_plain_keys"), "run %d starts with plain keys indexed", run)
		require.Zero(t, count("idempotency_key_archive"), "run %d", run)
		s, err := sweep.New(db.Pool, sweep.Config{BatchSize: sweepBatch}, parts, nil)
		require.NoError(t, err)
		r, err := s.Run(ctx)
		require.NoError(t, err)
		require.True(t, r.Drained)
		require.Positive(t, count("idempotency_archive_plain_keys"), "the sweep indexed the backlog's plain keys")
	}
}

// In the first hour of a UTC month the current month has no instant an hour
// old: its rows expire in the part of it that has passed, and the lookup
// measurement does not fail minutes into make bench.
func TestTheCurrentMonthLoadsInItsFirstHour(t *testing.T) {
	ctx := context.Background()
	db, _, err := newLiveBenchDB(ctx, dbtest.URL(t), "firsthour")
	require.NoError(t, err)
	defer db.Drop()
	month := time.Now().Add(-30 * time.Minute)
	require.NoError(t, loadArchiveMonth(ctx, db, newKeyGen(2), month, 10, true, &keySamples{}))
	var lo, hi time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT min(expired_at), max(expired_at) FROM idempotency_key_archive").Scan(&lo, &hi))
	require.False(t, lo.Before(month), "expired before the month: %s", lo)
	require.True(t, hi.Before(time.Now()), "not expired yet: %s", hi)
	require.ErrorContains(t, loadArchiveMonth(ctx, db, newKeyGen(2), time.Now().Add(time.Hour), 10, true, &keySamples{}), "has not started")
}

// The report names the machine's cores wherever it speaks of them.
func TestTheReportNamesTheMachinesCores(t *testing.T) {
	t.Parallel()
	r := report{
		Machine: machine{CPU: "x", Cores: 16, OS: "linux/amd64"},
		Sweep: &sweepSection{LiveRows: 1000, Contenders: []sweepResult{{
			Contender: contenderProject, RowsPerSec: 50_000, BatchP50MS: 100, Storage: storage{TotalPerRow: 200},
		}}},
		Traffic: &trafficSection{DeployedPauseMS: 200},
	}
	doc := r.document(r.tables())
	require.Contains(t, doc, "on this machine's 16 cores")
	require.Contains(t, doc, "the machine's 16 cores saturated")
	for _, line := range strings.Split(doc, "\n") {
		require.NotContains(t, line, "2 cores", line)
	}
	r.Machine.Cores = 1
	require.Contains(t, r.document(r.tables()), "on this machine's 1 core)")
}
