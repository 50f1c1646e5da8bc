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

// libpq reads a backslash in a keyword/value connection string as an
// escape, quoted or not: password='s3\'cret word' is the password
// s3'cret word, and password=s3\ cret is s3 cret. A match that
// ended at the escaped quote or space would echo the rest of the password
// in the error line (stderr, CI logs, a shared terminal): the password is
// hidden to the end of the line.
func TestEscapedPasswordCharactersAreNotEchoed(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	for _, tc := range []struct {
		args []string
		tail string // the part of the password after the escape
	}{
		{[]string{"lookup", "k", "--fingerprint", `host=db password='s3\'cretpart and more'`}, "cretpart"},
		{[]string{"lookup", "k", "--fingerprint", `host=db password=s3\ cretpart`}, "cretpart"},
		{[]string{"lookup", "host=db password=s3\\ cretpart"}, "cretpart"}, // the not-found line
	} {
		r := cli(t, db, nil, tc.args...)
		t.Logf("%q -> exit %d: %s", tc.args, r.code, r.stderr)
		assert.NotContains(t, r.stderr, tc.tail, "part of the password is echoed: %q", tc.args)
		assert.Contains(t, r.stderr, "password=REDACTED", tc.args)
	}
}
