// Package plainkeys keeps idempotency_archive_plain_keys complete and small:
// the table that says in which months the archive rows of keys without a
// timestamp lie, and those of timestamped keys used long after their
// timestamp, so that their lookups read one small index and then only those
// partitions (see migrations 006 and 010 and package archive).
//
// The archive's trigger records every row as it is inserted. Some rows are
// not recorded that way, and lie in a pending range instead, which lookups
// read in full until it is gone:
//   - rows archived before migration 006 (one range, -infinity to infinity,
//     in idempotency_archive_plain_keys_pending);
//   - rows archived before migration 010 (the same, in
//     idempotency_archive_late_keys_pending, which only lookups of
//     timestamped keys read);
//   - rows of a partition attached with rows in it (its bounds, in the
//     first table, which a trigger of migration 010 copies to the second).
//
// Index records the rows of the pending ranges, in batches in primary-key
// order, and removes a range once every row in it is recorded. Rows inserted
// into a range while it is being indexed are recorded by the trigger, so the
// scan need not see them. Prune deletes the records of months that no
// partition holds any more (retention), which lookups would otherwise still
// read, for nothing.
//
// Both run in the partition manager's run, under its advisory lock, as the
// owner of the tables.
package plainkeys

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemarchive/idemarchive/shared/database"
)

// DefaultBatch is the most archive rows one statement of Index reads, and
// records one statement of Prune deletes.
const DefaultBatch = 20_000

// firstBatch is the size of a run's first batch: each batch that completes
// doubles the next, up to the batch asked for. Starting small, a run whose
// budget is shorter than one full batch still records rows (with a fixed
// batch it would time out on the same batch every run, and the pending
// range, which makes every lookup of a key without a timestamp read every
// partition, would never go).
const firstBatch = 500

// outOfTime reports an error that means the statement used up the budget
// that ends at deadline: its statement or lock timeout (both end there when
// nothing shorter is set), or the context's backstop a second later. What a
// run has not finished by its deadline, the next run resumes, so this is not
// a failure.
func outOfTime(err error, deadline time.Time) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch database.SQLState(err) {
	case database.CodeQueryCanceled, database.CodeLockNotAvailable:
		return time.Until(deadline) < 50*time.Millisecond
	}
	return false
}

// Progress says what Index did.
type Progress struct {
	// Scanned is the number of archive rows read, Recorded the number of
	// records added (rows of keys without a timestamp not yet recorded).
	Scanned, Recorded int64
	// RangesDone is the number of pending ranges finished and removed,
	// RangesLeft the number still pending.
	RangesDone, RangesLeft int
}

// pendingSQL returns the first pending range: of
// idempotency_archive_plain_keys_pending (late false) or of
// idempotency_archive_late_keys_pending (migration 010, late true). Index
// records both kinds of row in either.
const pendingSQL = `
SELECT late, expired_from, expired_to, after_key, after_expired_at
  FROM (SELECT false, expired_from, expired_to, after_key, after_expired_at
          FROM idempotency_archive_plain_keys_pending
        UNION ALL
        SELECT true, expired_from, expired_to, after_key, after_expired_at
          FROM idempotency_archive_late_keys_pending) AS pending (late, expired_from, expired_to, after_key, after_expired_at)
 ORDER BY expired_from, expired_to, late
 LIMIT 1`

// indexSQL records the next $5 archive rows of the range [$1, $2) after the
// primary key ($3, $4), by the rule of the archive's trigger (migration
// 010: keys without a timestamp, and keys used long after theirs), and
// returns how many it read and recorded and the
// last primary key read. A range that ends at infinity includes it
// (indexToInfinitySQL): a row can expire at 'infinity' in a partition
// bounded by MAXVALUE.
//
// A batch in primary-key order spans every expiry of its range, so the bound
// of the late rule is not the trigger's one a statement (that would record
// nearly every row of older months) but one an hour of expiries: the end of
// the hour less the span (idempotency_key_expiry_hour: UTC hours, each
// starting at or before every expiry in it), which every late row of the
// hour lies before.
const indexSQL = `
WITH next AS MATERIALIZED (
    SELECT scoped_key, expired_at
      FROM idempotency_key_archive
     WHERE expired_at >= $1 AND expired_at < $2
       AND (scoped_key, expired_at) > ($3, $4)
     ORDER BY scoped_key, expired_at
     LIMIT $5
),
bounds AS MATERIALIZED (
    SELECT h, idempotency_key_time_bound(b, true) AS ulid, idempotency_key_time_bound(b, false) AS uuid
      FROM (SELECT h, idempotency_key_late_bound(h, idempotency_key_prompt_span() - interval '1 hour')
              FROM (SELECT DISTINCT idempotency_key_expiry_hour(expired_at) FROM next) AS hours (h)) AS t (h, b)
),
recorded AS (
    INSERT INTO idempotency_archive_plain_keys (key_hash, expired_at)
    SELECT idempotency_key_hash(n.scoped_key), n.expired_at
      FROM next AS n
      JOIN bounds AS b ON b.h = idempotency_key_expiry_hour(n.expired_at)
     WHERE NOT idempotency_key_has_time(n.scoped_key)
        OR idempotency_key_time_before(n.scoped_key, b.ulid, b.uuid)
    ON CONFLICT DO NOTHING
    RETURNING 1
),
last AS (
    SELECT scoped_key, expired_at FROM next ORDER BY scoped_key DESC, expired_at DESC LIMIT 1
)
SELECT (SELECT count(*) FROM next), (SELECT count(*) FROM recorded),
       (SELECT scoped_key FROM last), (SELECT expired_at FROM last)`

var indexToInfinitySQL = strings.Replace(indexSQL, "expired_at < $2", "expired_at <= $2", 1)

// claimSQL locks a range's row where it still is where the batch starts
// ($3 and $4), before the batch reads the archive. Why (the invariant): a
// range marked again (ON CONFLICT ... DO UPDATE resets its position, for
// rows restored into it with triggers off) while a batch runs must be
// scanned again from its start, and a batch must never remove or advance
// a range past rows its read could not see. Locked first, a mark either
// committed before the lock, so that the batch's read, a statement later,
// sees the rows it restored, or it waits for the batch to commit and then
// sets the range back to its start (or inserts it again, when the batch
// removed it). Checking the position at the end alone is not enough: a
// mark during a range's first batch puts it back where the batch started.
// No row (the range was finished, moved or marked again meanwhile): the
// batch is skipped, and the pending ranges are read again. The trigger of
// migration 010 that copies a plain range's mark to
// idempotency_archive_late_keys_pending runs after the mark's own update
// of this row, so it too waits for the batch.
const claimSQL = `
SELECT true FROM idempotency_archive_plain_keys_pending
 WHERE expired_from = $1 AND expired_to = $2 AND after_key = $3 AND after_expired_at = $4
   FOR UPDATE`

// advanceSQL and finishSQL save a range's position, or remove it, only
// where it still is where the batch started ($5 and $6, or $3 and $4),
// which claimSQL's lock holds it at.
const advanceSQL = `
UPDATE idempotency_archive_plain_keys_pending
   SET after_key = $3, after_expired_at = $4
 WHERE expired_from = $1 AND expired_to = $2 AND after_key = $5 AND after_expired_at = $6`

const finishSQL = `
DELETE FROM idempotency_archive_plain_keys_pending
 WHERE expired_from = $1 AND expired_to = $2 AND after_key = $3 AND after_expired_at = $4`

// lateClaimSQL, lateAdvanceSQL and lateFinishSQL are claimSQL, advanceSQL
// and finishSQL for a range of idempotency_archive_late_keys_pending.
var (
	lateClaimSQL   = strings.Replace(claimSQL, "idempotency_archive_plain_keys_pending", "idempotency_archive_late_keys_pending", 1)
	lateAdvanceSQL = strings.Replace(advanceSQL, "idempotency_archive_plain_keys_pending", "idempotency_archive_late_keys_pending", 1)
	lateFinishSQL  = strings.Replace(finishSQL, "idempotency_archive_plain_keys_pending", "idempotency_archive_late_keys_pending", 1)
)

// followAdvanceSQL and followFinishSQL carry the copy of a range of
// idempotency_archive_plain_keys_pending that migration 010 keeps in
// idempotency_archive_late_keys_pending along with the batch that advanced
// or finished it ($5 and $6, or $3 and $4: where the batch started). Why
// that is safe (the invariant): a late range's position says that its rows
// before it are recorded under the late rule; when it is where the batch
// started, the batch (indexSQL records both rules) recorded the rows from
// there to where it stopped. Where it is elsewhere (a partition manager
// from before migration 010 advanced the first range alone), the copy is
// left alone and gets its own scan, so that every range is scanned once
// when one release does it all.
const (
	followAdvanceSQL = `
UPDATE idempotency_archive_late_keys_pending
   SET after_key = $3, after_expired_at = $4
 WHERE expired_from = $1 AND expired_to = $2 AND after_key = $5 AND after_expired_at = $6`
	followFinishSQL = `
DELETE FROM idempotency_archive_late_keys_pending
 WHERE expired_from = $1 AND expired_to = $2 AND after_key = $3 AND after_expired_at = $4`
)

// Limits bounds the statements of Index and Prune: each waits for a lock at
// most LockTimeout (0: until the deadline) and runs at most until the
// deadline passed to them.
type Limits struct {
	LockTimeout time.Duration
}

// inTx runs fn in a transaction bounded by l and deadline, with the session
// settings the SQL here reads timestamps under (a partition bound printed in
// another DateStyle or time zone would read as another instant).
func (l Limits) inTx(ctx context.Context, conn *pgx.Conn, deadline time.Time, fn func(pgx.Tx) error) error {
	lock, left, err := l.until(deadline)
	if err != nil {
		return err
	}
	settings := database.Timeouts(lock, left)
	settings["TimeZone"], settings["DateStyle"] = "UTC", "ISO, YMD"
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(time.Second))
	defer cancel()
	return database.InTx(ctx, conn, settings, fn)
}

// maxSetting is the longest statement_timeout or lock_timeout PostgreSQL
// takes (INT_MAX milliseconds, about 24.8 days): a deadline further away
// bounds the statements by this instead.
const maxSetting = math.MaxInt32 * time.Millisecond

// until returns the lock and statement timeouts of a statement that must
// end by deadline, as PostgreSQL takes them (whole milliseconds, and 0ms
// would mean no limit at all): the time left, and LockTimeout within it
// (0: the time left; under a millisecond: a millisecond, not none).
func (l Limits) until(deadline time.Time) (lock, left time.Duration, err error) {
	left = min(time.Until(deadline), maxSetting)
	if left < time.Millisecond {
		return 0, 0, context.DeadlineExceeded
	}
	lock = l.LockTimeout
	if lock <= 0 || lock > left {
		lock = left
	}
	return max(lock, time.Millisecond), left, nil
}

// renewSQL sets the statement and lock timeouts of the rest of a
// transaction.
const renewSQL = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)`

// renew bounds the next statements of tx by what is left until deadline
// (inTx's settings bound each statement by what was left when it began).
func (l Limits) renew(ctx context.Context, tx pgx.Tx, deadline time.Time) error {
	lock, left, err := l.until(deadline)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, renewSQL, fmt.Sprintf("%dms", left.Milliseconds()), fmt.Sprintf("%dms", lock.Milliseconds()))
	return err
}

// Index records the rows of pending ranges until none is left or deadline
// passes (checked between batches, and each batch's statements end by it):
// a batch cut short by the deadline is rolled back and the next run does it,
// without an error. Each batch is its own transaction, so an interruption
// loses at most one batch's work and repeats it harmlessly. Batches start at
// firstBatch rows and double up to batch.
func Index(ctx context.Context, conn *pgx.Conn, batch int, l Limits, deadline time.Time) (p Progress, err error) {
	if batch < 1 {
		return p, fmt.Errorf("plain keys: batch must be positive, got %d", batch)
	}
	size := min(batch, firstBatch)
	defer func() {
		if err != nil && ctx.Err() == nil {
			// Still say how many ranges wait, if the database answers.
			_ = p.countLeft(ctx, conn, l)
		}
	}()
	for {
		if time.Until(deadline) < time.Millisecond {
			return p, p.countLeft(ctx, conn, l)
		}
		var from, to, afterExpiry pgtype.Timestamptz
		var afterKey string
		var late bool
		err := l.inTx(ctx, conn, deadline, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, pendingSQL).Scan(&late, &from, &to, &afterKey, &afterExpiry)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return p, nil
		}
		if outOfTime(err, deadline) && ctx.Err() == nil {
			return p, p.countLeft(ctx, conn, l)
		}
		if err != nil {
			return p, fmt.Errorf("plain keys: read pending ranges: %w", err)
		}
		var scanned, recorded int64
		var lastKey *string
		var lastExpiry pgtype.Timestamptz
		claimed := true
		err = l.inTx(ctx, conn, deadline, func(tx pgx.Tx) error {
			claim := claimSQL
			if late {
				claim = lateClaimSQL
			}
			if err := tx.QueryRow(ctx, claim, from, to, afterKey, afterExpiry).Scan(&claimed); errors.Is(err, pgx.ErrNoRows) {
				claimed = false
				return nil
			} else if err != nil {
				return err
			}
			if err := l.renew(ctx, tx, deadline); err != nil {
				return err
			}
			sql := indexSQL
			if to.InfinityModifier == pgtype.Infinity {
				sql = indexToInfinitySQL
			}
			if err := tx.QueryRow(ctx, sql, from, to, afterKey, afterExpiry, size).Scan(&scanned, &recorded, &lastKey, &lastExpiry); err != nil {
				return err
			}
			// Each later statement gets what is left of the budget, not
			// what was left when the transaction began: one that waits on
			// a lock would otherwise outlast the context's backstop, which
			// closes the connection the rest of the run needs.
			exec := func(sql string, args ...any) error {
				if err := l.renew(ctx, tx, deadline); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, sql, args...)
				return err
			}
			finish, advance := finishSQL, advanceSQL
			if late {
				finish, advance = lateFinishSQL, lateAdvanceSQL
			}
			if scanned < int64(size) {
				if err := exec(finish, from, to, afterKey, afterExpiry); err != nil || late {
					return err
				}
				return exec(followFinishSQL, from, to, afterKey, afterExpiry)
			}
			if err := exec(advance, from, to, *lastKey, lastExpiry, afterKey, afterExpiry); err != nil || late {
				return err
			}
			return exec(followAdvanceSQL, from, to, *lastKey, lastExpiry, afterKey, afterExpiry)
		})
		if outOfTime(err, deadline) && ctx.Err() == nil {
			return p, p.countLeft(ctx, conn, l)
		}
		if err != nil {
			return p, fmt.Errorf("plain keys: index the range %s to %s: %w", format(from), format(to), err)
		}
		if !claimed {
			continue // the range changed since it was read: read them again
		}
		p.Scanned += scanned
		p.Recorded += recorded
		if scanned < int64(size) {
			p.RangesDone++
		}
		size = doubled(size, batch)
	}
}

// countPendingSQL counts the ranges pending in either table, a range in
// both once (see followAdvanceSQL).
const countPendingSQL = `
SELECT count(*)
  FROM (SELECT expired_from, expired_to FROM idempotency_archive_plain_keys_pending
        UNION
        SELECT expired_from, expired_to FROM idempotency_archive_late_keys_pending) AS pending`

// countLeft counts the pending ranges, within a few seconds whatever the
// run's deadline (it reports, it does no work).
func (p *Progress) countLeft(ctx context.Context, conn *pgx.Conn, l Limits) error {
	var n int
	err := l.inTx(ctx, conn, time.Now().Add(2*time.Second), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, countPendingSQL).Scan(&n)
	})
	if err != nil {
		return fmt.Errorf("plain keys: count pending ranges: %w", err)
	}
	p.RangesLeft = n
	return nil
}

// pruneSQL deletes up to $1 records of expiries before the oldest month any
// table of the archive can hold, computed in the same statement (so that a
// month a sweeper creates meanwhile counts): the lower bound of the oldest
// partition, counting a partition whose detach is pending, and of any table
// named like a monthly partition that is not attached (a detached or
// restored month, which the partition manager may attach again). A bound
// that is not a timestamp (MINVALUE, a DEFAULT partition) counts as
// -infinity: such a partition can hold any expiry. With no table at all it
// deletes nothing: nothing then tells retired months from months not
// created yet. The BRIN index on expired_at finds the records (they arrive
// in roughly expiry order).
const pruneSQL = `
WITH bounds AS (
    SELECT coalesce((regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''([^'']*)''\)'))[1]::timestamptz,
                    '-infinity') AS lower_bound
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = to_regclass('idempotency_key_archive')
    UNION ALL
    SELECT (replace(substr(c.relname, 25), '_', '-') || '-01 00:00:00+00')::timestamptz
      FROM pg_class c
     WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('idempotency_key_archive'))
       AND c.relkind IN ('r', 'p') -- a month partitioned itself, detached whole
       AND c.relname ~ '^idempotency_key_archive_[0-9]{4}_(0[1-9]|1[0-2])$'
       AND substr(c.relname, 25, 4) <> '0000' -- no year 0 in PostgreSQL
),
oldest AS (SELECT min(lower_bound) AS bound FROM bounds)
DELETE FROM idempotency_archive_plain_keys
 WHERE ctid = ANY (ARRAY(SELECT ctid FROM idempotency_archive_plain_keys, oldest
                          WHERE expired_at < oldest.bound LIMIT $1))`

// Prune deletes the records of months before the oldest partition, in
// batches (growing as Index's do), until none is left or deadline passes
// (a batch cut short by it is rolled back, without an error); it returns how
// many it deleted. With no partition at all it deletes nothing: there is then no way
// to tell retired months from months not created yet.
func Prune(ctx context.Context, conn *pgx.Conn, batch int, l Limits, deadline time.Time) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("plain keys: batch must be positive, got %d", batch)
	}
	var deleted int64
	size := min(batch, firstBatch)
	for time.Until(deadline) >= time.Millisecond {
		var tag pgconn.CommandTag
		err := l.inTx(ctx, conn, deadline, func(tx pgx.Tx) error {
			var err error
			tag, err = tx.Exec(ctx, pruneSQL, size)
			return err
		})
		if outOfTime(err, deadline) && ctx.Err() == nil {
			break
		}
		if err != nil {
			return deleted, fmt.Errorf("plain keys: delete records of retired months: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(size) {
			break
		}
		size = doubled(size, batch)
	}
	return deleted, nil
}

// doubled returns the size of the batch after one of size that completed:
// twice as large, up to batch (written so as not to overflow when batch is
// near the largest int).
func doubled(size, batch int) int {
	if size > batch-size {
		return batch
	}
	return 2 * size
}

func format(t pgtype.Timestamptz) string {
	switch t.InfinityModifier {
	case pgtype.Infinity:
		return "infinity"
	case pgtype.NegativeInfinity:
		return "-infinity"
	}
	return t.Time.UTC().Format(time.RFC3339)
}
