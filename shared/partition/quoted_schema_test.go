package partition_test

import (
	"context"
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

// archiveIn migrates an archive into a new schema named name, beside db's,
// and returns it as a dbtest.DB whose pool has the run-time parameters
// params.
func archiveIn(t *testing.T, db *dbtest.DB, name string, params map[string]string) *dbtest.DB {
	t.Helper()
	ctx := context.Background()
	ident := pgx.Identifier{name}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+ident)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE") })
	other := &dbtest.DB{Schema: name, URL: dbtest.WithSearchPath(t, db.URL, ident)}
	var opts []dbtest.PoolOption
	for k, v := range params {
		opts = append(opts, dbtest.WithParam(k, v))
	}
	other.Pool = other.NewPool(t, opts...)
	conn, err := other.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = schema.Migrate(ctx, conn.Conn(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	return other
}

// The retirements' checks name tables in literals: in an archive schema
// whose name needs quoting, or holds a backslash read as an escape where a
// role sets standard_conforming_strings off, they named no table, so a
// retirement was refused as "renamed since" or, through an interrupted
// detach, reported retired while the table stayed.
func TestRetirementsWorkInASchemaWhoseNameNeedsQuoting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		params map[string]string
	}{
		{`My "Schema"`, nil},
		{`it's $drop$ 100%`, nil},
		{`back\slash`, nil},
		{`back\slash`, map[string]string{"standard_conforming_strings": "off"}},
	} {
		t.Run(tc.name+" "+tc.params["standard_conforming_strings"], func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			arch := archiveIn(t, db, db.Schema+" "+tc.name, tc.params)
			m := newManager(t, arch.Pool, partition.Config{Now: at(decNow)})
			jan, feb := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC)
			for _, month := range []time.Time{jan, feb} {
				_, err := m.EnsureMonth(ctx, month)
				require.NoError(t, err)
			}
			_, err := m.Run(ctx, false)
			require.NoError(t, err)
			dbtest.InsertArchive(t, arch.Pool, dbtest.ArchiveRow{Key: "idem:v1:nov", Status: 201, ExpiredAt: time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)})
			arch.InterruptDetach(t, pgx.Identifier{arch.Schema, partition.Name(feb)}.Sanitize())

			res, err := newManager(t, arch.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12}).Run(ctx, false)
			require.NoError(t, err)
			require.ElementsMatch(t, []string{partition.Name(jan), partition.Name(feb)}, res.Retired)
			require.Equal(t, []string{partition.Name(feb)}, res.Finalized)
			require.Zero(t, dbtest.Count(t, arch.Pool, "SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace AND relname IN ($2, $3)",
				pgx.Identifier{arch.Schema}.Sanitize(), partition.Name(jan), partition.Name(feb)), "the retired months are gone")
			require.EqualValues(t, 1, dbtest.Count(t, arch.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:nov'"))
		})
	}
}
