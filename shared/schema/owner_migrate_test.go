package schema_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A month made or restored by hand as another role is given back to the
// owner role by migrate only when the migrating user has that role's
// privileges: a migrator that may create roles but is no superuser (an RDS
// master user) cannot run ALTER ... OWNER on it. Such a month is left as
// it is, with a warning, and the migration succeeds: before, it failed
// every deploy ("must be owner of table") until someone re-owned the month
// by hand.
func TestMigrateLeavesAMonthItCannotGiveBack(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t) // migrated once, as the test superuser
	ctx := context.Background()
	oct := time.Date(2026, time.October, 1, 0, 0, 0, 0, time.UTC)
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC) }}, nil)
	require.NoError(t, err)
	_, err = m.EnsureMonth(ctx, oct)
	require.NoError(t, err)

	suffix := strings.ToLower(db.Schema)
	stranger, migrator := "stranger_rtm_"+suffix, "migrator_rtm_"+suffix
	for _, stmt := range []string{
		"CREATE ROLE " + pgx.Identifier{stranger}.Sanitize(),
		"CREATE ROLE " + pgx.Identifier{migrator}.Sanitize() + " NOSUPERUSER CREATEROLE",
		"GRANT idempotency_owner TO " + pgx.Identifier{migrator}.Sanitize(),
		// the migrator made the schema's version table in a real deploy
		"ALTER TABLE " + pgx.Identifier{schema.VersionTable}.Sanitize() + " OWNER TO " + pgx.Identifier{migrator}.Sanitize(),
	} {
		_, err := db.Pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		c := context.Background()
		_, _ = db.Pool.Exec(c, "ALTER TABLE "+pgx.Identifier{partition.Name(oct)}.Sanitize()+" OWNER TO idempotency_owner")
		_, _ = db.Pool.Exec(c, "REVOKE "+pgx.Identifier{stranger}.Sanitize()+" FROM "+pgx.Identifier{migrator}.Sanitize())
		_, _ = db.Pool.Exec(c, "DROP ROLE "+pgx.Identifier{stranger}.Sanitize())
		_, _ = db.Pool.Exec(c, "ALTER TABLE "+pgx.Identifier{schema.VersionTable}.Sanitize()+" OWNER TO CURRENT_USER")
		_, _ = db.Pool.Exec(c, "REVOKE idempotency_owner FROM "+pgx.Identifier{migrator}.Sanitize())
		_, _ = db.Pool.Exec(c, "DROP ROLE "+pgx.Identifier{migrator}.Sanitize())
	})

	// WHEN migrate runs again as a migrator that may create roles (no superuser)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SET ROLE "+pgx.Identifier{migrator}.Sanitize())
	require.NoError(t, err)
	// (control: with every month owned by idempotency_owner it succeeds)
	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err, "control")
	_, err = db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{partition.Name(oct)}.Sanitize()+" OWNER TO "+pgx.Identifier{stranger}.Sanitize())
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// THEN it succeeds, and leaves October to its owner
	require.NoError(t, err)
	owner := func() string {
		var o string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT relowner::regrole::text FROM pg_class WHERE oid = $1::regclass", partition.Name(oct)).Scan(&o))
		return o
	}
	require.Equal(t, stranger, owner())

	// AND a migrator that has the stranger's privileges gives it back
	_, err = db.Pool.Exec(ctx, "GRANT "+pgx.Identifier{stranger}.Sanitize()+" TO "+pgx.Identifier{migrator}.Sanitize())
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	require.Equal(t, "idempotency_owner", owner())
}
