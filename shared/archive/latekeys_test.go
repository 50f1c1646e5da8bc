package archive_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// The span the lookup reads past a key's timestamp is the one the trigger
// records rows beyond.
func TestPromptSpanIsTheSchemas(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var span pgtype.Interval
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT idempotency_key_prompt_span()").Scan(&span))
	require.Equal(t, pgtype.Interval{Microseconds: archive.PromptSpan.Microseconds(), Valid: true}, span)
}

// timeBeforeSQL asks the SQL rule whether $1's timestamp lies before $2.
const timeBeforeSQL = `
SELECT idempotency_key_has_time($1),
       idempotency_key_time_before($1, idempotency_key_time_bound($2, true), idempotency_key_time_bound($2, false))`

// The SQL comparison of a key's timestamp with an instant agrees with
// keytime.FromKey on every key that has a timestamp, at and around the
// instants where encodings change: the millisecond, the epoch, 2^48 ms, and
// the infinities.
func FuzzLateRuleMatchesKeytime(f *testing.F) {
	ts := time.Date(2026, 11, 20, 8, 30, 0, 123e6, time.UTC)
	for _, key := range []string{
		"idem:v1:" + dbtest.ULID(ts, ""), strings.ToLower(dbtest.ULID(ts, "")), dbtest.UUIDv7(ts, 1), strings.ToUpper(dbtest.UUIDv7(ts, 2)),
		dbtest.ULID(time.UnixMilli(0), ""), dbtest.UUIDv7(time.UnixMilli(0), 3), "7ZZZZZZZZZZZZZZZZZZZZZZZZZ", "ffffffff-ffff-7fff-bfff-ffffffffffff",
		"idem:v1:probe", "t:" + dbtest.ULID(ts, "7ZZZZZZZZZZZZZZZ"),
	} {
		k, _ := keytime.FromKey(key)
		for _, d := range []int64{-1001, -1000, -999, -1, 0, 1, 999, 1000, 1001, 86400e6 * 9} {
			f.Add(key, k.UnixMicro()+d)
		}
		f.Add(key, int64(0))
		f.Add(key, int64(-1))
		f.Add(key, int64(1)<<48*1000-1)
		f.Add(key, int64(1)<<48*1000)
		f.Add(key, int64(1)<<48*1000+1)
		f.Add(key, pgtype.Timestamptz{}.Time.UnixMicro()) // year 1
		f.Add(key, int64(math.MinInt64))
		f.Add(key, int64(math.MaxInt64))
	}
	db := dbtest.New(f)
	f.Fuzz(func(t *testing.T, key string, instantMicros int64) {
		if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
			return
		}
		// PostgreSQL's range starts in 4714 BC; int64 microseconds end
		// before it does, in 294247 AD. The extremes stand for infinity.
		instant := pgtype.Timestamptz{Time: time.UnixMicro(instantMicros).UTC(), Valid: true}
		switch {
		case instantMicros < -210866803200e6:
			instant = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		case instantMicros == math.MaxInt64:
			instant = pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
		}
		var hasTime bool
		var before *bool
		if err := db.Pool.QueryRow(context.Background(), timeBeforeSQL, key, instant).Scan(&hasTime, &before); err != nil {
			t.Fatalf("key %q, instant %v: %v", key, instant, err)
		}
		kt, ok := keytime.FromKey(key)
		if !ok || !hasTime {
			return // meaningless, and the trigger records such a key anyway
		}
		want := instant.InfinityModifier == pgtype.Infinity || (instant.InfinityModifier == pgtype.Finite && kt.Before(instant.Time))
		if before == nil || *before != want {
			t.Fatalf("key %q (timestamp %s), instant %v: SQL says %v, keytime says %v", key, kt.Format(time.RFC3339Nano), instant, before, want)
		}
	})
}

// lateRow is an archive row of a timestamped key and whether the trigger
// recorded it.
type lateRow struct {
	Key      string
	Expired  time.Time
	Recorded bool
}

// Every archive row that expired more than PromptSpan after its key's
// timestamp is recorded, through every way a row enters the archive and
// under any TimeZone; a row is recorded beyond that only when its key's
// timestamp lies before the trigger's bound less the span, and a row
// archived alone only when it is late.
func TestEveryLateRowIsRecorded(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 1)
	ctx := context.Background()
	sweeper := db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("TimeZone", "Asia/Kolkata"))
	month := partition.MonthStart(time.Now())
	rng := rand.New(rand.NewPCG(1, 2))

	// Rows whose lateness lies around the span, to the millisecond, and
	// far from it either way; ULIDs in both cases, UUIDs in both cases.
	const n, q = 4000, 1000
	var rows []lateRow
	for i := range n {
		expired := month.Add(time.Duration(rng.Int64N(int64(27 * 24 * time.Hour))))
		if i < q {
			// The first quarter, a sweep batch's: all within an hour.
			expired = month.Add(50*time.Hour + time.Duration(rng.Int64N(int64(time.Hour))))
		}
		var late time.Duration
		switch i % 4 {
		case 0:
			late = archive.PromptSpan + time.Duration(rng.Int64N(int64(4*time.Hour))) - 2*time.Hour
		case 1:
			late = archive.PromptSpan + time.Duration(rng.Int64N(5)-2)*time.Millisecond
		case 2:
			late = time.Duration(rng.Int64N(int64(400 * 24 * time.Hour)))
		default:
			late = -time.Duration(rng.Int64N(int64(time.Hour)))
		}
		minted := expired.Add(-late)
		var key string
		switch i % 5 {
		case 0:
			key = dbtest.ULID(minted, fmt.Sprintf("%016d", i))
		case 1:
			key = strings.ToLower(dbtest.ULID(minted, fmt.Sprintf("%016d", i)))
		case 2:
			key = dbtest.UUIDv7(minted, uint64(i))
		case 3:
			key = strings.ToUpper(dbtest.UUIDv7(minted, uint64(i)))
		default:
			key = "t=acme:" + dbtest.ULID(minted, fmt.Sprintf("%016d", i))
		}
		rows = append(rows, lateRow{Key: "idem:v1:" + key, Expired: expired.Truncate(time.Microsecond)})
	}
	// A quarter in one statement as a sweep batch runs it, a quarter in one
	// without the bulk setting, a quarter by COPY, a quarter one by one.
	insert := func(tx pgx.Tx, part []lateRow) {
		keys, expiries := make([]string, len(part)), make([]time.Time, len(part))
		for i, r := range part {
			keys[i], expiries[i] = r.Key, r.Expired
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
			SELECT k, '\x00', 201, e - interval '1 day', e FROM unnest($1::text[], $2::timestamptz[]) AS r (k, e)`, keys, expiries)
		require.NoError(t, err)
	}
	require.NoError(t, pgx.BeginFunc(ctx, sweeper, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SET LOCAL idemarchive.bulk_archive = 'on'")
		require.NoError(t, err)
		insert(tx, rows[:q])
		return nil
	}))
	require.NoError(t, pgx.BeginFunc(ctx, sweeper, func(tx pgx.Tx) error { insert(tx, rows[q:2*q]); return nil }))
	copied := make([][]any, 0, q)
	for _, r := range rows[2*q : 3*q] {
		copied = append(copied, []any{r.Key, []byte{0}, 201, r.Expired.Add(-time.Hour), r.Expired})
	}
	_, err := sweeper.CopyFrom(ctx, pgx.Identifier{"idempotency_key_archive"},
		[]string{"scoped_key", "fingerprint", "status_code", "created_at", "expired_at"}, pgx.CopyFromRows(copied))
	require.NoError(t, err)
	for _, r := range rows[3*q:] {
		require.NoError(t, pgx.BeginFunc(ctx, sweeper, func(tx pgx.Tx) error { insert(tx, []lateRow{r}); return nil }))
	}
	newest := func(part []lateRow) time.Time {
		var n time.Time
		for _, r := range part {
			if r.Expired.After(n) {
				n = r.Expired
			}
		}
		return n
	}
	oldest := func(part []lateRow) time.Time {
		o := part[0].Expired
		for _, r := range part {
			if r.Expired.Before(o) {
				o = r.Expired
			}
		}
		return o
	}
	// The trigger's bound: the latest expiry of a statement whose rows all
	// expire within an hour, else the end of the row's hour.
	bounds := map[string]time.Time{}
	bound := func(part []lateRow) {
		spread := newest(part).Sub(oldest(part))
		for _, r := range part {
			bounds[r.Key] = newest(part)
			if spread > time.Hour {
				bounds[r.Key] = r.Expired.Truncate(time.Hour).Add(time.Hour)
			}
		}
	}
	bound(rows[:q])
	bound(rows[q : 2*q])
	bound(rows[2*q : 3*q])
	for _, r := range rows[3*q:] {
		bound([]lateRow{r})
	}
	requireLateRule(t, db, rows, bounds)

	// An owner's UPDATE that moves rows to later expiries records them again.
	_, err = db.Pool.Exec(ctx, "UPDATE idempotency_key_archive SET expired_at = expired_at + interval '26 hours' WHERE status_code = 201 AND expired_at < $1", month.AddDate(0, 0, 2))
	require.NoError(t, err)
	var moved []lateRow
	for _, r := range rows {
		if r.Expired.Before(month.AddDate(0, 0, 2)) {
			moved = append(moved, lateRow{Key: r.Key, Expired: r.Expired.Add(26 * time.Hour)})
		}
	}
	require.NotEmpty(t, moved)
	bound(moved)
	requireLateRule(t, db, moved, bounds)
}

// requireLateRule checks each row's record against the rule, bound[key]
// being the trigger's bound for the row.
func requireLateRule(t *testing.T, db *dbtest.DB, rows []lateRow, bound map[string]time.Time) {
	t.Helper()
	keys, expiries := make([]string, len(rows)), make([]time.Time, len(rows))
	for i, r := range rows {
		keys[i], expiries[i] = r.Key, r.Expired
	}
	got, err := db.Pool.Query(context.Background(), `
		SELECT k, e, EXISTS (SELECT 1 FROM idempotency_archive_plain_keys p WHERE p.key_hash = idempotency_key_hash(k) AND p.expired_at = e)
		  FROM unnest($1::text[], $2::timestamptz[]) AS r (k, e)`, keys, expiries)
	require.NoError(t, err)
	recorded, err := pgx.CollectRows(got, pgx.RowToStructByPos[lateRow])
	require.NoError(t, err)
	require.Len(t, recorded, len(rows))
	var late int
	for _, r := range recorded {
		minted, ok := keytime.FromKey(r.Key)
		require.True(t, ok, r.Key)
		if minted.Before(r.Expired.Add(-archive.PromptSpan)) {
			late++
			require.True(t, r.Recorded, "key %q minted %s, expired %s: late and not recorded", r.Key, minted, r.Expired)
		} else if r.Recorded {
			require.True(t, minted.Before(bound[r.Key].Add(-archive.PromptSpan)), "key %q minted %s, expired %s: recorded, though not late by the trigger's bound", r.Key, minted, r.Expired)
		}
	}
	require.NotZero(t, late)
}

// Expiries that leave PostgreSQL's arithmetic range, or the keys' 48-bit
// milliseconds, are judged without an error, as the rule says.
func TestLateBoundsAtTheEdgesOfTime(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// Rows at those edges go through the trigger, alone and together.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_edges PARTITION OF idempotency_key_archive FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`)
	require.NoError(t, err)
	key := "idem:v1:" + dbtest.UUIDv7(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 9)
	for _, together := range []bool{false, true} {
		expiries := []string{"infinity", "294276-12-31 23:59:59.999999+00", "10889-08-02 05:00:00+00", "4713-11-24 00:00:00+00 BC", "-infinity"}
		var groups [][]string
		if together {
			groups = [][]string{expiries}
		} else {
			for _, e := range expiries {
				groups = append(groups, []string{e})
			}
		}
		_, err := db.Pool.Exec(ctx, "TRUNCATE idempotency_key_archive, idempotency_archive_plain_keys")
		require.NoError(t, err)
		for _, g := range groups {
			_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
				SELECT $1, '\x00', 201, now(), e FROM unnest($2::text[]) AS r (t), LATERAL (SELECT t::timestamptz) AS x (e)`, key, g)
			require.NoError(t, err, g)
		}
		var recorded []string
		rows, err := db.Pool.Query(ctx, "SELECT expired_at::text FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1) ORDER BY expired_at", key)
		require.NoError(t, err)
		recorded, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"10889-08-02 05:00:00+00", "294276-12-31 23:59:59.999999+00", "infinity"}, recorded, "together: %v", together)
	}

	// The encodings of an instant a key's timestamp can hold.
	enc := func(ms int64) (string, string) {
		u := dbtest.UUIDv7(time.UnixMilli(ms), 0)
		return dbtest.ULID(time.UnixMilli(ms), "")[:10], u[:8] + u[9:13]
	}
	u1, h1 := enc(3_600_000)
	u2, h2 := enc(time.Date(10889, 7, 25, 5, 0, 0, 0, time.UTC).UnixMilli())
	for _, tc := range []struct {
		expired string
		ulid    string
		uuid    string
	}{
		{"-infinity", "", ""},
		{"4713-11-24 00:00:00+00 BC", "", ""},
		{"1970-01-01 00:00:00+00", "", ""},
		{"1970-01-09 00:00:00+00", "", ""}, // less the span, the epoch: no timestamp lies before it
		{"1970-01-09 01:00:00+00", u1, h1}, // an hour past the epoch
		{"10889-08-02 05:00:00+00", u2, h2},
		{"10889-08-12 00:00:00+00", "8", "g"}, // past 2^48 ms: every key's timestamp lies before
		{"10890-01-01 00:00:00+00", "8", "g"},
		{"294276-12-31 23:59:59.999999+00", "8", "g"},
		{"infinity", "8", "g"},
	} {
		var ulid, uuid string
		err := db.Pool.QueryRow(ctx, `
			SELECT idempotency_key_time_bound(idempotency_key_late_bound($1::timestamptz, idempotency_key_prompt_span()), true),
			       idempotency_key_time_bound(idempotency_key_late_bound($1::timestamptz, idempotency_key_prompt_span()), false)`, tc.expired).Scan(&ulid, &uuid)
		require.NoError(t, err, tc.expired)
		require.Equal(t, tc.ulid, ulid, tc.expired)
		require.Equal(t, tc.uuid, uuid, tc.expired)
	}
}

// A key minted long ago reads the months of its prompt span, and those of
// the late rows recorded for it (a late first use, a second life): not every
// month since its timestamp. What it cannot rule out (a range still
// pending, a database that judges the key otherwise) it reads.
func TestAKeyMintedLongAgoReadsItsSpanAndItsLateRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	minted := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.UUIDv7(minted, 1)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: minted.Add(24 * time.Hour)})
	r := newReader(t, b.reader, nil)
	rec, err := r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.Equal(t, []string{"idempotency_key_archive_2026_02"}, explainLookup(t, b.reader, r, key))
	stmts, err := r.LookupStatements(ctx, key)
	require.NoError(t, err)
	require.Len(t, stmts, 3, "where the late rows are, the archive, the proof")

	// Another key of February, never archived: its span alone is read.
	other := "idem:v1:" + dbtest.ULID(minted, "")
	require.Equal(t, pgtype.Timestamptz{Time: minted.Add(archive.PromptSpan), Valid: true}, archive.ExpiryRange(r, other)[1])
	_, err = r.Lookup(ctx, other, nil)
	require.ErrorIs(t, err, archive.ErrNotFound)

	// The key used again in November (the archive was unreachable, and a
	// middleware failing open ran it): that row is recorded, and answers.
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 202, ExpiredAt: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)})
	rec, err = r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 202, rec.Status)
	touched := explainLookup(t, b.reader, r, key)
	require.Contains(t, touched, "idempotency_key_archive_2026_02")
	require.Contains(t, touched, "idempotency_key_archive_2026_11")
	require.NotContains(t, touched, "idempotency_key_archive_2026_12")

	// Its record lost, but its month pending (rows archived before
	// migration 010): still found.
	_, err = b.db.Pool.Exec(ctx, "DELETE FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)", key)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_archive_late_keys_pending (expired_from, expired_to) VALUES ('2026-11-01', '2026-12-01')")
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 202, rec.Status)
	_, err = b.db.Pool.Exec(ctx, "TRUNCATE idempotency_archive_late_keys_pending")
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status, "nothing says the November row is there: this proves the test reads what it means to")

	// A database whose span is not the Reader's (changed by hand) cannot
	// say which rows are late: everything up to now is read.
	_, err = b.db.Pool.Exec(ctx, "CREATE OR REPLACE FUNCTION idempotency_key_prompt_span() RETURNS interval LANGUAGE sql IMMUTABLE AS $$ SELECT interval '400 days' $$")
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 202, rec.Status)
	require.Contains(t, explainLookup(t, b.reader, r, key), "idempotency_key_archive_2026_11")
}

// A span of days compares equal to the Reader's 192 hours as an interval,
// but the trigger subtracts it in the writer's TimeZone: 8 days before
// 2026-04-08 00:00 UTC in Sydney, whose daylight saving time ended on the
// 5th, are 193 hours, so a row half an hour past the Reader's span is not
// recorded. The lookup must not trust such a database's records.
func TestASpanOfDaysIsNotTheReadersSpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, "CREATE OR REPLACE FUNCTION idempotency_key_prompt_span() RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '8 days' $$")
	require.NoError(t, err)
	expired := time.Date(2026, 4, 8, 0, 0, 0, 0, time.UTC)
	minted := expired.Add(-archive.PromptSpan - 30*time.Minute)
	inSydney := "idem:v1:" + dbtest.ULID(minted, "")
	inUTC := "idem:v1:" + dbtest.ULID(minted, "0000000000000000")
	dbtest.InsertArchive(t, b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("TimeZone", "Australia/Sydney")),
		dbtest.ArchiveRow{Key: inSydney, Status: 201, ExpiredAt: expired})
	dbtest.InsertArchive(t, b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("TimeZone", "UTC")),
		dbtest.ArchiveRow{Key: inUTC, Status: 201, ExpiredAt: expired})
	var recorded int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)", inSydney).Scan(&recorded))
	require.Zero(t, recorded, "the premise: the row written in Sydney is not recorded as late")

	r := newReader(t, b.reader, nil)
	for _, key := range []string{inUTC, inSydney} {
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, "the archive holds %s (expired %s)", key, expired)
		require.Equal(t, 201, rec.Status)
	}
}

// Late rows at the edges of the span and of months, of every key shape,
// written by a sweeper in an odd TimeZone, are found in every exec mode and
// plan cache mode, under another TimeZone, and again once plans are cached.
func TestLateRowsAreFoundInEveryExecAndPlanMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type row struct {
		key     string
		expired time.Time
	}
	var rows []row
	mints := []time.Time{
		time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 31, 23, 59, 59, 999e6, time.UTC),
		time.Date(2026, 3, 1, 0, 59, 59, 999e6, time.UTC),
		time.Date(2026, 4, 22, 23, 59, 59, 999e6, time.UTC), // its span ends 1 ms before May
	}
	i := 0
	for _, m := range mints {
		for _, late := range []time.Duration{archive.PromptSpan + time.Microsecond, archive.PromptSpan + time.Millisecond, archive.PromptSpan + 40*24*time.Hour, 200 * 24 * time.Hour} {
			i++
			for _, key := range []string{
				"idem:v1:" + dbtest.ULID(m, fmt.Sprintf("%016d", i)),
				"idem:v1:" + strings.ToLower(dbtest.ULID(m, fmt.Sprintf("%016d", i+100))),
				"idem:v1:" + dbtest.UUIDv7(m, uint64(i)),
				"t=acme:é:" + strings.ToUpper(dbtest.UUIDv7(m, uint64(i+100))),
			} {
				rows = append(rows, row{key, m.Add(late)})
			}
		}
	}
	sweeper := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("TimeZone", "America/St_Johns"))
	for _, r := range rows {
		require.True(t, r.expired.Before(now), "%s expires after the test's now", r.key)
		dbtest.InsertArchive(t, sweeper, dbtest.ArchiveRow{Key: r.key, Status: 201, ExpiredAt: r.expired})
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeDescribeExec} {
		for _, plan := range []string{"auto", "force_generic_plan", "force_custom_plan"} {
			pool := b.db.NewPool(t, dbtest.AsRole(schema.ReaderRole), dbtest.WithParam("plan_cache_mode", plan),
				dbtest.WithParam("TimeZone", "Pacific/Chatham"),
				func(c *pgxpool.Config) { c.MaxConns = 1; c.ConnConfig.DefaultQueryExecMode = mode })
			r := newReader(t, pool, nil)
			for rep := 0; rep < 2; rep++ {
				for _, row := range rows {
					if _, err := r.Lookup(ctx, row.key, nil); err != nil {
						t.Errorf("%s, %s: %s (expired %s): %v", mode, plan, row.key, row.expired, err)
					}
				}
			}
		}
	}
}

// The database must read a key's timestamp as keytime does, or a lookup
// would trust records kept by another reading: one that differs (a rule
// changed by hand) makes the lookup read everything up to now.
func TestADatabaseThatReadsTheTimestampOtherwiseIsNotTrusted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	minted := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.ULID(minted, "")
	r := newReader(t, b.reader, nil)
	require.Equal(t, pgtype.Timestamptz{Time: minted.Add(archive.PromptSpan), Valid: true}, archive.ExpiryRange(r, key)[1])
	// A rule that reads a ULID's timestamp a day late.
	_, err := b.db.Pool.Exec(ctx, `
		CREATE OR REPLACE FUNCTION idempotency_key_time_bound(instant timestamptz, ulid boolean) RETURNS text
		    LANGUAGE sql IMMUTABLE AS $$
		SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> (5 * (9 - i))) & 31)::int + 1, 1), '' ORDER BY i)
		  FROM (SELECT ceil(extract(epoch FROM instant + interval '1 day') * 1000)::bigint AS ms) AS t, generate_series(0, 9) AS i
		$$`)
	require.NoError(t, err)
	upper := archive.ExpiryRange(r, key)[1].(pgtype.Timestamptz)
	require.True(t, upper.Time.After(time.Now()), "read up to now, not %v", upper)
}

// A range marked pending under migration 006's rule (a partition attached
// with rows) is pending under migration 010's too, in a table a partition
// manager from before migration 010 never reads: one that records the
// range's rows by the old rule alone (a deploy that overlaps the migration,
// a rollback of the code) and deletes it leaves the late rows pending,
// still found, until the current partition manager records them.
func TestAnOlderPartitionManagerLeavesLateRowsPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	minted := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.ULID(minted, "")
	const month = "idempotency_key_archive_2026_10"
	for _, q := range []string{
		// A row no trigger saw: loaded while the month was detached, its
		// own recording trigger (migration 012) off, as in a table
		// restored without it.
		"ALTER TABLE idempotency_key_archive DETACH PARTITION " + month,
		"ALTER TABLE " + month + " DISABLE TRIGGER idempotency_key_archive_plain_keys",
		"INSERT INTO " + month + ` (scoped_key, fingerprint, status_code, created_at, expired_at)
		 VALUES ('` + key + `', '\x00', 201, '2026-10-14 00:00:00+00', '2026-10-15 00:00:00+00')`,
		"ALTER TABLE " + month + " ENABLE TRIGGER idempotency_key_archive_plain_keys",
		"ALTER TABLE idempotency_key_archive ATTACH PARTITION " + month + " FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00')",
		// As the partition manager marks a month it attached with rows.
		`INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('2026-10-01 00:00:00+00', '2026-11-01 00:00:00+00')
		 ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`,
	} {
		_, err := b.db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	pendingLate := "SELECT count(*) FROM idempotency_archive_late_keys_pending WHERE expired_from = '2026-10-01 00:00:00+00' AND after_key = ''"
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, pendingLate))
	r := newReader(t, b.reader, nil)
	find := func(msg string) {
		t.Helper()
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, msg)
		require.Equal(t, 201, rec.Status, msg)
	}
	find("pending under both rules")

	// The older partition manager: the key has a timestamp, so its rule
	// records nothing, and it deletes the range.
	_, err := b.db.Pool.Exec(ctx, "DELETE FROM idempotency_archive_plain_keys_pending")
	require.NoError(t, err)
	find("its late range is still pending")

	// Progress on the late range, then the month marked again: the copy
	// starts over too.
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('2026-10-01 00:00:00+00', '2026-11-01 00:00:00+00')")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "UPDATE idempotency_archive_late_keys_pending SET after_key = 'idem:v1:z', after_expired_at = '2026-10-20 00:00:00+00'")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "UPDATE idempotency_archive_plain_keys_pending SET after_key = 'idem:v1:y', after_expired_at = '2026-10-20 00:00:00+00'")
	require.NoError(t, err)
	require.Zero(t, dbtest.Count(t, b.db.Pool, pendingLate), "a batch's progress on the 006 range is not a new mark")
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('2026-10-01 00:00:00+00', '2026-11-01 00:00:00+00')
		 ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, pendingLate), "marked again, from the start")

	// The older partition manager again, part of the way through the
	// month; then the current one, which cannot carry the copy along with
	// that range (it lies elsewhere), scans each, records the late row and
	// clears both.
	_, err = b.db.Pool.Exec(ctx, "UPDATE idempotency_archive_plain_keys_pending SET after_key = 'idem:v1:z', after_expired_at = '2026-10-20 00:00:00+00'")
	require.NoError(t, err)
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	p, err := plainkeys.Index(ctx, conn.Conn(), 100, plainkeys.Limits{}, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, plainkeys.Progress{Scanned: 1, Recorded: 1, RangesDone: 2}, p)
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending"))
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	find("recorded")
}

// A key minted long ago with no late row recorded is looked up in one round
// trip: the read of where its late rows are goes in the archive read's
// batch. A recorded late row costs a second, which reads up to it.
func TestAnOldKeyWithoutLateRowsIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	trips := &batchCounter{}
	pool := b.db.NewPool(t, dbtest.AsRole(schema.ReaderRole), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })
	r := newReader(t, pool, nil)
	minted := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.UUIDv7(minted, 3)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: minted.Add(24 * time.Hour)})
	lookup := func(status int) int64 {
		t.Helper()
		before := trips.batches.Load()
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err)
		require.Equal(t, status, rec.Status)
		return trips.batches.Load() - before
	}
	lookup(201) // reads the writers too, once a minute
	require.EqualValues(t, 1, lookup(201))

	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 202, ExpiredAt: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)})
	require.EqualValues(t, 2, lookup(202), "the span, then up to the late row")
}

// batchCounter counts the batches a pool sends (every statement of a
// Reader's lookup goes in one).
type batchCounter struct{ batches atomic.Int64 }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	return ctx
}
func (c *batchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A role that may not read migration 010's tables (a deploy whose grants
// lag, a role made by hand) reads up to the ceiling, and after the first
// such lookup no longer tries them for a while: each failed try costs the
// connection its prepared statements and a round trip.
func TestLateTablesThatCannotBeReadAreNotTriedAgainAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	role := readerRole(t, b, "late_blind", "idempotency_key_archive", "idempotency_writers", "idempotency_archive_plain_keys", "idempotency_archive_plain_keys_pending")
	trips := &batchCounter{}
	pool := b.db.NewPool(t, dbtest.AsRole(role), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })
	r := newReader(t, pool, nil)
	minted := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.UUIDv7(minted, 4)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)})
	lookup := func() int64 {
		t.Helper()
		before := trips.batches.Load()
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err)
		require.Equal(t, 201, rec.Status, "a late row, found by reading up to the ceiling")
		return trips.batches.Load() - before
	}
	require.EqualValues(t, 3, lookup(), "the writers, the late read that fails, the read up to the ceiling")
	require.EqualValues(t, 1, lookup(), "up to the ceiling at once")
}

// Only the late read's own failure stops a Reader trying it: a lookup that
// fails for another grant (the archive's) leaves the next lookup, once the
// grant is back, reading where the key's late rows are.
func TestAnotherMissingGrantDoesNotStopTheLateRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	role := readerRole(t, b, "late_sighted", "idempotency_key_archive", "idempotency_writers", "idempotency_archive_plain_keys",
		"idempotency_archive_plain_keys_pending", "idempotency_archive_late_keys_pending")
	trips := &batchCounter{}
	pool := b.db.NewPool(t, dbtest.AsRole(role), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = trips })
	r := newReader(t, pool, nil)
	minted := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + dbtest.UUIDv7(minted, 5)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)})
	grant := func(verb string) {
		t.Helper()
		q := verb + " SELECT ON idempotency_key_archive " + map[string]string{"GRANT": "TO ", "REVOKE": "FROM "}[verb] + pgx.Identifier{role}.Sanitize()
		_, err := b.db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	_, err := r.Lookup(ctx, key, nil) // reads the writers
	require.NoError(t, err)
	grant("REVOKE")
	_, err = r.Lookup(ctx, key, nil)
	require.Error(t, err)
	grant("GRANT")
	before := trips.batches.Load()
	rec, err := r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.EqualValues(t, 2, trips.batches.Load()-before, "the span with the late read, then up to the late row")
}

// readerRole creates a role, dropped at the end of the test, that may read
// the tables named in b's schema and nothing else, and returns its name.
func readerRole(t *testing.T, b bundle, name string, tables ...string) string {
	t.Helper()
	ctx := context.Background()
	role := name + "_" + b.db.Schema
	quoted := pgx.Identifier{role}.Sanitize()
	for _, q := range []string{
		"CREATE ROLE " + quoted + " NOLOGIN",
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{b.db.Schema}.Sanitize() + " TO " + quoted,
		"GRANT SELECT ON " + strings.Join(tables, ", ") + " TO " + quoted,
	} {
		_, err := b.db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), "DROP OWNED BY "+quoted+"; DROP ROLE "+quoted)
	})
	return role
}

// Migration 011's idempotency_key_time_bound gives what migration 010's gave
// (read from the migration itself, under another name) for every instant
// where an encoding changes or a millisecond is rounded up, at and around
// the epoch and 2^48 ms, the infinities, PostgreSQL's extremes and NULL,
// under a TimeZone and DateStyle far from UTC's.
func TestTimeBoundIsMigration010s(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	src, err := os.ReadFile("../schema/migrations/010_archive_late_keys.sql")
	require.NoError(t, err)
	const head = "CREATE OR REPLACE FUNCTION idempotency_key_time_bound("
	start := strings.Index(string(src), head)
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(string(src[start:]), "\n$$;\n")
	require.Greater(t, end, 0)
	_, err = db.Pool.Exec(ctx, strings.Replace(string(src[start:start+end+4]), head, "CREATE FUNCTION idempotency_key_time_bound_010(", 1))
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	_, err = tx.Exec(ctx, "SET LOCAL TimeZone = 'Pacific/Chatham'; SET LOCAL DateStyle = 'SQL, DMY'")
	require.NoError(t, err)
	var compared, differ int64
	var sample string
	err = tx.QueryRow(ctx, `
		WITH instants (t) AS (
		    SELECT 'epoch'::timestamptz + x * interval '1 microsecond' FROM generate_series(-3000, 3000) AS x
		    UNION ALL
		    SELECT '10889-08-02 05:31:50.655+00'::timestamptz + x * interval '1 microsecond' FROM generate_series(-3000, 3000) AS x
		    UNION ALL
		    -- Around whole milliseconds spread over 1970-2100.
		    SELECT 'epoch'::timestamptz + m * interval '1 millisecond' + d * interval '1 microsecond'
		      FROM (SELECT (x * 98765432109)::bigint % 4102444800000 FROM generate_series(1, 20000) AS x) AS ms (m),
		           (VALUES (-1), (0), (1), (999)) AS ds (d)
		    UNION ALL
		    -- Each 5-bit group of a ULID's milliseconds at each of its values.
		    SELECT 'epoch'::timestamptz + (k * (2::bigint ^ (5 * j))::bigint) * interval '1 millisecond' + d * interval '1 microsecond'
		      FROM generate_series(1, 31) AS k, generate_series(0, 9) AS j, (VALUES (-1), (0), (1)) AS ds (d)
		    UNION ALL
		    -- PostgreSQL's whole range, BC included.
		    SELECT '4713-11-24 00:00:00+00 BC'::timestamptz + x * interval '8925 days 01:23:45.678901'
		      FROM generate_series(0, 12000) AS x
		    UNION ALL
		    SELECT unnest(ARRAY['infinity', '-infinity', '4713-11-24 00:00:00+00 BC', '294276-12-31 23:59:59.999999+00',
		                        '1969-12-31 23:59:59.999+00', '10889-08-02 05:31:50.656+00', NULL]::timestamptz[])
		)
		SELECT count(*),
		       count(*) FILTER (WHERE idempotency_key_time_bound(t, u) IS DISTINCT FROM idempotency_key_time_bound_010(t, u)),
		       coalesce(min(coalesce(t::text, 'NULL') || ' ' || coalesce(u::text, 'NULL')) FILTER (WHERE idempotency_key_time_bound(t, u) IS DISTINCT FROM idempotency_key_time_bound_010(t, u)), '')
		  FROM instants, (VALUES (true), (false), (NULL)) AS us (u)`).Scan(&compared, &differ, &sample)
	require.NoError(t, err)
	require.EqualValues(t, 3*(6001+6001+80000+930+12001+7), compared)
	require.Zero(t, differ, "first difference: %s", sample)
}

// Rows written with the archive's triggers off (an owner's data-only
// restore) are not recorded, so a lookup can miss them; the README's remedy,
// marking their expiries pending, makes lookups read the range in full until
// the partition manager has recorded its rows.
func TestRowsWrittenWithTriggersOffAreFoundOnceTheirRangeIsPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	late := "idem:v1:" + dbtest.ULID(time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC), "")
	plain := "idem:v1:restored-without-triggers"
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET session_replication_role = replica")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ($1, '\x00', 201, '2026-10-14 00:00:00+00', '2026-10-15 00:00:00+00'),
		       ($2, '\x00', 202, '2026-10-14 00:00:00+00', '2026-10-15 00:00:00+00')`, late, plain)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "RESET session_replication_role")
	require.NoError(t, err)

	r := newReader(t, b.reader, nil)
	for _, key := range []string{late, plain} {
		_, err := r.Lookup(ctx, key, nil)
		require.ErrorIs(t, err, archive.ErrNotFound, "the premise: %s is not recorded, and missed", key)
	}
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('2026-10-15 00:00:00+00', '2026-10-16 00:00:00+00')")
	require.NoError(t, err)
	find := func(msg string) {
		t.Helper()
		for key, status := range map[string]int{late: 201, plain: 202} {
			rec, err := r.Lookup(ctx, key, nil)
			require.NoError(t, err, "%s: %s", msg, key)
			require.Equal(t, status, rec.Status, "%s: %s", msg, key)
		}
	}
	find("pending")
	p, err := plainkeys.Index(ctx, conn.Conn(), 100, plainkeys.Limits{}, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, plainkeys.Progress{Scanned: 2, Recorded: 2, RangesDone: 1}, p)
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending"))
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	find("recorded")
}
