package schema_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A deploy upgrades a schema at version 6 (migration 7 redefines functions;
// migration 8 then adds a column to idempotency_keys: ACCESS EXCLUSIVE, so
// the bound must hold past the first pending migration, after tern's RESET
// ALL) while a transaction has read the live
// table (an operator's query, pg_dump). Each of the migration's lock waits
// is bounded, and it tries again: a registration meanwhile waits at most
// one such wait, well under the live store's 5 s bound, and the migration
// applies once the reader ends.
func TestAnUpgradeQueuesNoRegistrationBehindItsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, url := upgradedSchema(t, db)
	_, err := schema.MigrateTo(ctx, conn, logger, 6)
	require.NoError(t, err)

	reader, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer reader.Close(ctx)
	tx, err := reader.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT count(*) FROM idempotency_keys")
	require.NoError(t, err)

	migrator, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer migrator.Close(ctx)
	done := make(chan error, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := schema.Migrate(mctx, migrator, logger)
		done <- err
	}()
	time.Sleep(time.Second)

	// The API registers a key meanwhile, under the live store's 5 s bound.
	api, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer api.Close(ctx)
	_, err = api.Exec(ctx, "SET statement_timeout = '5s'")
	require.NoError(t, err)
	_, insErr := api.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, created_at, expires_at, skew_ms)
		VALUES ('idem:v1:during-deploy', decode(repeat('00', 32), 'hex'), 'in_flight', now(), now() + interval '1 day', 0)`)
	require.NoError(t, insErr, "a registration queued behind the migration's lock request for its whole statement timeout")
	select {
	case err := <-done:
		t.Fatalf("the migration ended while the reader held its lock: %v", err)
	default:
	}
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done, "the migration applies once the reader ended")
	var column bool
	require.NoError(t, migrator.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' AND column_name = 'registration')").Scan(&column))
	require.True(t, column, "migration 8 ran")
}
