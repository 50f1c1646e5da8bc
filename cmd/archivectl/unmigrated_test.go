package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
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
			requireOneLineError(t, r, "archivectl migrate")
		})
	}
}
