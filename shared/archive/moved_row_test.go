package archive_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// afterBatch runs fn once, right after the first batch whose SQL contains
// marker has been read to its end (before the Reader's next round trip).
type afterBatch struct {
	marker string
	fn     func()
	armed  atomic.Bool
	fired  atomic.Bool
}

func (h *afterBatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (h *afterBatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (h *afterBatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (h *afterBatch) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, h.marker) {
		h.armed.Store(true)
	}
}
func (h *afterBatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	if h.armed.Load() && h.fired.CompareAndSwap(false, true) {
		h.fn()
	}
}

func tracedReaderPool(t *testing.T, b bundle, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	return b.db.NewPool(t, dbtest.AsRole(schema.ReaderRole), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = tracer
	})
}

// A key without a timestamp: its lookup reads idempotency_archive_plain_keys
// in one round trip and the archive in the next. An owner's UPDATE that moves
// the key's row to another month (an incident repair, which the README says
// is recorded) and commits between the two round trips leaves the lookup
// reading only the month the row has left: it answered ErrNotFound for a key
// the archive held in every snapshot of the lookup. A lookup that finds
// nothing now reads where the key's rows are again, in a round trip of its
// own, and reads the archive again where that is wider.
func TestAPlainKeyMovedBetweenItsLookupsRoundTripsIsFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := "idem:v1:redteam-plain-moved"
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ResourceID: ptr("ch_1"), ExpiredAt: time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)})

	hook := &afterBatch{marker: "idempotency_archive_plain_keys_pending"}
	hook.fn = func() {
		// Committed by the time the archive is read.
		_, err := b.db.Pool.Exec(context.Background(), "UPDATE idempotency_key_archive SET expired_at = '2026-07-10 00:00:00+00' WHERE scoped_key = $1", key)
		if err != nil {
			t.Errorf("move: %v", err)
		}
	}
	r := newReader(t, tracedReaderPool(t, b, hook), nil)
	rec, err := r.Lookup(ctx, key, nil)
	require.True(t, hook.fired.Load())
	// Before, during and after the move the archive holds the key.
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	require.NoError(t, err, "the archive held the key throughout; ErrNotFound runs the payment again")
	require.Equal(t, 201, rec.Status)
}

// The same for a timestamped key used long after its timestamp: where its
// late rows are (lateKeySQL) is read in the same batch as the archive, but
// by an earlier statement, with an earlier snapshot. A move that commits
// between them (made deterministic here by a lock the owner's transaction
// holds on the month being left, which the archive read waits for) left
// the lookup reading the prompt span only. When the archive read finds
// nothing, the late read runs again after it, as for a key without a
// timestamp.
func TestALateKeyMovedBetweenItsLateReadAndTheArchiveReadIsFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	minted := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + ulid(minted)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ResourceID: ptr("ch_2"), ExpiredAt: minted.Add(24 * time.Hour)})
	r := newReader(t, b.reader, nil)
	rec, err := r.Lookup(ctx, key, nil) // reads the writers too
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "UPDATE idempotency_key_archive SET expired_at = '2026-06-10 00:00:00+00' WHERE scoped_key = $1", key)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_key_archive_2026_01 IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	type result struct {
		rec archive.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		rec, err := r.Lookup(ctx, key, nil)
		done <- result{rec, err}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass('idempotency_key_archive_2026_01')") == 0 {
		require.True(t, time.Now().Before(deadline), "the lookup never waited for the month")
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, tx.Commit(ctx))
	res := <-done
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	require.NoError(t, res.err, "the archive held the key throughout; ErrNotFound runs the payment again")
	require.Equal(t, 201, res.rec.Status)

	// Looked up again, it is found: the records were right, the lookup's
	// snapshots were not one.
	rec, err = r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
}
