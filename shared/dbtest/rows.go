package dbtest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemarchive/idemarchive/shared/database"
)

// LiveRow is a row of idempotency_keys for tests.
type LiveRow struct {
	Key       string
	Status    int // 0 leaves the key in flight
	Response  any // stored as jsonb; nil for none
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Fingerprint is the fingerprint tests store for key: SHA-256 of the key.
func Fingerprint(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

// InsertLive inserts rows into idempotency_keys.
func InsertLive(t testing.TB, pool *pgxpool.Pool, rows ...LiveRow) {
	t.Helper()
	for _, r := range rows {
		state := "in_flight"
		var status *int
		if r.Status != 0 {
			state, status = "completed", &r.Status
		}
		var response []byte
		if r.Response != nil {
			var err error
			if response, err = json.Marshal(r.Response); err != nil {
				t.Fatalf("marshal response: %v", err)
			}
		}
		if r.CreatedAt.IsZero() {
			r.CreatedAt = r.ExpiresAt.Add(-24 * time.Hour)
		}
		_, err := pool.Exec(context.Background(), `
			INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			r.Key, Fingerprint(r.Key), state, status, response, r.CreatedAt, r.ExpiresAt)
		if err != nil {
			t.Fatalf("insert live row %q: %v", r.Key, err)
		}
	}
}

// ArchiveRow is a row of idempotency_key_archive for tests.
type ArchiveRow struct {
	Key        string
	Status     int
	ResourceID *string
	CreatedAt  time.Time
	ExpiredAt  time.Time
	// Fingerprint defaults to Fingerprint(Key).
	Fingerprint []byte
}

// InsertArchive inserts rows into idempotency_key_archive (whose partitions
// must exist).
func InsertArchive(t testing.TB, pool *pgxpool.Pool, rows ...ArchiveRow) {
	t.Helper()
	for _, r := range rows {
		if r.CreatedAt.IsZero() {
			r.CreatedAt = r.ExpiredAt.Add(-24 * time.Hour)
		}
		if r.Fingerprint == nil {
			r.Fingerprint = Fingerprint(r.Key)
		}
		_, err := pool.Exec(context.Background(), `
			INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			r.Key, r.Fingerprint, r.Status, r.ResourceID, r.CreatedAt, r.ExpiredAt)
		if err != nil {
			t.Fatalf("insert archive row %q: %v", r.Key, err)
		}
	}
}

// Count runs a count(*) query and returns the figure.
func Count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// ULID is a canonical ULID whose timestamp is ts and whose random part is
// fixed (suffix, 16 Crockford base32 characters; "" for a fixed one), so
// that tests need no ULID library.
func ULID(ts time.Time, suffix string) string {
	const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	ms := uint64(ts.UnixMilli())
	var b strings.Builder
	for i := 9; i >= 0; i-- {
		b.WriteByte(crockford[(ms>>(5*uint(i)))&31])
	}
	if suffix == "" {
		suffix = "ABCDEFGHJKMNPQRS"
	}
	return b.String() + suffix
}

// UUIDv7 is a version 7 UUID whose timestamp is ts, its other bits fixed
// but for the last 12 hex digits, n's.
func UUIDv7(ts time.Time, n uint64) string {
	h := fmt.Sprintf("%012x", uint64(ts.UnixMilli()))
	return fmt.Sprintf("%s-%s-7abc-9def-%012x", h[:8], h[8:12], n&(1<<48-1))
}

// InterruptDetach leaves the archive's partition table (a name on the
// search_path, or a qualified one) detach-pending, as a DETACH ...
// CONCURRENTLY cut short while it waited for a reader (by hand, or a
// partitions run killed) does.
func (db *DB) InterruptDetach(t testing.TB, table string) {
	t.Helper()
	ctx := context.Background()
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("interrupt the detach of %s: %s: %v", table, what, err)
		}
	}
	reader, err := db.Pool.Begin(ctx)
	fail("begin the reader", err)
	defer func() { _ = reader.Rollback(ctx) }()
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	fail("read", err)
	conn, err := db.Pool.Acquire(ctx)
	fail("acquire", err)
	defer conn.Release()
	// Phase 1 commits; phase 2 waits for the reader, and the timeout cuts it.
	_, err = conn.Exec(ctx, "SET statement_timeout = '1s'")
	fail("set statement_timeout", err)
	_, err = conn.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION "+table+" CONCURRENTLY")
	if database.SQLState(err) != database.CodeQueryCanceled {
		t.Fatalf("interrupt the detach of %s: want a statement timeout, got %v", table, err)
	}
	_, err = conn.Exec(ctx, "RESET statement_timeout")
	fail("reset statement_timeout", err)
	fail("end the reader", reader.Rollback(ctx))
	if n := Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending AND inhrelid = to_regclass($1)", table); n != 1 {
		t.Fatalf("the detach of %s should be pending", table)
	}
}
