package partition_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// The registries of the recording triggers (migrations 017 and 018) see a
// trigger's catalog row rewritten. Nothing in normal operation may rewrite
// one: each false alarm marks every expiry, or a month's, pending, a scan of
// the archive. Over eight months of runs that create, retire and compact
// partitions, and the maintenance an operator does, no run adopts anything
// but the table attached by hand, and no range stays pending.
func TestNormalOperationNeverAdoptsTheArchiveAgain(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	registry := func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(trigger::text||':'||written::text, ',' ORDER BY trigger), '') FROM idempotency_archive_recorded_triggers`).Scan(&s))
		return s
	}
	rootOK := func(label string) {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT idempotency_archive_root_triggered()").Scan(&ok))
		require.True(t, ok, "after %s the archive's triggers are no longer vouched for", label)
	}
	start := time.Date(2026, 10, 15, 10, 0, 0, 0, time.UTC)
	run := func(label string, n time.Time) {
		t.Helper()
		res, err := newManager(t, db.Pool, partition.Config{Now: func() time.Time { return n }, RetentionMonths: 2, CompactPerRun: 2}).Run(ctx, false)
		require.NoError(t, err, label)
		t.Logf("%s (%s): created=%v retired=%v adopted=%v compacted=%v failed=%v registry=%s pending=%d", label, n.Format("2006-01"),
			res.Created, res.Retired, res.Adopted, res.Compacted, res.Failed, registry(),
			dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
		for _, a := range res.Adopted {
			require.Equal(t, "rt_hand", a, "%s adopted %s again", label, a)
		}
	}
	run("first", start)
	// (Not VACUUM FULL pg_trigger, which keeps xmin too: its ACCESS
	// EXCLUSIVE lock on the catalog would stall the tests beside this one.)
	ops := []struct{ label, sql string }{
		{"VACUUM FREEZE pg_trigger", "VACUUM FREEZE pg_catalog.pg_trigger"},
		{"REINDEX TABLE archive", "REINDEX TABLE idempotency_key_archive"},
		{"ANALYZE archive", "ANALYZE idempotency_key_archive"},
		{"ALTER TABLE OWNER round trip", "ALTER TABLE idempotency_key_archive OWNER TO CURRENT_USER"},
		{"COMMENT ON TABLE", "COMMENT ON TABLE idempotency_key_archive IS 'x'"},
		{"GRANT on archive", "GRANT SELECT ON idempotency_key_archive TO PUBLIC"},
		{"ALTER TABLE SET storage param", "ALTER TABLE idempotency_key_archive_2027_06 SET (fillfactor = 90)"},
		{"hand-made partition attached", "CREATE TABLE rt_hand (LIKE idempotency_key_archive INCLUDING ALL); ALTER TABLE idempotency_key_archive ATTACH PARTITION rt_hand FOR VALUES FROM ('2030-01-01') TO ('2030-02-01')"},
		{"hand-made partition detached and dropped", "ALTER TABLE idempotency_key_archive DETACH PARTITION rt_hand; DROP TABLE rt_hand"},
		{"CREATE INDEX on archive", "CREATE INDEX rt_idx ON idempotency_key_archive (created_at)"},
		{"DROP INDEX", "DROP INDEX rt_idx"},
		{"ALTER TABLE ADD COLUMN / DROP COLUMN", "ALTER TABLE idempotency_key_archive ADD COLUMN rt int; ALTER TABLE idempotency_key_archive DROP COLUMN rt"},
	}
	n := start
	for i := range 8 {
		n = n.AddDate(0, 1, 0)
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: fmt.Sprintf("idem:v1:fp-%d", i), Status: 201, ExpiredAt: n.Add(-time.Hour)})
		run(fmt.Sprintf("month %d", i), n)
		rootOK(fmt.Sprintf("month %d", i))
	}
	for _, op := range ops {
		_, err := db.Pool.Exec(ctx, op.sql)
		require.NoError(t, err, op.label)
		rootOK(op.label)
		run(op.label, n)
	}
	// migrate again (roles.sql included), and EnsureRoles
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	rootOK("Migrate re-run")
	run("Migrate re-run", n)
	// the owner's pool (as the partitions job runs)
	owner := db.NewPool(t, dbtest.AsRole("idempotency_owner"))
	res, err := newManager(t, owner, partition.Config{Now: func() time.Time { return n.AddDate(0, 1, 0) }, RetentionMonths: 2, CompactPerRun: 2}).Run(ctx, false)
	require.NoError(t, err)
	t.Logf("as owner: adopted=%v failed=%v", res.Adopted, res.Failed)
	require.Empty(t, res.Adopted)
	rootOK("owner run")
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
}
