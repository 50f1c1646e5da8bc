package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A command run against a schema that migrate has not created (a new
// database, a search_path naming another schema, an install older than the
// release) says to run migrate, not only PostgreSQL's "relation ... does
// not exist".
func TestACommandOnAnUnmigratedSchemaSaysToMigrate(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	empty := db.Schema + "_empty"
	_, err := db.Pool.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{empty}.Sanitize())
	require.NoError(t, err)
	url := dbtest.WithSearchPath(t, db.URL, empty)
	for _, args := range [][]string{
		{"sweep"},
		{"partitions"},
		{"lookup", "idem:v1:k"},
		{"query", "--scope-prefix", "idem:", "--created-from", "2026-01-01T00:00:00Z", "--created-to", "2026-02-01T00:00:00Z"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := cli(t, nil, map[string]string{"DATABASE_URL": url}, args...)
			t.Log(r.stderr)
			requireOneLineError(t, r, "run `archivectl migrate` first")
		})
	}
}

// A schema at this release's version that lacks what the error names was
// changed by hand: migrate would change nothing, and the hint says so
// rather than send the operator round in a loop.
func TestACommandOnAMigratedSchemaMissingAnObjectDoesNotSayMigrate(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `DROP TABLE idempotency_keys`)
	require.NoError(t, err)
	r := cli(t, db, nil, "sweep")
	requireOneLineError(t, r, fmt.Sprintf("is at version %d, yet lacks what the error names: it was changed by hand", schema.LatestVersion()))
	require.NotContains(t, r.stderr, "run `archivectl migrate`")
}

// A schema newer than this release (a later release migrated it) is named
// so: neither migrate (which refuses it) nor a hand change is the answer.
func TestACommandOnANewerSchemaSaysSo(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `UPDATE idempotency_archive_schema_version SET version = $1`, schema.LatestVersion()+1)
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(), `DROP TABLE idempotency_keys`)
	require.NoError(t, err)
	r := cli(t, db, nil, "sweep")
	requireOneLineError(t, r, fmt.Sprintf("is at version %d, newer than this release's %d: use the archivectl of the release that migrated it", schema.LatestVersion()+1, schema.LatestVersion()))
}
