package livestore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// unmigratedStore is a Postgres store over a schema without migration 008's
// registration column.
func unmigratedStore(t *testing.T) (*dbtest.DB, *Postgres) {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(context.Background(), "ALTER TABLE idempotency_keys DROP COLUMN registration")
	require.NoError(t, err)
	return db, NewPostgres(db.Pool)
}

// A process that registered without tokens (the database had no
// registration column) completes and releases those entries by the token
// the store reported, nil, after migration 008 runs and the store uses
// tokens again.
func TestEntriesRegisteredBeforeTheMigrationCompleteAfterIt(t *testing.T) {
	t.Parallel()
	db, p := unmigratedStore(t)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	regs := map[string]idempotency.Registration{}
	for _, key := range []string{"idem:v1:complete", "idem:v1:release"} {
		reg, err := p.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, reg.Fresh)
		require.Nil(t, reg.Token, "no token was kept")
		regs[key] = reg
	}
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_keys ADD COLUMN registration bytea")
	require.NoError(t, err)
	p.untokenedUntil.Store(time.Now().UnixNano())

	require.NoError(t, p.Release(ctx, "idem:v1:release", fp, regs["idem:v1:release"].Token))
	require.NoError(t, p.Complete(ctx, "idem:v1:complete", idempotency.Completion{Fingerprint: fp, Token: regs["idem:v1:complete"].Token, Status: 201, Body: []byte(`{}`)}))
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = 'idem:v1:release'"))
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = 'idem:v1:complete' AND state = 'completed'"))
}

// Whenever the store's minute without tokens ends, a Complete of an entry
// registered without one runs exactly one statement that finds it.
func TestTheTokenlessMinuteEndingNeverSkipsAStatement(t *testing.T) {
	t.Parallel()
	db, p := unmigratedStore(t)
	ctx, fp := context.Background(), dbtest.Fingerprint("a")
	for i := range 300 {
		reg, err := p.Register(ctx, idempotency.Registering{Key: "idem:v1:race", Fingerprint: fp, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, reg.Fresh)
		p.untokenedUntil.Store(time.Now().UnixNano() + int64(i%100)*10_000)
		require.NoError(t, p.Complete(ctx, "idem:v1:race", idempotency.Completion{Fingerprint: fp, Token: reg.Token, Status: 201, Body: []byte(`{}`)}), "iteration %d", i)
		_, err = db.Pool.Exec(ctx, "DELETE FROM idempotency_keys")
		require.NoError(t, err)
	}
}

// A nil token and an empty one both mean "no token", in both stores.
func TestNilAndEmptyTokensAgree(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	client, prefix := testenv.Redis(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("a")
	for name, s := range map[string]idempotency.Store{"postgres": NewPostgres(db.Pool), "redis": NewRedis(client, db.Pool, prefix)} {
		key := "idem:v1:empty-" + name
		_, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte{}, TTL: time.Hour})
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, key, fp, nil))
		again, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, again.Fresh, "%s: an empty token is no token", name)
	}
}
