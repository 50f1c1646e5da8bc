package schema_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// cancelAfterLastCommit cancels a context right after the COMMIT of the
// last migration: a Lambda's deadline landing between two of tern's
// statements.
type cancelAfterLastCommit struct {
	mu     sync.Mutex
	armed  bool
	done   bool
	cancel context.CancelFunc
}

func (c *cancelAfterLastCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.HasPrefix(d.SQL, "update ") && strings.Contains(d.SQL, schema.VersionTable) && len(d.Args) == 1 && d.Args[0] == schema.LatestVersion() {
		c.armed = true
	}
	return ctx
}

func (c *cancelAfterLastCommit) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed && !c.done && d.CommandTag.String() == "COMMIT" {
		c.done = true
		c.cancel()
	}
}

// tern holds a session-level advisory lock, one for the whole database,
// while it migrates, and releases it under the run's context. A run whose
// context ended right after its last COMMIT used to keep that lock on its
// connection (pgx sends nothing under an ended context), which a caller's
// pool then kept idle: every later migration of the database, in any
// schema, waited on it until its own deadline. The connection is closed
// instead, and its session holds nothing.
func TestARunCancelledBetweenStatementsLeavesNoLockBehind(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, url := upgradedSchema(t, db) // an empty schema beside db's
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	tracer := &cancelAfterLastCommit{cancel: cancel}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	pid := conn.PgConn().PID()

	_, err = schema.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.Error(t, err, "the run was cancelled")
	require.True(t, tracer.done, "the context ended after the last migration's COMMIT")
	require.True(t, conn.IsClosed(), "the connection of a run whose context ended is closed")
	require.Eventually(t, func() bool {
		var held int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = $1 AND locktype = 'advisory'", pid).Scan(&held))
		return held == 0
	}, 10*time.Second, 20*time.Millisecond, "the cancelled run's session still holds an advisory lock")
}
