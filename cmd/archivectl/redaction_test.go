package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// Connection strings as operators paste them are redacted in every error
// line: libpq's keyword form with spaces around '=' or a quoted value with
// spaces, a URL copied with a space in its password, and the key the
// lookup's not-found line echoes.
func TestEchoedConnectionStringsHideTheirPassword(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	for _, args := range [][]string{
		{"lookup", "postgres://u:s3cret@db.example:5432/app"},         // not found: exit 1, key echoed
		{"lookup", "k", "--fingerprint", "host=db password = s3cret"}, // libpq allows spaces around =
		{"lookup", "k", "--fingerprint", "host=db password='s3cret and more'"},
		{"lookup", "k", "postgres://u:s3cret word@db/app"},
		{"query", "--scope-prefix", "idem:", "--created-from", "host=db password =s3cret", "--created-to", "2026-01-01T00:00:00Z"},
	} {
		r := cli(t, db, nil, args...)
		t.Logf("%v -> exit %d: %s", args, r.code, r.stderr)
		assert.Contains(t, r.stderr, "REDACTED", args)
		assert.NotContains(t, r.stderr, "s3cret", args)
		assert.NotContains(t, r.stderr, "and more", args)
		assert.NotContains(t, r.stderr, "word@", args)
	}
}
