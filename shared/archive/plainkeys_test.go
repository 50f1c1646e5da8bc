package archive_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/keytime"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// plainRows counts the rows idempotency_archive_plain_keys holds for key.
func plainRows(t *testing.T, pool *pgxpool.Pool, key string) int64 {
	t.Helper()
	return dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)", key)
}

// Every way a row enters the archive through the partitioned table records a
// key without a timestamp, and only such keys; a row skipped ON CONFLICT adds
// nothing.
func TestEveryArchivedPlainKeyIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sweeper := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
	nov := time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)

	timed := "idem:v1:" + ulid(nov)
	dbtest.InsertArchive(t, sweeper,
		dbtest.ArchiveRow{Key: "idem:v1:plain", Status: 201, ExpiredAt: nov},
		dbtest.ArchiveRow{Key: "idem:v1:plain", Status: 201, ExpiredAt: nov.AddDate(0, -2, 0)},
		dbtest.ArchiveRow{Key: timed, Status: 201, ExpiredAt: nov},
	)
	require.EqualValues(t, 2, plainRows(t, b.db.Pool, "idem:v1:plain"))
	require.Zero(t, plainRows(t, b.db.Pool, timed), "a key with a timestamp is bounded by it, not recorded")

	// COPY, as a bulk import would.
	_, err := sweeper.CopyFrom(ctx, pgx.Identifier{"idempotency_key_archive"},
		[]string{"scoped_key", "fingerprint", "status_code", "created_at", "expired_at"},
		pgx.CopyFromRows([][]any{{"idem:v1:copied", dbtest.Fingerprint("c"), int16(201), nov.Add(-time.Hour), nov}}))
	require.NoError(t, err)
	require.EqualValues(t, 1, plainRows(t, b.db.Pool, "idem:v1:copied"))

	// A row already archived (a sweep retried after a crash) adds nothing.
	_, err = sweeper.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ($1, '\x00', 201, $2, $3) ON CONFLICT DO NOTHING`, "idem:v1:plain", nov.Add(-time.Hour), nov)
	require.NoError(t, err)
	require.EqualValues(t, 2, plainRows(t, b.db.Pool, "idem:v1:plain"))

	// No writer can go round the trigger by writing a partition directly.
	for _, role := range []string{schema.SweeperRole, schema.WriterRole, schema.ReaderRole} {
		pool := b.db.NewPool(t, dbtest.AsRole(role))
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
			VALUES ('idem:v1:direct', '\x00', 201, $1, $2)`, nov.Add(-time.Hour), nov)
		require.ErrorContains(t, err, "permission denied", role)
		_, err = pool.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys VALUES (1, now())`)
		require.ErrorContains(t, err, "permission denied", role)
	}

	rec, err := newReader(t, b.reader, nil).Lookup(ctx, "idem:v1:copied", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
}

// The lookup of a key without a timestamp finds every row the invariant of
// migration 006 covers, and finds the rows it does not cover yet only through
// a pending range.
func TestPlainKeyLookupReadsPendingRanges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := newReader(t, b.reader, nil)
	oct := time.Date(2026, 10, 9, 0, 0, 0, 0, time.UTC)
	dbtest.InsertArchive(t, b.db.Pool,
		dbtest.ArchiveRow{Key: "idem:v1:old", Status: 201, ResourceID: ptr("ch_old"), ExpiredAt: oct},
		dbtest.ArchiveRow{Key: "idem:v1:old", Status: archive.InFlightStatus, ExpiredAt: oct.AddDate(0, 1, 0)},
	)
	// A row archived before its key was recorded (before migration 006).
	_, err := b.db.Pool.Exec(ctx, "DELETE FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:old') AND expired_at = $1", oct)
	require.NoError(t, err)

	rec, err := r.Lookup(ctx, "idem:v1:old", nil)
	require.NoError(t, err)
	require.True(t, rec.InFlight(), "without a pending range the October row is out of reach: this test can fail")

	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ($1, $2)",
		time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, "idem:v1:old", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status, "the completed October row answers over the in-flight November one")
	require.Equal(t, ptr("ch_old"), rec.ResourceID)

	// A pending range reaches keys that were never recorded at all.
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:unrecorded', '\x00', 409, $1, $2)`, oct.Add(-time.Hour), oct.Add(time.Hour))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, "DELETE FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:unrecorded')")
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, "idem:v1:unrecorded", nil)
	require.NoError(t, err)
	require.Equal(t, 409, rec.Status)
}

// Where the database's rule for "has a timestamp" says yes and keytime's says
// no, the database recorded nothing for the key: the lookup reads every
// partition instead of trusting an empty answer.
func TestPlainKeyLookupWhenTheRulesDisagree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION idempotency_key_has_time(scoped_key text) RETURNS boolean
		LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT true $$`)
	require.NoError(t, err)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:disputed", Status: 201, ExpiredAt: time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)})
	require.Zero(t, plainRows(t, b.db.Pool, "idem:v1:disputed"))

	r := newReader(t, b.reader, nil)
	rec, err := r.Lookup(ctx, "idem:v1:disputed", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	touched := explainLookup(t, b.reader, r, "idem:v1:disputed")
	require.Len(t, touched, 15)

	// A rule that cannot say (NULL) is not trusted either.
	_, err = b.db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION idempotency_key_has_time(scoped_key text) RETURNS boolean
		LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT NULL::boolean $$`)
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, "idem:v1:disputed", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.Len(t, explainLookup(t, b.reader, r, "idem:v1:disputed"), 15)
}

// rule006 is idempotency_key_has_time as migration 006 wrote it, a pattern
// matched against the whole key. Migrations 007 and 009 replaced it with
// cheaper forms of the same rule: the entries the trigger recorded under any
// of them must mean the same.
const rule006 = `(^|:)([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-7[0-9A-Fa-f]{3}-[89ABab][0-9A-Fa-f]{3}-[0-9A-Fa-f]{12})$`

// idempotency_key_has_time is inlined into the statements that call it (a
// function that is not inlined costs several µs a row in the sweep's
// trigger), and a NULL key still gives NULL.
func TestKeyTimeRuleIsInlined(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	var plan string
	require.NoError(t, db.Pool.QueryRow(ctx, `EXPLAIN (VERBOSE, FORMAT JSON)
		SELECT idempotency_key_has_time(scoped_key) FROM idempotency_key_archive`).Scan(&plan))
	require.Contains(t, plan, "split_part")
	require.NotContains(t, plan, "idempotency_key_has_time", "the function is called, not inlined")
	var null *bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT idempotency_key_has_time(NULL)").Scan(&null))
	require.Nil(t, null)
}

// The trigger and the lookup decide whether a key has a timestamp with the
// SQL function idempotency_key_has_time, the middleware with keytime.FromKey:
// they must agree on every key a lookup accepts.
func FuzzKeyTimeRuleMatchesSQL(f *testing.F) {
	ts := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	u := ulid(ts)
	for _, s := range []string{
		u, strings.ToLower(u), "idem:v1:" + u, "idem:v1:t=acme:" + u, u + ":x", "8" + u[1:], "7" + u[1:], "Z" + u[1:],
		u[:25], u + "0", strings.Replace(u, "A", "I", 1), strings.Replace(u, "A", "L", 1), strings.Replace(u, "B", "U", 1),
		"x\n" + u, u + "\n", ":" + u, "::" + u, u + ":", u + "::" + u, "x:" + strings.Repeat("0", 26), strings.Repeat("é", 26),
		"idem:v1:" + strings.Repeat("-", 36), "0190f5a4-5c3e-7abc-8def-0123456789aé", "0190f5a4-5c3e-7abc-8def-0123456789a:b",
		"0190f5a4-5c3e-7abc-8def-0123456789ab", "0190F5A4-5C3E-7ABC-BDEF-0123456789AB", "0190f5a4-5c3e-7abc-cdef-0123456789ab",
		"0190f5a4-5c3e-4abc-8def-0123456789ab", "0190f5a45c3e-7abc-8def-0123456789ab-", "idem:v1:0190f5a4-5c3e-7abc-9def-0123456789ab",
		"0190f5a4-5c3e-7abc-8def-0123456789aG", "g190f5a4-5c3e-7abc-8def-0123456789ab", "0190f5a4_5c3e-7abc-8def-0123456789ab",
		"idem:v1:probe", "", "é" + u[1:], "idem:v1:" + u + "é",
		// Migration 009's rule: dashes moved, added or doubled in a segment
		// of 36 characters, and each fixed character in the wrong place.
		"0190f5a-45c3e-7abc-8def-0123456789ab", "0190f5a4-5c3e-7abc-8def0-123456789ab", "0190f5a4-5c3e-7abc-8de-f0123456789ab",
		"0190f5a4-5c3e-7abc-8def-01234567-9ab", "0190f5a4-5c3e-7abc-8def--123456789ab", "0190f5a4-5c3e-7-bc-8def-0123456789ab",
		"0190f5a4-5c3e-7abc-8-ef-0123456789ab", "0190f5a4-5c3e7-abc-8def-0123456789ab", "0190f5a4-5c3e-a7bc-8def-0123456789ab",
		"0190f5a4-5c3e-7abc-d8ef-0123456789ab", "0190f5a4-5c3é-7abc-8def-0123456789ab", "-190f5a4-5c3e-7abc-8def-0123456789ab",
		"0190f5a4-5c3e-7abc-8def-0123456789a-", "x:0190f5a4-5c3e-7abc-8def-0123456789ab", "0" + strings.Repeat("-", 25),
	} {
		f.Add(s)
	}
	db := dbtest.New(f)
	f.Fuzz(func(t *testing.T, key string) {
		if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
			return // refused before any query (ErrInvalidKey)
		}
		var inSQL, in006 bool
		if err := db.Pool.QueryRow(context.Background(), "SELECT idempotency_key_has_time($1), $1 ~ '"+rule006+"'", key).Scan(&inSQL, &in006); err != nil {
			t.Fatal(err)
		}
		if _, inGo := keytime.FromKey(key); inGo != inSQL {
			t.Fatalf("key %q: keytime says %v, idempotency_key_has_time says %v", key, inGo, inSQL)
		}
		if in006 != inSQL {
			// Entries recorded under migration 006's rule must stay valid.
			t.Fatalf("key %q: migration 006's rule says %v, idempotency_key_has_time says %v", key, in006, inSQL)
		}
	})
}

// The SQL rule pins positions and lengths without counted repetition
// (migration 009): every key one character away from a ULID or a UUIDv7, and
// every move of one of a UUID's dashes, is judged as keytime and migration
// 006's pattern judge it. The fuzz target rarely reaches these by mutation.
func TestKeyTimeRuleAgreesNextToEveryTimestamp(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	const uuid7 = "0190f5a4-5c3e-7abc-8def-0123456789ab"
	var keys []string
	for _, seg := range []string{ulid(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)), uuid7, strings.ToUpper(uuid7)} {
		runes := []rune(seg)
		for i := range runes {
			// LIKE's wildcards and escape, whitespace, letters whose case
			// forms differ in length or script, a combining mark, a
			// fullwidth digit.
			for _, c := range "-:078ABILOUZabgxé_%\\\n\tİıßſ\u212aẞ\u0301０" {
				m := append([]rune(nil), runes...)
				m[i] = c
				keys = append(keys, "idem:v1:"+string(m))
			}
			// Dropped, and doubled.
			keys = append(keys, "idem:v1:"+string(runes[:i])+string(runes[i+1:]), "idem:v1:"+string(runes[:i+1])+string(runes[i:]))
		}
	}
	for i := 0; i < len(uuid7); i++ {
		for j := 0; j < len(uuid7); j++ {
			if uuid7[i] == '-' && uuid7[j] != '-' {
				// One dash moved to another place, the length kept.
				b := []byte(uuid7)
				b[i], b[j] = b[j], b[i]
				keys = append(keys, string(b), "k:"+string(b))
			}
		}
	}
	type verdict struct {
		Key          string
		InSQL, In006 bool
	}
	rows, err := db.Pool.Query(context.Background(),
		"SELECT k, idempotency_key_has_time(k), k ~ '"+rule006+"' FROM unnest($1::text[]) AS k", keys)
	require.NoError(t, err)
	verdicts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[verdict])
	require.NoError(t, err)
	require.Len(t, verdicts, len(keys))
	for _, v := range verdicts {
		_, inGo := keytime.FromKey(v.Key)
		require.Equal(t, inGo, v.InSQL, "key %q: keytime and idempotency_key_has_time disagree", v.Key)
		require.Equal(t, v.In006, v.InSQL, "key %q: migration 006's rule and idempotency_key_has_time disagree", v.Key)
	}
}

// A plain key that was never archived is answered from
// idempotency_archive_plain_keys alone, whatever the number of partitions.
func TestPlainKeyNotArchivedReadsNoPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newReader(t, b.reader, nil)
	for i := range 20 {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: fmt.Sprintf("idem:v1:k%d", i), Status: 201, ExpiredAt: time.Date(2026, time.Month(1+i%11), 2, 0, 0, 0, 0, time.UTC)})
	}
	require.Nil(t, archive.ExpiryRange(r, "idem:v1:missing"))
	_, err := r.Lookup(context.Background(), "idem:v1:missing", nil)
	require.ErrorIs(t, err, archive.ErrNotFound)
	for i := range 20 {
		rec, err := r.Lookup(context.Background(), fmt.Sprintf("idem:v1:k%d", i), nil)
		require.NoError(t, err)
		require.Equal(t, 201, rec.Status)
	}
}

// The owner may move an archive row by hand (an incident fix): the row stays
// reachable.
func TestAnUpdatedArchiveRowIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:moved", Status: 201, ExpiredAt: time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)})
	_, err := b.db.Pool.Exec(ctx, "UPDATE idempotency_key_archive SET expired_at = '2026-08-03 00:00:00+00', scoped_key = 'idem:v1:renamed' WHERE scoped_key = 'idem:v1:moved'")
	require.NoError(t, err)
	rec, err := newReader(t, b.reader, nil).Lookup(ctx, "idem:v1:renamed", nil)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 8, 3, 0, 0, 0, 0, time.UTC), rec.ExpiredAt)
}

// A MERGE that moves a row to another month is recorded too: on
// PostgreSQL 15 its AFTER UPDATE statement trigger sees an empty transition
// table for a row that changes partition, so the row trigger of migration
// 013 records it, for keys without a timestamp and for keys used long
// after theirs alike. A MERGE that inserts is recorded as an INSERT is.
func TestARowAMergeWritesIsRecorded(t *testing.T) {
	t.Parallel()
	late := "idem:v1:" + ulid(time.Date(2025, 1, 10, 0, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name, key string
		merge     string
		want      time.Time
	}{
		{"update to another month", "idem:v1:merged", `
			MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:merged')) AS s (k) ON a.scoped_key = s.k
			WHEN MATCHED THEN UPDATE SET expired_at = '2026-08-03 00:00:00+00'`, time.Date(2026, 8, 3, 0, 0, 0, 0, time.UTC)},
		{"update within the month", "idem:v1:merged", `
			MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:merged')) AS s (k) ON a.scoped_key = s.k
			WHEN MATCHED THEN UPDATE SET expired_at = '2026-03-20 00:00:00+00'`, time.Date(2026, 3, 20, 0, 0, 0, 0, time.UTC)},
		{"update of a late key to another month", late, `
			MERGE INTO idempotency_key_archive a USING (VALUES ('` + late + `')) AS s (k) ON a.scoped_key = s.k
			WHEN MATCHED THEN UPDATE SET expired_at = '2026-08-03 00:00:00+00'`, time.Date(2026, 8, 3, 0, 0, 0, 0, time.UTC)},
		{"rename into another month", "idem:v1:renamed-by-merge", `
			MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:merged')) AS s (k) ON a.scoped_key = s.k
			WHEN MATCHED THEN UPDATE SET scoped_key = 'idem:v1:renamed-by-merge', expired_at = '2026-09-03 00:00:00+00'`, time.Date(2026, 9, 3, 0, 0, 0, 0, time.UTC)},
		{"insert", "idem:v1:inserted-by-merge", `
			MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:inserted-by-merge')) AS s (k) ON a.scoped_key = s.k
			WHEN NOT MATCHED THEN INSERT (scoped_key, fingerprint, status_code, created_at, expired_at)
			VALUES (s.k, '\x00', 201, '2026-05-01 00:00:00+00', '2026-05-02 00:00:00+00')`, time.Date(2026, 5, 2, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			dbtest.InsertArchive(t, b.db.Pool,
				dbtest.ArchiveRow{Key: "idem:v1:merged", Status: 201, ExpiredAt: time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)},
				dbtest.ArchiveRow{Key: late, Status: 201, ExpiredAt: time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)})
			_, err := b.db.Pool.Exec(ctx, tc.merge)
			require.NoError(t, err)
			rec, err := newReader(t, b.reader, nil).Lookup(ctx, tc.key, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, rec.ExpiredAt)
		})
	}
}

// A month attached again with rows in it (detached by hand, restored from a
// dump) gets a pending range in the attaching transaction, and the partition
// run records its keys: they are found before and after.
func TestAReattachedMonthsKeysAreFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_12 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO idempotency_key_archive_2025_12 (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:restored', '\x00', 201, '2025-12-01 10:00:00+00', '2025-12-02 10:00:00+00')`)
	require.NoError(t, err)
	m, err := partition.NewManager(b.db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)

	res, err := m.Run(ctx, true)
	require.NoError(t, err)
	require.Contains(t, strings.Join(res.Statements, "\n"), "idempotency_archive_plain_keys_pending")
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_12"}, res.Reattached)
	require.NotNil(t, res.PlainKeys)
	require.EqualValues(t, 1, res.PlainKeys.Recorded)
	require.Equal(t, 1, res.PlainKeys.RangesDone)
	require.Zero(t, res.PlainKeys.RangesLeft)
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	rec, err := newReader(t, b.reader, nil).Lookup(ctx, "idem:v1:restored", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
}

// In a transaction that archives in bulk (idemarchive.bulk_archive, set by
// the sweeper) the trigger inserts entries without ON CONFLICT first and
// falls back to it on a unique violation; elsewhere it inserts with ON
// CONFLICT directly. Either way an entry that exists already (its archive row
// was deleted and is inserted again) neither fails the archive insert nor
// keeps the statement's other rows from getting theirs.
func TestAnEntryThatExistsAlreadyKeepsTheInsertWhole(t *testing.T) {
	t.Parallel()
	for _, bulk := range []string{"on", "off"} {
		t.Run("bulk "+bulk, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			at := time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)
			dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:again", Status: 201, ExpiredAt: at})
			_, err := b.db.Pool.Exec(ctx, "DELETE FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:again'")
			require.NoError(t, err)
			require.EqualValues(t, 1, plainRows(t, b.db.Pool, "idem:v1:again"), "deleting an archive row leaves its entry")

			// One statement: the row inserted again, and two new ones.
			sweeper := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
			err = database.InTx(ctx, sweeper, map[string]string{"idemarchive.bulk_archive": bulk}, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
					SELECT k, '\x00', 201, $1::timestamptz - interval '1 day', $1
					  FROM unnest(ARRAY['idem:v1:new-a', 'idem:v1:again', 'idem:v1:new-b']) AS k`, at)
				return err
			})
			require.NoError(t, err)
			for _, key := range []string{"idem:v1:again", "idem:v1:new-a", "idem:v1:new-b"} {
				require.EqualValues(t, 1, plainRows(t, b.db.Pool, key), key)
				rec, err := newReader(t, b.reader, nil).Lookup(ctx, key, nil)
				require.NoError(t, err, key)
				require.Equal(t, at, rec.ExpiredAt)
			}
		})
	}
}

// The plain insert runs in a subtransaction, which takes a transaction id of
// its own: only a bulk transaction pays for it. A single row archived at
// completion (the Redis store) writes its entry in the transaction's own id.
func TestOnlyBulkArchivingTakesASubtransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sweeper := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
	at := time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)
	sameXID := func(key, bulk string) bool {
		t.Helper()
		err := database.InTx(ctx, sweeper, map[string]string{"idemarchive.bulk_archive": bulk}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
				VALUES ($1, '\x00', 201, $2::timestamptz - interval '1 day', $2)`, key, at)
			return err
		})
		require.NoError(t, err)
		var same bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT a.xmin::text = p.xmin::text
			  FROM idempotency_key_archive a, idempotency_archive_plain_keys p
			 WHERE a.scoped_key = $1 AND p.key_hash = idempotency_key_hash($1)`, key).Scan(&same))
		return same
	}
	require.True(t, sameXID("idem:v1:single", ""), "no setting: no subtransaction")
	require.True(t, sameXID("idem:v1:single-off", "off"))
	require.False(t, sameXID("idem:v1:bulk", "on"), "a bulk transaction tries the plain insert in a subtransaction")
}
