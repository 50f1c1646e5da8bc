package provision

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A run whose partition step would share the run's pool (no owner user, or
// one that cannot sign in off RDS) needs a second connection there: the
// run's lock holds the first. A pool of one is refused, saying so, where it
// would wait for a connection until the deadline.
func TestAPoolOfOneConnectionIsRefusedForThePartitionRun(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	one := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, one, Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.ErrorContains(t, err, "partition run: the run's lock holds the pool's only connection: set DATABASE_MAX_CONNS to 2 or more")
	require.Less(t, time.Since(start), 30*time.Second, "refused, not waited out")

	two := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
	res, err := Run(ctx, two, Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	require.NoError(t, err)
	require.NotNil(t, res.Partitions.Created)
}
